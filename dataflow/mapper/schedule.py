"""Modulo scheduling with placement and negotiated (PathFinder-style) routing on the PE array.

A kernel's body is replicated into `copies` copies (spatial unrolling); each copy is scheduled at
initiation interval II. Lower bound (`bounds.py`) MII = max(ResMII, RecMII) (Rau, "Iterative Modulo
Scheduling", 1994): ResMII from PE issue slots, functional-unit occupancy (issue interval) and
SPM ports; RecMII from loop-carried cycles.

Resources reserved modulo II, per attempt:
- a PE issues up to `pe_array.issue_width` ops per cycle (slot `t mod II`), each on a different
  functional unit (docs/architecture.md#issue-width);
- a functional unit of issue interval k is busy k consecutive slots from the op's issue;
- a PE holds at most `instruction_entries` ops;
- a link carries `links_per_direction` flits per cycle; a value of w words crosses a link of
  width W in ceil(w / W) flits, one per cycle (wormhole: the hop latency applies to the head
  flit, the tail arrives ceil(w / W) - 1 cycles later).

Placement is list scheduling in topological order (each node at its earliest time, on the
nearest PE whose inputs can be routed within capacity). The PEs considered for a node are those
near its producers (a ball around the tightest input holding at most PLACEMENT_REACH_PES PEs,
grown as the node's start time allows longer routes), never a scan of the whole array, so a
placement costs the same on an 8 x 8 array as on a 256 x 256 one. Routes are searched in the
time-expanded array graph (any path, any departure between the producer's result and the
consumer's issue), costed PathFinder-style (McMurchie & Ebeling, FPGA 1995): each (link, slot)
costs (1 + history) x (1 + present_factor x overuse). When no strictly legal placement exists
the node is placed with overuse, and a negotiation loop then rips up every route through an
overused (link, slot), raises that resource's history cost and the present factor, and
reroutes, until no link is over capacity or the iteration budget runs out.

Routing and its reservation state live in `routing.py`; the placement repair and the optional
`anneal` pass (simulated annealing at fixed II) in `improve.py`.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from itertools import pairwise

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.graph import Kernel
from dataflow.dfg.ops import Op
from dataflow.mapper.bounds import (
    op_latency,
)
from dataflow.mapper.improve import anneal, repair_placement
from dataflow.mapper.mapping import Placement, Route
from dataflow.mapper.routing import (
    Link,
    RouteState,
    ball,
    hop,
    hop_distance,
    is_immediate,
    shortest_path,
    value_flits,
)

__all__ = ["DEFAULT_EFFORT", "HARD_EFFORT", "Effort", "Link", "anneal", "delay_sources", "hop",
           "hop_distance", "is_immediate", "schedule_kernel", "shortest_path", "value_flits"]

NEGOTIATION_ITERATIONS = 24
# PathFinder gives up after this many iterations without a lower total overuse: by then the
# history costs have stopped moving routes and more iterations only cost time
NEGOTIATION_STALE_LIMIT = 6
# growth of PathFinder's present-congestion factor per iteration: fast enough that overused
# (link, slot)s empty within NEGOTIATION_ITERATIONS, slow enough that routes move a few at a time
PRESENT_FACTOR_GROWTH = 1.6
# Dijkstra detours a node may spend when the quick route fails: a few on the first attempt
# (shortest paths first), more on each retry after a link failure, which needs wider detours
ROUTE_SEARCHES_FIRST = 8
ROUTE_SEARCHES_PER_ATTEMPT = 16
# negotiated placement (attempts after the first) compares at most this many feasible PEs per
# time step; more finds little and multiplies the route searches
PLACEMENT_OPTIONS = 8
# placement with overuse prices at most this many free PEs per time step (each costs a full
# PathFinder search per input)
OVERUSE_CANDIDATES = 6
# a node with routed inputs is placed on one of the PEs of the smallest ball (in hops) around
# its tightest input that holds this many PEs: twice the default 8 x 8 array, so arrays of up
# to 128 PEs see every PE as before; on a larger one a PE further away would need long routes
# anyway, and the bound keeps a node's placement work independent of the array size
# (256 PEs made hard-to-route kernels twice as slow on a 64 x 64 array for the same II)
PLACEMENT_REACH_PES = 128


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


class FailureCause(Enum):
    """Why one placement attempt failed; `schedule_kernel` retries only on LINKS."""

    NO_SLOT = "no free slot"  # a node found no PE with a free slot and instruction entry
    LINKS = "links over capacity"  # negotiation and repair left (link, slot)s over capacity


@dataclass(frozen=True)
class ScheduleFailure:
    """A failed attempt: its cause and the sentence (with the numbers) for the diagnostics."""

    cause: FailureCause
    message: str


PLACEMENT_ATTEMPTS = 2


@dataclass(frozen=True)
class Effort:
    """How hard `schedule_kernel` tries before it gives up an II: placement attempts (each
    after the first negotiated on the history before it) and PathFinder's iteration limits."""

    attempts: int = PLACEMENT_ATTEMPTS
    iterations: int = NEGOTIATION_ITERATIONS
    stale_limit: int = NEGOTIATION_STALE_LIMIT


