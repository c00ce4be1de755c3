"""Routing on the PE array: the interconnect graph, distances, and the reservation state of one
(copies, II) attempt with PathFinder costs (McMurchie & Ebeling, FPGA 1995).

A link carries `links_per_direction` values per cycle; a value of w words crosses a link of
width W in ceil(w / W) flits, one per cycle (wormhole: the hop latency applies to the head flit,
the tail arrives ceil(w / W) - 1 cycles later); a value multicast to several consumers rides a
link once. Each (link, slot) costs (1 + history) x (1 + present_factor x overuse).
"""

from __future__ import annotations

import functools
import heapq
import math
from collections import Counter
from itertools import pairwise

from dataflow.arch.spec import ArchSpec, Topology
from dataflow.dfg.graph import Kernel, vector_nodes
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import MappingError

# Deferred imports: networkx is imported in `hop_distance`, its one user (start-up).

Link = tuple[tuple[int, int], tuple[int, int]]

# hop count taken for a PE pair with no route (absent from the distance table): more than any
# route may take, so the search skips it
UNREACHABLE_HOPS = 1 << 30
# cost per cycle a route waits before departing: a tie-breaker, far below one link's cost, so of
# equally cheap routes the earliest departure wins
DEPART_DELAY_COST = 0.01
# cost of a flit that rides one of the same value already on that (link, slot) (multicast): not
# zero, so of two shared routes the shorter still wins
SHARED_FLIT_COST = 0.05


def is_immediate(kernel: Kernel, node: int) -> bool:
    """A constant reaches its consumers as an immediate operand in their instruction words (as
    CGRA configurations encode constants), so its edges need no link and no register."""
    return kernel.nodes[node].op is Op.CONST




