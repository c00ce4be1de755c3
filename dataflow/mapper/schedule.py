"""Modulo scheduling with placement and routing on the PE mesh.

A kernel's body is replicated into `copies` copies (spatial unrolling); each copy is scheduled at
initiation interval II. Lower bound MII = max(ResMII, RecMII) (Rau, "Iterative Modulo
Scheduling", 1994): ResMII from PE issue slots and SPM ports, RecMII from loop-carried cycles.
Placement is greedy list scheduling in topological order; each value is routed along an XY path
whose links are reserved per (link, cycle mod II), so no link is ever over capacity.
"""

from __future__ import annotations

import functools
import math

import networkx as nx

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.graph import Kernel
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import MappingError, Placement, Route

Link = tuple[tuple[int, int], tuple[int, int]]


def op_latency(arch: ArchSpec, op: Op) -> int:
    """Cycles from issue to result: the FU's latency, plus the SPM access for loads (an acc adds
    into a register; its SPM read-modify-write is off the recurrence)."""
    lat = arch.op_latency(op.value)
    if op.reads_spm and op is not Op.ACC:
        lat += arch.spm.access_latency_cycles
    return lat


def res_mii(kernel: Kernel, arch: ArchSpec, copies: int) -> int:
    """Resource-constrained MII: issue slots of all PEs, and SPM row ports."""
    pes = arch.pe_array.num_pes
    slots = 0
    for n in kernel.nodes:
        slots += arch.fu_for(n.op.value).issue_interval_cycles
    bound = math.ceil(copies * slots / pes)
    reads = sum(1 for n in kernel.nodes if n.op.reads_spm)
    writes = sum(1 for n in kernel.nodes if n.op.writes_spm)
    spm = arch.spm
    bound = max(bound, math.ceil(copies * reads / (spm.lines * spm.read_ports_per_line)))
    bound = max(bound, math.ceil(copies * writes / (spm.lines * spm.write_ports_per_line)))
    return max(1, bound)


def rec_mii(kernel: Kernel, arch: ArchSpec) -> int:
    """Recurrence-constrained MII: max over dependence cycles of ceil(latency / distance)."""
    g = kernel.graph()
    best = 1
    for cycle in nx.simple_cycles(g):
        lat = dist = 0
        for a, b in zip(cycle, cycle[1:] + cycle[:1]):
            lat += op_latency(arch, kernel.nodes[a].op)
            dist += g.edges[a, b]["distance"]
        if dist:
            best = max(best, math.ceil(lat / dist))
    return best


@functools.lru_cache(maxsize=65536)
def _neighbours(arch: ArchSpec, pe: tuple[int, int], cols_first: bool = False) -> list[tuple[int, int]]:
    rows, cols = arch.pe_array.rows, arch.pe_array.cols
    r, c = pe
    torus = arch.interconnect.topology == "torus"
    out = []
    for stride in (*sorted(arch.interconnect.skip_hop_strides, reverse=True), 1):
        steps = ((stride, 0), (-stride, 0), (0, stride), (0, -stride))
        if cols_first:
            steps = steps[2:] + steps[:2]
        for dr, dc in steps:
            nr, nc = r + dr, c + dc
            if torus:
                nr, nc = nr % rows, nc % cols
            if 0 <= nr < rows and 0 <= nc < cols and (nr, nc) != pe:
                out.append((nr, nc))
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def shortest_path(arch: ArchSpec, src: tuple[int, int], dst: tuple[int, int],
                  cols_first: bool = False) -> list[tuple[int, int]]:
    """PEs from src to dst over the interconnect (BFS; rows-first or columns-first ties).
    Cached: `ArchSpec` is frozen and hashable."""
    if src == dst:
        return (src,)
    prev = {src: None}
    frontier = [src]
    while frontier:
        nxt = []
        for pe in frontier:
            for nb in _neighbours(arch, pe, cols_first):
                if nb not in prev:
                    prev[nb] = pe
                    if nb == dst:
                        path = [dst]
                        while prev[path[-1]] is not None:
                            path.append(prev[path[-1]])
                        return tuple(path[::-1])
                    nxt.append(nb)
        frontier = nxt
    raise MappingError(f"no route from PE {src} to PE {dst}")


