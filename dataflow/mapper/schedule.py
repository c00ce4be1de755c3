"""Modulo scheduling with placement and negotiated (PathFinder-style) routing on the PE array.

A kernel's body is replicated into `copies` copies (spatial unrolling); each copy is scheduled at
initiation interval II. Lower bound MII = max(ResMII, RecMII) (Rau, "Iterative Modulo
Scheduling", 1994): ResMII from PE issue slots, functional-unit occupancy (issue interval) and
SPM ports; RecMII from loop-carried cycles.

Resources reserved modulo II, per attempt:
- a PE issues one op per cycle (slot `t mod II`);
- a functional unit of issue interval k is busy k consecutive slots from the op's issue;
- a PE holds at most `instruction_entries` ops;
- a link carries `links_per_direction` flits per cycle; a value of w words crosses a link of
  width W in ceil(w / W) flits, one per cycle (wormhole: the hop latency applies to the head
  flit, the tail arrives ceil(w / W) - 1 cycles later).

Placement is list scheduling in topological order (each node at its earliest time, on the
nearest PE whose inputs can be routed within capacity). Routes are searched in the
time-expanded array graph (any path, any departure between the producer's result and the
consumer's issue), costed PathFinder-style (McMurchie & Ebeling, FPGA 1995): each (link, slot)
costs (1 + history) x (1 + present_factor x overuse). When no strictly legal placement exists
the node is placed with overuse, and a negotiation loop then rips up every route through an
overused (link, slot), raises that resource's history cost and the present factor, and
reroutes, until no link is over capacity or the iteration budget runs out.

`anneal` is an optional improvement pass (simulated annealing over node positions) that lowers
the schedule length and the link hops of a legal schedule without changing II.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import random
from collections import Counter
from itertools import pairwise

import networkx as nx

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.graph import Kernel
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import MappingError, Placement, Route

Link = tuple[tuple[int, int], tuple[int, int]]
NEGOTIATION_ITERATIONS = 24


def accumulates(op: Op) -> bool:
    """acc-like ops combine into the PE's register (their SPM read-modify-write is off the
    recurrence)."""
    return op.value in ("acc", "accmax")


def is_immediate(kernel: Kernel, node: int) -> bool:
    """A constant reaches its consumers as an immediate operand in their instruction words (as
    CGRA configurations encode constants), so its edges need no link and no register."""
    return kernel.nodes[node].op is Op.CONST


def op_latency(arch: ArchSpec, op: Op) -> int:
    """Cycles from issue to result: the FU's latency, plus the SPM access for loads."""
    lat = arch.op_latency(op.value)
    if op.reads_spm and not accumulates(op):
        lat += arch.spm.access_latency_cycles
    return lat


def vector_nodes(kernel: Kernel) -> frozenset[int]:
    """Nodes whose value is a SIMD vector (same rule as the engines'): memory nodes addressed
    by the vector variable, and anything computed from a vector."""
    vec: set[int] = set()
    if kernel.vector_var is None:
        return frozenset()
    for n in kernel.nodes:
        if (n.addr is not None and n.addr.coef(kernel.vector_var)) or (
                n.op.value not in ("load", "gather") and any(i in vec for i in n.inputs)):
            vec.add(n.id)
    return frozenset(vec)