def value_flits(kernel: Kernel, arch: ArchSpec) -> dict[int, int]:
    """Flits (link cycles) each node's value needs per hop: ceil(words / link_width_words)."""
    vec = vector_nodes(kernel)
    lanes = arch.pe_array.simd_lanes
    width = arch.interconnect.link_width_words
    return {n.id: -(-(lanes if n.id in vec else 1) // width) for n in kernel.nodes}


@functools.lru_cache(maxsize=65536)
def _neighbours(arch: ArchSpec, pe: tuple[int, int], cols_first: bool = False) -> tuple:
    rows, cols = arch.pe_array.rows, arch.pe_array.cols
    r, c = pe
    torus = arch.interconnect.topology == Topology.TORUS
    out = []
    for stride in (*sorted(arch.interconnect.skip_hop_strides, reverse=True), 1):
        steps = ((stride, 0), (-stride, 0), (0, stride), (0, -stride))
        if cols_first:
            steps = steps[2:] + steps[:2]
        for dr, dc in steps:
            nr, nc = r + dr, c + dc
            if torus:
                nr, nc = nr % rows, nc % cols
            if 0 <= nr < rows and 0 <= nc < cols and (nr, nc) != pe and (nr, nc) not in out:
                out.append((nr, nc))
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def shortest_path(arch: ArchSpec, src: tuple[int, int], dst: tuple[int, int],
                  cols_first: bool = False) -> tuple:
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


@functools.lru_cache(maxsize=256)
def hop_distance(arch: ArchSpec) -> dict:
    """All-pairs hop counts over the interconnect."""
    import networkx as nx

    pes = [(r, c) for r in range(arch.pe_array.rows) for c in range(arch.pe_array.cols)]
    g = nx.DiGraph()
    g.add_nodes_from(pes)
    for pe in pes:
        for nb in _neighbours(arch, pe):
            g.add_edge(pe, nb)
    return {a: dict(d) for a, d in nx.all_pairs_shortest_path_length(g)}


class RouteState:
    """Reservation tables and PathFinder costs for one (copies, II) attempt."""

    def __init__(self, kernel: Kernel, arch: ArchSpec, ii: int):
        self.kernel, self.arch, self.ii = kernel, arch, ii
        self.hop = arch.interconnect.hop_latency_cycles
        self.cap = arch.interconnect.links_per_direction
        self.flits = value_flits(kernel, arch)
        self.dist = hop_distance(arch)
        self.slots: dict[tuple[tuple[int, int], int], tuple[int, int]] = {}
        self.fu: dict[tuple[tuple[int, int], str, int], tuple[int, int]] = {}
        # (link, slot) -> {value: routes using it}; a link carries each value once per cycle
        # however many consumers downstream share it (multicast), so occupancy = distinct values
        self.carry: dict = {}
        self.history: Counter = Counter()
        self.present_factor = 0.5
        self.entries: Counter = Counter()
        self.paths_cache: dict = {}
        # links as small ints so (link, slot) keys are ints (link_id * II + slot): hashing
        # nested tuples dominated the route search
        self.link_id: dict = {}
        self.link_of: list = []
        self.nbrs: dict = {}
        for r in range(arch.pe_array.rows):
            for c in range(arch.pe_array.cols):
                pe = (r, c)
                out = []
                for nb in _neighbours(arch, pe):
                    self.link_id[(pe, nb)] = len(self.link_of)
                    out.append((nb, len(self.link_of)))
                    self.link_of.append((pe, nb))
                self.nbrs[pe] = tuple(out)

    # -- FU slots -------------------------------------------------------------------------------
    def fu_keys(self, pe, t, op: Op):
        fu = self.arch.fu_for(op.value)
        return [(pe, fu.name, (t + j) % self.ii) for j in range(fu.issue_interval_cycles)]

    def slot_free(self, pe, t, op: Op) -> bool:
        if (pe, t % self.ii) in self.slots:
            return False
        return not any(k in self.fu for k in self.fu_keys(pe, t, op))

    def occupy(self, pe, t, op: Op, who) -> None:
        self.slots[(pe, t % self.ii)] = who
        for k in self.fu_keys(pe, t, op):
            self.fu[k] = who
        self.entries[pe] += 1

    def release(self, pe, t, op: Op) -> None:
        del self.slots[(pe, t % self.ii)]
        for k in self.fu_keys(pe, t, op):
            del self.fu[k]
        self.entries[pe] -= 1

    # -- links ----------------------------------------------------------------------------------
    def link_keys(self, path, depart, flits):
        ii, lid = self.ii, self.link_id
        return [lid[link] * ii + (depart + h * self.hop + j) % ii
                for h, link in enumerate(pairwise(path)) for j in range(flits)]

    def describe(self, key) -> tuple:
        """(link, slot) of an int (link, slot) key."""
        return self.link_of[key // self.ii], key % self.ii

    def arrival(self, hops: int, depart: int, flits: int) -> int:
        return depart + hops * self.hop + (flits - 1 if hops else 0)

    def reserve(self, keys, value) -> None:
        for k in keys:
            c = self.carry.setdefault(k, Counter())
            c[value] += 1

    def unreserve(self, keys, value) -> None:
        for k in keys:
            c = self.carry[k]
            c[value] -= 1
            if not c[value]:
                del c[value]

    def new_flit(self, k, value, extra) -> int | None:
        """Overuse (> 0: over capacity) if `value` were added to (link, slot) `k` now; None
        when that value is already on that link in that slot (shared, free)."""
        held = self.carry.get(k, ())
        pending = extra.get(k, ()) if extra else ()
        if value in held or value in pending:
            return None
        return len(held) + len(pending) + 1 - self.cap

    def fits(self, keys, value, extra) -> bool:
        return all((o := self.new_flit(k, value, extra)) is None or o <= 0 for k in keys)

    def overused(self) -> dict:
        return {k: len(c) - self.cap for k, c in self.carry.items() if len(c) > self.cap}

    def quick_paths(self, a, b):
        key = (a, b)
        if key not in self.paths_cache:
            p1 = shortest_path(self.arch, a, b)
            p2 = shortest_path(self.arch, a, b, cols_first=True)
            self.paths_cache[key] = [p1] if p1 == p2 else [p1, p2]
        return self.paths_cache[key]

    def quick_route(self, src_pe, ready, dst_pe, t, flits, value, extra):
        """A shortest path (either dimension order), departing as early as capacity allows,
        strictly within capacity; None if none."""
        for path in self.quick_paths(src_pe, dst_pe):
            hops = len(path) - 1
            if not hops:
                return path, ready
            last = t - hops * self.hop - (flits - 1)
            for depart in range(ready, min(last, ready + self.ii - 1) + 1):
                keys = self.link_keys(path, depart, flits)
                if self.fits(keys, value, extra):
                    return path, depart
        return None

    def search_route(self, src_pe, ready, dst_pe, t, flits, strict: bool, value, extra=None):
        """Cheapest route in the time-expanded graph (Dijkstra), any path and departure that
        arrives by t. Cost per (link, slot): (1 + history) x (1 + present_factor x overuse);
        strict forbids overuse. Returns (path, depart, cost) or None."""
        hop, ii = self.hop, self.ii
        best = None
        for depart in range(ready, ready + min(ii, max(1, t - ready + 1))):
            max_hops = (t - depart - (flits - 1)) // hop
            if self.dist[src_pe].get(dst_pe, UNREACHABLE_HOPS) > max_hops:
                break
            if src_pe == dst_pe:
                return (src_pe,), depart, 0.0
            start_cost = DEPART_DELAY_COST * (depart - ready)
            got = self._cheapest_path(src_pe, dst_pe, depart, start_cost, max_hops, flits,
                                      strict, value, extra)
            if got is not None and (best is None or got[1] < best[2]):
                best = (got[0], depart, got[1])
        return best

    def _cheapest_path(self, src_pe, dst_pe, depart, start_cost, max_hops, flits, strict,
                       value, extra):
        """Dijkstra over (PE, hops) for one departure cycle, at most `max_hops` hops;
        (path, cost) or None when dst_pe is not reached."""
        seen: dict = {}
        heap = [(start_cost, 0, src_pe)]
        prev = {(src_pe, 0): None}
        while heap:
            cost, h, pe = heapq.heappop(heap)
            if pe == dst_pe:
                return _backtrack(prev, (pe, h)), cost
            if seen.get((pe, h), math.inf) < cost or h >= max_hops:
                continue
            for nb, lid in self.nbrs[pe]:
                if self.dist[nb].get(dst_pe, UNREACHABLE_HOPS) > max_hops - h - 1:
                    continue
                step = self._hop_cost(lid, depart + h * self.hop, flits, strict, value, extra)
                if step is None:
                    continue
                c2 = cost + step
                if c2 < seen.get((nb, h + 1), math.inf):
                    seen[(nb, h + 1)] = c2
                    prev[(nb, h + 1)] = (pe, h)
                    heapq.heappush(heap, (c2, h + 1, nb))
        return None

    def _hop_cost(self, lid, head, flits, strict: bool, value, extra) -> float | None:
        """PathFinder cost of `value`'s flits crossing link `lid` from cycle `head` on; None
        when strict and a flit would overuse its (link, slot)."""
        ii = self.ii
        step = 0.0
        for j in range(flits):
            k = lid * ii + (head + j) % ii
            over = self.new_flit(k, value, extra)
            if over is None:  # rides a flit of the same value already there
                step += SHARED_FLIT_COST
                continue
            if over > 0 and strict:
                return None
            step += (1.0 + self.history[k]) * (1.0 + self.present_factor * max(0, over))
        return step


def _backtrack(prev, node) -> tuple:
    """The PEs from the search's start to `node` = (PE, hops), following `prev`."""
    path = [node[0]]
    while prev[node] is not None:
        node = prev[node]
        path.append(node[0])
    return tuple(path[::-1])