#: the default: a body that misses its II here usually maps one II up in a fraction of the time
DEFAULT_EFFORT = Effort()
#: for a body that missed its MII by links alone and runs many times (a butterfly stage
#: kernel, `plan.stage_mapping._harder_links`): the sequence pass's radix-8 kernels of FNet
#: seq 1024 on mlx_4x4 (142 nodes) map at II 3 = MII with 6 attempts of up to 60 iterations,
#: not with 2 of 24 (II 4); ~1.4 s a body, once (docs/conventions.md#fnet-pass-boundaries)
HARD_EFFORT = Effort(attempts=6, iterations=60, stale_limit=15)


def schedule_kernel(kernel: Kernel, arch: ArchSpec, copies: int, ii: int,
                    diag: list[str] | None = None, effort: Effort = DEFAULT_EFFORT):
    """Place and route `copies` copies at `ii`; return (placements, routes) or None.

    Up to PLACEMENT_ATTEMPTS attempts: a failed attempt's congestion history (PathFinder's
    history cost) carries over, and later attempts choose among the feasible PEs the one whose
    routes cross the least congested (link, slot)s (negotiated placement). On failure a
    sentence naming the resource that ran out (with the numbers) is appended to `diag`."""
    history: Counter = Counter()
    for attempt in range(effort.attempts):
        got = _Attempt(kernel, arch, copies, ii, history, attempt, effort).run()
        if not isinstance(got, ScheduleFailure):
            return got
        if got.cause is not FailureCause.LINKS:
            break  # slots or entries ran out: placement order will not change that
    if diag is not None:
        diag.append(got.message)
    return None