def value_flits(kernel: Kernel, arch: ArchSpec) -> dict[int, int]:
    """Flits (link cycles) each node's value needs per hop: ceil(words / link_width_words)."""
    vec = vector_nodes(kernel)
    lanes = arch.pe_array.simd_lanes
    width = arch.interconnect.link_width_words
    return {n.id: -(-(lanes if n.id in vec else 1) // width) for n in kernel.nodes}


def res_mii(kernel: Kernel, arch: ArchSpec, copies: int) -> int:
    """Resource-constrained MII: PE issue slots, FU occupancy, SPM row ports."""
    pes = arch.pe_array.num_pes
    bound = math.ceil(copies * len(kernel.nodes) / pes)  # one issue per PE per cycle
    busy = Counter()
    for n in kernel.nodes:
        fu = arch.fu_for(n.op.value)
        busy[fu.name] += fu.issue_interval_cycles
        bound = max(bound, fu.issue_interval_cycles)  # the FU must be free again next II
    for cycles in busy.values():
        bound = max(bound, math.ceil(copies * cycles / pes))
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
def _neighbours(arch: ArchSpec, pe: tuple[int, int], cols_first: bool = False) -> tuple:
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
    pes = [(r, c) for r in range(arch.pe_array.rows) for c in range(arch.pe_array.cols)]
    g = nx.DiGraph()
    g.add_nodes_from(pes)
    for pe in pes:
        for nb in _neighbours(arch, pe):
            g.add_edge(pe, nb)
    return {a: dict(d) for a, d in nx.all_pairs_shortest_path_length(g)}


class _State:
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
            if self.dist[src_pe].get(dst_pe, 1 << 30) > max_hops:
                break
            if src_pe == dst_pe:
                return (src_pe,), depart, 0.0
            start = (0.01 * (depart - ready), 0, src_pe)
            seen: dict = {}
            heap = [start]
            prev = {(src_pe, 0): None}
            while heap:
                cost, h, pe = heapq.heappop(heap)
                if pe == dst_pe:
                    path = [pe]
                    node = (pe, h)
                    while prev[node] is not None:
                        node = prev[node]
                        path.append(node[0])
                    cand = (tuple(path[::-1]), depart, cost)
                    if best is None or cost < best[2]:
                        best = cand
                    break
                if seen.get((pe, h), math.inf) < cost or h >= max_hops:
                    continue
                for nb, lid in self.nbrs[pe]:
                    if self.dist[nb].get(dst_pe, 1 << 30) > max_hops - h - 1:
                        continue
                    step = 0.0
                    ok = True
                    for j in range(flits):
                        k = lid * ii + (depart + h * hop + j) % ii
                        over = self.new_flit(k, value, extra)
                        if over is None:  # rides a flit of the same value already there
                            step += 0.05
                            continue
                        if over > 0 and strict:
                            ok = False
                            break
                        step += (1.0 + self.history[k]) * (1.0 + self.present_factor * max(0, over))
                    if not ok:
                        continue
                    c2 = cost + step
                    if c2 < seen.get((nb, h + 1), math.inf):
                        seen[(nb, h + 1)] = c2
                        prev[(nb, h + 1)] = (pe, h)
                        heapq.heappush(heap, (c2, h + 1, nb))
        return best


def _order(kernel: Kernel) -> list[int]:
    """Placement order: depth-first post-order from the sinks, so each node is placed right
    after its producers (which then sit close together) instead of all sources first."""
    seen: set[int] = set()
    order: list[int] = []
    users = {n.id: 0 for n in kernel.nodes}
    for n in kernel.nodes:
        for i in n.inputs:
            users[i] += 1
    for root in [n.id for n in kernel.nodes if not users[n.id]] + [n.id for n in kernel.nodes]:
        stack = [(root, False)]
        while stack:
            nid, done = stack.pop()
            if done:
                if nid not in seen:
                    seen.add(nid)
                    order.append(nid)
                continue
            if nid in seen:
                continue
            stack.append((nid, True))
            for i in reversed(dict.fromkeys(kernel.nodes[nid].inputs)):
                if i not in seen:
                    stack.append((i, False))
    return order


PLACEMENT_ATTEMPTS = 2


def schedule_kernel(kernel: Kernel, arch: ArchSpec, copies: int, ii: int,
                    diag: list[str] | None = None):
    """Place and route `copies` copies at `ii`; return (placements, routes) or None.

    Up to PLACEMENT_ATTEMPTS attempts: a failed attempt's congestion history (PathFinder's
    history cost) carries over, and later attempts choose among the feasible PEs the one whose
    routes cross the least congested (link, slot)s (negotiated placement). On failure a
    sentence naming the resource that ran out (with the numbers) is appended to `diag`."""
    history: Counter = Counter()
    for attempt in range(PLACEMENT_ATTEMPTS):
        why: list[str] = []
        got = _schedule_once(kernel, arch, copies, ii, why, history, attempt)
        if got is not None:
            return got
        if not why or not why[0].startswith("links"):
            break  # slots or entries ran out: placement order will not change that
    if diag is not None:
        diag.extend(why)
    return None


def _schedule_once(kernel, arch, copies, ii, diag, history: Counter, attempt: int):
    st = _State(kernel, arch, ii)
    st.history = history
    hop = st.hop
    limit = arch.pe_array.instruction_entries
    pes = [(r, c) for r in range(arch.pe_array.rows) for c in range(arch.pe_array.cols)]
    horizon = ii + 2 * (arch.pe_array.rows + arch.pe_array.cols) * hop + max(st.flits.values(), default=1)
    where: dict[tuple[int, int], Placement] = {}
    routes: dict[tuple[int, int, int], tuple[tuple, int, list]] = {}  # (copy, src, dst) -> (path, depart, keys)

    def fail(msg: str):
        if diag is not None:
            diag.append(msg)

    def try_pe(pe, t, preds, searches):
        """Routes for every input into `pe` at `t`, jointly within capacity, or None."""
        extra: dict = {}
        got = [(p, (pe,), p.time + p.latency, []) for p in preds if is_immediate(kernel, p.node)]
        for p in preds:
            if is_immediate(kernel, p.node):
                continue
            fl = st.flits[p.node]
            value = (p.copy, p.node)
            r = st.quick_route(p.pe, p.time + p.latency, pe, t, fl, value, extra)
            if r is None and searches[0] > 0:
                searches[0] -= 1
                r = st.search_route(p.pe, p.time + p.latency, pe, t, fl, True, value, extra)
                r = r[:2] if r is not None else None
            if r is None:
                return None
            keys = st.link_keys(r[0], r[1], fl)
            for k in keys:
                extra.setdefault(k, set()).add(value)
            got.append((p, r[0], r[1], keys))
        return got

    for copy in range(copies):
        anchor = pes[(copy * len(kernel.nodes)) % len(pes)]
        near = sorted(pes, key=lambda q: (abs(q[0] - anchor[0]) + abs(q[1] - anchor[1]), q))
        for nid in _order(kernel):
            node = kernel.nodes[nid]
            lat = op_latency(arch, node.op)
            preds = list({i: where[(copy, i)] for i in node.inputs}.values())
            ready = max((p.time + p.latency for p in preds), default=0)
            chosen = None
            free_seen = False
            searches = [8 + 16 * attempt]  # Dijkstra detours per node (shortest paths first)
            # candidate PEs closest to the producers first (then to the copy's anchor)
            routed = [p for p in preds if not is_immediate(kernel, p.node)]
            order = sorted(near, key=lambda q: sum(st.dist[p.pe].get(q, 99) for p in routed)) \
                if routed else near
            for t in range(ready, ready + horizon):
                options = []
                for pe in order:
                    if st.entries[pe] >= limit or not st.slot_free(pe, t, node.op):
                        continue
                    free_seen = True
                    if any(st.dist[p.pe].get(pe, 1 << 30) * hop + st.flits[p.node] - 1
                           > t - p.time - p.latency for p in routed):
                        continue
                    got = try_pe(pe, t, preds, searches)
                    if got is not None:
                        options.append((pe, t, got))
                        if attempt == 0 or len(options) == 8:
                            break
                if options:
                    # negotiated placement: the least congested-history routes, then nearest
                    chosen = min(options, key=lambda o: sum(
                        history[k] for _, _, _, keys in o[2] for k in keys))
                    break
            if chosen is None and free_seen:
                chosen = _place_with_overuse(st, near, preds, node, ready, horizon, limit)
            if chosen is None:
                full = sum(1 for pe in pes if st.entries[pe] >= limit)
                fu = arch.fu_for(node.op.value)
                return fail(
                    f"copy {copy} node %{nid} ({node.op.value}) found no free slot: "
                    f"{full} of {len(pes)} PEs have all pe_array.instruction_entries = {limit} "
                    f"used and the {fu.name!r} units (issue interval {fu.issue_interval_cycles}) "
                    f"are busy in every slot of II = {ii}")
            pe, t, got = chosen
            st.occupy(pe, t, node.op, (copy, nid))
            where[(copy, nid)] = Placement(node=nid, copy=copy, pe=pe, time=t, latency=lat)
            for p, path, depart, keys in got:
                st.reserve(keys, (copy, p.node))
                routes[(copy, p.node, nid)] = (path, depart, keys)
    if st.overused() and not _negotiate(st, where, routes) \
            and not _repair_placement(st, where, routes, random.Random(attempt)):
        over = st.overused()
        for k, n in over.items():
            history[k] += n
        key, n = max(over.items(), key=lambda kv: kv[1])
        link, slot = st.describe(key)
        return fail(f"links: {len(over)} (link, slot) pairs stay over capacity after "
                    f"rip-up-and-reroute negotiation (worst: link {link[0]}->{link[1]} needs "
                    f"{n + st.cap} values in slot {slot} of II = {ii}, capacity "
                    f"interconnect.links_per_direction = {st.cap})")
    placements = list(where.values())
    out = [Route(src=s, dst=d, copy=c, links=tuple(pairwise(path)), depart=dep)
           for (c, s, d), (path, dep, _) in routes.items()]
    return placements, out


REPAIR_MOVES = 800


def _repair_placement(st: _State, where, routes, rng: random.Random, moves: int = REPAIR_MOVES) -> bool:
    """Negotiation could not fix the links with the nodes where they are: move nodes instead.
    Simulated annealing over the placement of nodes whose routes cross an overused
    (link, slot): a move re-places one such node (another PE within two hops, another time
    within its dependence window) and reroutes its edges at PathFinder cost; the objective is
    the total overuse. True once nothing is over capacity."""
    kernel, arch, ii = st.kernel, st.arch, st.ii
    succs: dict[int, list[int]] = {n.id: [] for n in kernel.nodes}
    for n in kernel.nodes:
        for i in dict.fromkeys(n.inputs):
            succs[i].append(n.id)
    rows, cols = arch.pe_array.rows, arch.pe_array.cols
    limit = arch.pe_array.instruction_entries

    def overuse() -> int:
        return sum(max(0, len(c) - st.cap) for c in st.carry.values())

    # retime: delay each node by (its depth) x 2 II. Slots and FU occupancy repeat every II and
    # routes move with their endpoints, so nothing new collides, but every edge gains slack for
    # moved nodes to route around congestion (at the price of a longer schedule).
    depth: dict[int, int] = {}
    for n in kernel.nodes:
        depth[n.id] = max((depth[i] + 1 for i in n.inputs), default=0)
    for (copy, nid), p in list(where.items()):
        where[(copy, nid)] = dataclasses.replace(p, time=p.time + 2 * ii * depth[nid])
    for (copy, src, dst), (path, depart, keys) in list(routes.items()):
        routes[(copy, src, dst)] = (path, depart + 2 * ii * depth[src], keys)
    cur = overuse()
    for step in range(moves):
        if cur == 0:
            return True
        temp = 1.5 * (1 - step / moves)
        over = [k for k, c in st.carry.items() if len(c) > st.cap]
        key = rng.choice(over)
        users = [rk for rk, (_, _, keys) in routes.items() if key in keys]
        copy, s, d = rng.choice(users)
        nid = rng.choice((s, d))
        old = where[(copy, nid)]
        node = kernel.nodes[nid]
        ins = [(copy, i, nid) for i in dict.fromkeys(node.inputs)]
        outs = [(copy, nid, x) for x in succs[nid]]
        lo = max((where[(copy, i)].time + where[(copy, i)].latency for i in node.inputs), default=0)
        hi = min((where[(copy, x)].time for x in succs[nid]), default=old.time + ii) - old.latency
        if hi < lo:
            continue
        t = rng.randint(lo, hi)
        r, c = old.pe
        st.release(old.pe, old.time, node.op)
        fl = st.flits[nid]
        cands = [q for q in ((r + dr, c + dc) for dr in range(-3, 4) for dc in range(-3, 4))
                 if 0 <= q[0] < rows and 0 <= q[1] < cols and (q, t) != (old.pe, old.time)
                 and st.entries[q] < limit and st.slot_free(q, t, node.op)
                 and all(st.dist[where[(copy, i)].pe].get(q, 99) * st.hop + st.flits[i] - 1
                         <= t - where[(copy, i)].time - where[(copy, i)].latency
                         for i in node.inputs if not is_immediate(kernel, i))
                 and (is_immediate(kernel, nid) or all(
                     st.dist[q].get(where[(copy, x)].pe, 99) * st.hop + fl - 1
                     <= where[(copy, x)].time - t - old.latency for x in succs[nid]))]
        if not cands:
            st.occupy(old.pe, old.time, node.op, (copy, nid))
            continue
        pe = rng.choice(cands)
        saved = {k: routes.pop(k) for k in ins + outs if k in routes}
        for k, (_, _, keys) in saved.items():
            st.unreserve(keys, (k[0], k[1]))
        where[(copy, nid)] = Placement(node=nid, copy=copy, pe=pe, time=t, latency=old.latency)
        st.occupy(pe, t, node.op, (copy, nid))
        added, ok = {}, True
        for k in saved:
            src, dst = where[(k[0], k[1])], where[(k[0], k[2])]
            if is_immediate(kernel, k[1]):
                ok = dst.time >= src.time + src.latency
                added[k] = ((dst.pe,), src.time + src.latency, [])
            else:
                fl = st.flits[k[1]]
                got = st.search_route(src.pe, src.time + src.latency, dst.pe, dst.time, fl,
                                      False, (k[0], k[1]))
                ok = got is not None
                if ok:
                    keys = st.link_keys(got[0], got[1], fl)
                    st.reserve(keys, (k[0], k[1]))
                    added[k] = (got[0], got[1], keys)
            if not ok:
                break
        new = overuse() if ok else math.inf
        if ok and (new <= cur or rng.random() < math.exp(-(new - cur) / max(temp, 1e-9))):
            routes.update(added)
            cur = new
            continue
        for k, (_, _, keys) in added.items():
            st.unreserve(keys, (k[0], k[1]))
        st.release(pe, t, node.op)
        where[(copy, nid)] = old
        st.occupy(old.pe, old.time, node.op, (copy, nid))
        for k, v in saved.items():
            routes[k] = v
            st.reserve(v[2], (k[0], k[1]))
    return cur == 0


def _place_with_overuse(st: _State, near, preds, node, ready, horizon, limit):
    """The earliest (t, PE) with a free slot whose inputs route at the least PathFinder cost,
    overuse allowed (the negotiation loop resolves it later)."""
    best = None
    for t in range(ready, ready + horizon):
        tried = 0
        for pe in near:
            if st.entries[pe] >= limit or not st.slot_free(pe, t, node.op):
                continue
            if tried == 6:
                break
            tried += 1
            got = [(p, (pe,), p.time + p.latency, []) for p in preds if is_immediate(st.kernel, p.node)]
            total, extra = 0.0, {}
            for p in preds:
                if is_immediate(st.kernel, p.node):
                    continue
                fl = st.flits[p.node]
                value = (p.copy, p.node)
                r = st.search_route(p.pe, p.time + p.latency, pe, t, fl, False, value, extra)
                if r is None:
                    break
                total += r[2]
                keys = st.link_keys(r[0], r[1], fl)
                for k in keys:
                    extra.setdefault(k, set()).add(value)
                got.append((p, r[0], r[1], keys))
            else:
                if best is None or total < best[0]:
                    best = (total, (pe, t, got))
        if best is not None:
            return best[1]
    return None


def _negotiate(st: _State, where, routes) -> bool:
    """PathFinder: rip up routes through overused (link, slot)s, raise history and present
    costs, reroute; True once nothing is over capacity. Gives up after NEGOTIATION_ITERATIONS
    or 6 iterations without progress."""
    best, stale = math.inf, 0
    for _ in range(NEGOTIATION_ITERATIONS):
        over = st.overused()
        if not over:
            return True
        total = sum(over.values())
        best, stale = (total, 0) if total < best else (best, stale + 1)
        if stale >= 6:
            return False
        for k, n in over.items():
            st.history[k] += n
        st.present_factor *= 1.6
        for key, (path, depart, keys) in list(routes.items()):
            if not any(k in over for k in keys):
                continue
            copy, s, d = key
            src, dst = where[(copy, s)], where[(copy, d)]
            value = (copy, s)
            st.unreserve(keys, value)
            fl = st.flits[s]
            r = st.search_route(src.pe, src.time + src.latency, dst.pe, dst.time, fl, False, value)
            if r is None:  # keep the old route
                st.reserve(keys, value)
                continue
            nk = st.link_keys(r[0], r[1], fl)
            st.reserve(nk, value)
            routes[key] = (r[0], r[1], nk)
    return not st.overused()


# -- improvement by simulated annealing ----------------------------------------------------------

def anneal(kernel: Kernel, arch: ArchSpec, ii: int, placements, routes, seed: int = 0,
           moves: int = 2000, temperature: float = 2.0):
    """Simulated annealing over node positions at fixed II: cost = schedule length x 16 +
    link hops. A move re-places one node of one copy (another PE within two hops, another time
    within its dependence window) and reroutes its edges strictly within capacity; worse states
    are accepted with probability exp(-delta / T), T falling linearly to 0. Returns the best
    (placements, routes) seen — never worse than the input."""
    rng = random.Random(seed)
    st = _State(kernel, arch, ii)
    where = {(p.copy, p.node): p for p in placements}
    rmap: dict[tuple[int, int, int], tuple[tuple, int, list]] = {}
    for r in routes:
        path = (r.links[0][0],) + tuple(b for _, b in r.links) if r.links else (where[(r.copy, r.src)].pe,)
        keys = st.link_keys(path, r.depart, st.flits[r.src])
        st.reserve(keys, (r.copy, r.src))
        rmap[(r.copy, r.src, r.dst)] = (path, r.depart, keys)
    for p in placements:
        st.occupy(p.pe, p.time, kernel.nodes[p.node].op, (p.copy, p.node))
    succs: dict[int, list[int]] = {n.id: [] for n in kernel.nodes}
    for n in kernel.nodes:
        for i in n.inputs:
            succs[i].append(n.id)
    rows, cols = arch.pe_array.rows, arch.pe_array.cols
    limit = arch.pe_array.instruction_entries

    def cost() -> float:
        length = max(p.time + p.latency for p in where.values())
        hops = sum(len(path) - 1 for path, _, _ in rmap.values())
        return 16.0 * length + hops

    cur = cost()
    best = (cur, dict(where), dict(rmap))
    keys_all = list(where)
    for step in range(moves):
        temp = temperature * (1 - step / moves)
        copy, nid = rng.choice(keys_all)
        old = where[(copy, nid)]
        node = kernel.nodes[nid]
        ins = [(copy, i, nid) for i in node.inputs]
        outs = [(copy, nid, s) for s in succs[nid]]
        lo = max((where[(copy, i)].time + where[(copy, i)].latency for i in node.inputs), default=0)
        hi = min((where[(copy, s)].time for s in succs[nid]), default=old.time + ii) - old.latency
        if hi < lo:
            continue
        r, c = old.pe
        pe = ((r + rng.randint(-2, 2)) % rows, (c + rng.randint(-2, 2)) % cols)
        t = rng.randint(lo, min(hi, lo + 2 * ii))
        if (pe, t) == (old.pe, old.time):
            continue
        # rip up
        st.release(old.pe, old.time, node.op)
        saved = {k: rmap.pop(k) for k in dict.fromkeys(ins + outs)}
        for k, (_, _, keys) in saved.items():
            st.unreserve(keys, (k[0], k[1]))
        ok = st.entries[pe] < limit and st.slot_free(pe, t, node.op)
        new = Placement(node=nid, copy=copy, pe=pe, time=t, latency=old.latency)
        added = {}
        if ok:
            where[(copy, nid)] = new
            for key in saved:
                src, dst = where[(key[0], key[1])], where[(key[0], key[2])]
                if is_immediate(kernel, key[1]):
                    if dst.time < src.time + src.latency:
                        ok = False
                        break
                    added[key] = ((dst.pe,), src.time + src.latency, [])
                    continue
                fl = st.flits[key[1]]
                got = st.quick_route(src.pe, src.time + src.latency, dst.pe, dst.time, fl,
                                     (key[0], key[1]), None)
                if got is None:
                    ok = False
                    break
                keys = st.link_keys(got[0], got[1], fl)
                st.reserve(keys, (key[0], key[1]))
                added[key] = (got[0], got[1], keys)
        if ok:
            st.occupy(pe, t, node.op, (copy, nid))
            rmap.update(added)
            c2 = cost()
            delta = c2 - cur
            if delta <= 0 or (temp > 0 and rng.random() < math.exp(-delta / temp)):
                cur = c2
                if cur < best[0]:
                    best = (cur, dict(where), dict(rmap))
                continue
            st.release(pe, t, node.op)
            for k in added:
                rmap.pop(k)
        for k, (_, _, keys) in added.items():
            st.unreserve(keys, (k[0], k[1]))
        where[(copy, nid)] = old
        st.occupy(old.pe, old.time, node.op, (copy, nid))
        for k, v in saved.items():
            rmap[k] = v
            st.reserve(v[2], (k[0], k[1]))
    _, bw, br = best
    out = [Route(src=s, dst=d, copy=c, links=tuple(pairwise(path)), depart=dep)
           for (c, s, d), (path, dep, _) in br.items()]
    return list(bw.values()), out