class _State:
    """Reservation tables for one II attempt."""

    def __init__(self, arch: ArchSpec, ii: int):
        self.arch, self.ii = arch, ii
        self.slots: dict[tuple[tuple[int, int], int], tuple[int, int]] = {}
        self.links: dict[tuple[Link, int], int] = {}
        self.entries: dict[tuple[int, int], int] = {}
        self.paths_cache: dict[tuple[tuple[int, int], tuple[int, int]], list] = {}

    def paths(self, a, b):
        """Candidate routes a -> b: the two dimension orders of a shortest path."""
        key = (a, b)
        if key not in self.paths_cache:
            p1 = shortest_path(self.arch, a, b)
            p2 = shortest_path(self.arch, a, b, cols_first=True)
            self.paths_cache[key] = [p1] if p1 == p2 else [p1, p2]
        return self.paths_cache[key]

    def link_keys(self, path, depart):
        hop = self.arch.interconnect.hop_latency_cycles
        return [(link, (depart + h * hop) % self.ii) for h, link in enumerate(zip(path, path[1:]))]

    def choose_routes(self, sources, pe, t):
        """One path per (producer placement) into `pe` for an op at time t, jointly within link
        capacity; None if impossible."""
        hop = self.arch.interconnect.hop_latency_cycles
        cap = self.arch.interconnect.links_per_direction
        used: dict = {}
        chosen = []
        for p in sources:
            depart = p.time + p.latency
            for path in self.paths(p.pe, pe):
                if depart + (len(path) - 1) * hop > t:
                    continue
                keys = self.link_keys(path, depart)
                if all(self.links.get(k, 0) + used.get(k, 0) < cap for k in keys):
                    for k in keys:
                        used[k] = used.get(k, 0) + 1
                    chosen.append((p, path, depart))
                    break
            else:
                return None
        return chosen

    def reserve(self, path, depart) -> tuple[Link, ...]:
        for k in self.link_keys(path, depart):
            self.links[k] = self.links.get(k, 0) + 1
        return tuple(zip(path, path[1:]))


def schedule_kernel(kernel: Kernel, arch: ArchSpec, copies: int, ii: int):
    """Try to place and route `copies` copies at `ii`; return (placements, routes) or None."""
    st = _State(arch, ii)
    hop = arch.interconnect.hop_latency_cycles
    limit = arch.pe_array.instruction_entries
    pes = [(r, c) for r in range(arch.pe_array.rows) for c in range(arch.pe_array.cols)]
    placements: list[Placement] = []
    routes: list[Route] = []
    for copy in range(copies):
        where: dict[int, Placement] = {}
        # start each copy near a distinct PE so copies spread over the array
        anchor = pes[(copy * len(kernel.nodes)) % len(pes)]
        near = sorted(pes, key=lambda q: (abs(q[0] - anchor[0]) + abs(q[1] - anchor[1]), q))
        for node in kernel.nodes:
            lat = op_latency(arch, node.op)
            preds = [where[i] for i in node.inputs]
            best = None
            ready = max((p.time + p.latency for p in preds), default=0)
            for t in range(ready, ready + ii + 2 * (arch.pe_array.rows + arch.pe_array.cols) * hop):
                for pe in near:
                    if (pe, t % ii) in st.slots or st.entries.get(pe, 0) >= limit:
                        continue
                    routes_in = st.choose_routes(preds, pe, t)
                    if routes_in is not None:
                        best = (pe, t, routes_in)
                        break
                if best:
                    break
            if best is None:
                return None
            pe, t, routes_in = best
            st.slots[(pe, t % ii)] = (copy, node.id)
            st.entries[pe] = st.entries.get(pe, 0) + 1
            pl = Placement(node=node.id, copy=copy, pe=pe, time=t, latency=lat)
            where[node.id] = pl
            placements.append(pl)
            for p, path, depart in routes_in:
                links = st.reserve(path, depart)
                routes.append(Route(src=p.node, dst=node.id, copy=copy, links=links, depart=depart))
    return placements, routes