class _Attempt:
    """One placement attempt: list scheduling of every copy, then negotiation of the links."""

    def __init__(self, kernel, arch, copies, ii, history: Counter, attempt: int,
                 effort: Effort = DEFAULT_EFFORT):
        self.kernel, self.arch, self.copies, self.ii = kernel, arch, copies, ii
        self.history, self.attempt, self.effort = history, attempt, effort
        self.st = RouteState(kernel, arch, ii)
        self.st.history = history
        self.limit = arch.pe_array.instruction_entries
        self.horizon = (ii + 2 * (arch.pe_array.rows + arch.pe_array.cols) * self.st.hop
                        + max(self.st.flits.values(), default=1))
        self.where: dict[tuple[int, int], Placement] = {}
        # (copy, src, dst) -> (path, depart, keys)
        self.routes: dict[tuple[int, int, int], tuple[tuple, int, list]] = {}
        self.searches = 0  # Dijkstra detours left for the node being placed

    def run(self):
        """(placements, routes), or a ScheduleFailure."""
        for copy in range(self.copies):
            failed = self._place_copy(copy)
            if failed is not None:
                return failed
        failed = self._clear_links()
        if failed is not None:
            return failed
        out = [Route(src=s, dst=d, copy=c, links=tuple(pairwise(path)), depart=dep)
               for (c, s, d), (path, dep, _) in self.routes.items()]
        return list(self.where.values()), out

    def _place_copy(self, copy: int) -> ScheduleFailure | None:
        # copies start at consecutive PEs in row-major order, one body's length apart
        arch = self.arch
        anchor = divmod((copy * len(self.kernel.nodes)) % arch.pe_array.num_pes,
                        arch.pe_array.cols)
        near = _NearPEs(anchor, arch.pe_array.rows, arch.pe_array.cols)
        for nid in _order(self.kernel):
            node = self.kernel.nodes[nid]
            preds = list({i: self.where[(copy, i)] for i in node.inputs}.values())
            ready = max((p.time + p.latency for p in preds), default=0)
            chosen, free_seen = self._place_legal(near, preds, node, ready)
            if chosen is None and free_seen:
                chosen = _place_with_overuse(self.st, near, preds, node, ready, self.horizon,
                                             self.limit)
            if chosen is None:
                return self._no_slot(copy, nid, node)
            self._commit(copy, nid, node, chosen)
        return None

    def _place_legal(self, near, preds, node, ready):
        """(chosen, free_seen): the earliest time with a PE whose inputs route within capacity
        (chosen = (pe, t, routes) or None), and whether any PE had a free slot at all.

        Candidate PEs closest to the producers first (then to the copy's anchor); at cycle t
        only those the tightest input can reach by t (`_Candidates`), not the whole array.
        The search stops early once later cycles can only repeat earlier ones: the candidates
        have stopped growing, no Dijkstra detour is left, and a whole II has passed since every
        input's shortest routes could leave at any of its II departure cycles."""
        st, kernel = self.st, self.kernel
        self.searches = ROUTE_SEARCHES_FIRST + ROUTE_SEARCHES_PER_ATTEMPT * self.attempt
        routed = [p for p in preds if not is_immediate(kernel, p.node)]
        cands = _Candidates(st, near, routed) if routed else None
        repeats_from = None  # the cycle from which each II repeats the one before
        for t in range(ready, ready + self.horizon):
            options = self._options_at(cands.at(t) if cands else near, t, node, preds, routed)
            if options:
                # negotiated placement: the least congested-history routes, then nearest
                return min(options, key=lambda o: sum(
                    self.history[k] for _, _, _, keys in o[2] for k in keys)), True
            if repeats_from is None and cands is not None and cands.final and not self.searches:
                repeats_from = max(t + 1, cands.settled_cycle(self.ii))
            if repeats_from is not None and t + 1 >= repeats_from + self.ii:
                break
        return None, self._any_free(near, node, ready)

    def _options_at(self, order, t, node, preds, routed) -> list:
        """(pe, t, routes) for the PEs of `order` (in order) that take `node` at cycle t with
        every input routed within capacity: the first only on the first attempt, else up to
        PLACEMENT_OPTIONS."""
        st = self.st
        options = []
        if st.width > 1:
            # PEs whose slot is empty first, then those issuing one op in it, ...: a PE takes
            # a second op in a slot only when no candidate has it empty, since ops piled on
            # one PE hold their operands in its registers (docs/architecture.md#issue-width);
            # stable, so nearest first among equals
            slot = t % self.ii
            order = sorted(order, key=lambda pe: st.slots.get((pe, slot), 0))
        for pe in order:
            if st.entries[pe] >= self.limit or not st.slot_free(pe, t, node.op):
                continue
            if any(st.hops(p.pe, pe) * st.hop + st.flits[p.node] - 1
                   > t - p.time - p.latency for p in routed):
                continue
            got = self._try_pe(pe, t, preds)
            if got is not None:
                options.append((pe, t, got))
                if self.attempt == 0 or len(options) == PLACEMENT_OPTIONS:
                    break
        return options

    def _any_free(self, near, node, ready) -> bool:
        """Whether any PE has a free instruction entry and a free slot for `node` in some
        cycle of [ready, ready + II) (the slots repeat every II), nearest the anchor first."""
        st = self.st
        return any(st.entries[pe] < self.limit and any(st.slot_free(pe, t, node.op)
                                                       for t in range(ready, ready + self.ii))
                   for pe in near)

    def _try_pe(self, pe, t, preds):
        """Routes for every input into `pe` at `t`, jointly within capacity, or None."""
        st, kernel = self.st, self.kernel
        extra: dict = {}
        got = [(p, (pe,), p.time + p.latency, []) for p in preds if is_immediate(kernel, p.node)]
        for p in preds:
            if is_immediate(kernel, p.node):
                continue
            fl = st.flits[p.node]
            value = (p.copy, p.node)
            r = st.quick_route(p.pe, p.time + p.latency, pe, t, fl, value, extra)
            if r is None and self.searches > 0:
                self.searches -= 1
                r = st.search_route(p.pe, p.time + p.latency, pe, t, fl, True, value, extra)
                r = r[:2] if r is not None else None
            if r is None:
                return None
            keys = st.link_keys(r[0], r[1], fl)
            for k in keys:
                extra.setdefault(k, set()).add(value)
            got.append((p, r[0], r[1], keys))
        return got

    def _commit(self, copy, nid, node, chosen) -> None:
        pe, t, got = chosen
        lat = op_latency(self.arch, node.op)
        self.st.occupy(pe, t, node.op, (copy, nid))
        self.where[(copy, nid)] = Placement(node=nid, copy=copy, pe=pe, time=t, latency=lat)
        for p, path, depart, keys in got:
            self.st.reserve(keys, (copy, p.node))
            self.routes[(copy, p.node, nid)] = (path, depart, keys)

    def _no_slot(self, copy, nid, node) -> ScheduleFailure:
        limit, pes = self.limit, self.arch.pe_array.num_pes
        full = sum(1 for n in self.st.entries.values() if n >= limit)
        fu = self.arch.fu_for(node.op.value)
        return ScheduleFailure(FailureCause.NO_SLOT, (
            f"copy {copy} node %{nid} ({node.op.value}) found no free slot: "
            f"{full} of {pes} PEs have all pe_array.instruction_entries = {limit} "
            f"used and the {fu.name!r} units (issue interval {fu.issue_interval_cycles}) "
            f"are busy in every slot of II = {self.ii}"))

    def _clear_links(self) -> ScheduleFailure | None:
        """Negotiate, then repair, overused links; a LINKS failure (history raised) if both
        fail."""
        st = self.st
        if not st.overused() or _negotiate(st, self.where, self.routes, self.effort) \
                or repair_placement(st, self.where, self.routes, random.Random(self.attempt)):
            return None
        over = st.overused()
        for k, n in over.items():
            self.history[k] += n
        key, n = max(over.items(), key=lambda kv: kv[1])
        link, slot = st.describe(key)
        return ScheduleFailure(FailureCause.LINKS, (
            f"links: {len(over)} (link, slot) pairs stay over capacity after "
            f"rip-up-and-reroute negotiation (worst: link {link[0]}->{link[1]} needs "
            f"{n + st.cap} values in slot {slot} of II = {self.ii}, capacity "
            f"interconnect.links_per_direction = {st.cap})"))


class _NearPEs:
    """The array's PEs by Manhattan distance from `anchor`, then (row, column): built ring by
    ring, only as far as anyone iterates (a copy's nodes usually sit within a few rings)."""

    def __init__(self, anchor: tuple[int, int], rows: int, cols: int):
        self.anchor, self.rows, self.cols = anchor, rows, cols
        self.pes: list[tuple[int, int]] = []
        self.rings = 0
        r, c = anchor
        self.last_ring = max(r, rows - 1 - r) + max(c, cols - 1 - c)

    def rank(self, q: tuple[int, int]) -> tuple:
        """q's sort key: its position in this order."""
        return abs(q[0] - self.anchor[0]) + abs(q[1] - self.anchor[1]), q

    def __iter__(self):
        i = 0
        while True:
            while i < len(self.pes):
                yield self.pes[i]
                i += 1
            if self.rings > self.last_ring:
                return
            self._add_ring()

    def _add_ring(self) -> None:
        """Append the PEs exactly `self.rings` steps from the anchor, in (row, column) order."""
        d, (r, c) = self.rings, self.anchor
        for dr in range(-d, d + 1):
            row, dc = r + dr, d - abs(dr)
            if 0 <= row < self.rows:
                self.pes.extend((row, col) for col in dict.fromkeys((c - dc, c + dc))
                                if 0 <= col < self.cols)
        self.rings += 1


class _Candidates:
    """The PEs a node with routed inputs may take, in placement order: fewest hops summed over
    its routed inputs, then nearest the copy's anchor (`_NearPEs` order). At cycle t only PEs
    the tightest input (the latest value, counting its tail flits) reaches by t can take the
    node, so `at(t)` returns the ball of that radius around the tightest input's PE, grown
    layer by layer as t advances (never more layers than hold PLACEMENT_REACH_PES PEs): the
    same PEs in the same order as sorting the whole array and skipping those too far."""

    def __init__(self, st: RouteState, near: _NearPEs, routed):
        self.st, self.near, self.routed = st, near, routed
        self.tight = max(routed, key=lambda p: p.time + p.latency + st.flits[p.node])
        self.reach_from = self.tight.time + self.tight.latency + st.flits[self.tight.node] - 1
        self.layers = ball(st.arch, self.tight.pe)
        self.radius = -1  # layers taken so far, minus one
        self.final = False  # no more layers will be taken
        self.keyed: list = []  # (key, pe), sorted
        self.pes: list[tuple[int, int]] = []

    def at(self, t: int) -> list[tuple[int, int]]:
        want = (t - self.reach_from) // self.st.hop
        grew = False
        while self.radius < want and not self.final:
            layer = next(self.layers, None)
            if layer is None:
                self.final = True
                break
            self.radius += 1
            self.keyed.extend((self._key(q), q) for q in layer)
            self.final = len(self.keyed) >= PLACEMENT_REACH_PES
            grew = True
        if grew:
            self.keyed.sort()
            self.pes = [q for _, q in self.keyed]
        return self.pes

    def settled_cycle(self, ii: int) -> int:
        """A cycle from which every input's shortest routes to every candidate may leave at
        any of their II departure cycles (`RouteState.quick_route`), so that, with the
        candidates final, a quick route found at cycle t is found at t + II too. Each
        candidate is within `radius` hops of the tightest input, so within its hops to that
        input plus `radius` of any other."""
        st = self.st
        return max(p.time + p.latency + ii - 1 + st.flits[p.node] - 1
                   + (st.hops(p.pe, self.tight.pe) + self.radius) * st.hop for p in self.routed)

    def _key(self, q) -> tuple:
        return sum(self.st.hops(p.pe, q) for p in self.routed), self.near.rank(q)


def _place_with_overuse(st: RouteState, near, preds, node, ready, horizon, limit):
    """The earliest (t, PE) with a free slot whose inputs route at the least PathFinder cost,
    overuse allowed (the negotiation loop resolves it later)."""
    best = None
    for t in range(ready, ready + horizon):
        tried = 0
        for pe in near:
            if st.entries[pe] >= limit or not st.slot_free(pe, t, node.op):
                continue
            if tried == OVERUSE_CANDIDATES:
                break
            tried += 1
            got = [(p, (pe,), p.time + p.latency, []) for p in preds
                   if is_immediate(st.kernel, p.node)]
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


def _negotiate(st: RouteState, where, routes, effort: Effort = DEFAULT_EFFORT) -> bool:
    """PathFinder: rip up routes through overused (link, slot)s, raise history and present
    costs, reroute; True once nothing is over capacity. Gives up after NEGOTIATION_ITERATIONS
    or NEGOTIATION_STALE_LIMIT iterations without progress (`effort`'s limits)."""
    best, stale = math.inf, 0
    for _ in range(effort.iterations):
        over = st.overused()
        if not over:
            return True
        total = sum(over.values())
        best, stale = (total, 0) if total < best else (best, stale + 1)
        if stale >= effort.stale_limit:
            return False
        for k, n in over.items():
            st.history[k] += n
        st.present_factor *= PRESENT_FACTOR_GROWTH
        for key, (_path, _depart, keys) in list(routes.items()):
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


def delay_sources(kernel: Kernel, arch: ArchSpec, ii: int, placements, routes):
    """Each source load (a load of no input: a row of A, a mask value) of each copy issued as
    late as its consumers allow, by whole IIs so every modulo reservation (issue slot, unit,
    link) stays where it was, its routes departing as much later: its value then waits on
    its consumer's PE for less than an II instead of holding registers there while a long
    chain of products (a blocked lane sum) reaches it (docs/conventions.md#held-loads).
    Returns (placements, routes); nothing else moves."""
    hop = arch.interconnect.hop_latency_cycles
    flits = value_flits(kernel, arch)
    on_cycle = {x for s, d, _ in kernel.carried for x in (s, d)}
    at = {(p.copy, p.node): p for p in placements}
    slack: dict[tuple[int, int], int] = {}
    for r in routes:
        node = kernel.nodes[r.src]
        if node.op is not Op.LOAD or node.inputs or r.src in on_cycle:
            continue
        arrive = r.depart + len(r.links) * hop + (flits[r.src] - 1 if r.links else 0)
        wait = at[(r.copy, r.dst)].time - arrive
        key = (r.copy, r.src)
        slack[key] = min(slack.get(key, wait), wait)
    shift = {key: w // ii * ii for key, w in slack.items() if w >= ii}
    if not shift:
        return placements, routes
    placements = [dataclasses.replace(p, time=p.time + shift.get((p.copy, p.node), 0))
                  for p in placements]
    routes = [dataclasses.replace(r, depart=r.depart + shift.get((r.copy, r.src), 0))
              for r in routes]
    return placements, routes
