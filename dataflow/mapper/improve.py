"""Improvement passes over a modulo schedule, both simulated annealing at fixed II:

- `repair_placement`: when negotiated routing cannot clear the links with the nodes where they
  are, move nodes (after retiming by depth x 2 II for slack) to minimise the total overuse;
- `anneal` (`map_kernel(..., improve="anneal")`): lower schedule length and link hops of a legal
  schedule, never returning a worse one.
"""

from __future__ import annotations

import dataclasses
import math
import random
from itertools import pairwise

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.graph import Kernel
from dataflow.mapper.mapping import Placement, Route
from dataflow.mapper.routing import RouteState, is_immediate

REPAIR_MOVES = 800
# repair moves a node up to this many rows and columns away (a 7 x 7 square around it, cut at
# the array edge): far enough to step around a congested link, near enough to keep routes short
REPAIR_REACH = 3
# repair's starting temperature, in overused (link, slot)s: a move adding one is accepted with
# probability exp(-1 / 1.5) ~ 0.5 at first, falling to 0 by the last move
REPAIR_START_TEMPERATURE = 1.5
# retiming delays each node by its depth x this many IIs: slack for moved nodes to route around
# congestion, at the price of a longer schedule
RETIME_IIS_PER_LEVEL = 2
# anneal's cost: one cycle of schedule length is worth 16 link hops, so length decides and hops
# break ties between schedules of equal length
LENGTH_WEIGHT = 16.0
# anneal moves a node up to this many rows and columns away, wrapping around the array edges
ANNEAL_REACH = 2
# anneal tries start times at most this many IIs after the earliest its inputs allow
ANNEAL_TIME_WINDOW_IIS = 2
# floor on repair's temperature: keeps exp(-delta / T) defined at the last move (T = 0)
MIN_TEMPERATURE = 1e-9

# routes in progress are keyed by (copy, src, dst) and hold (PE path, departure cycle, reserved
# (link, slot) keys)
RouteKey = tuple[int, int, int]


def repair_placement(st: RouteState, where, routes, rng: random.Random,
                     moves: int = REPAIR_MOVES) -> bool:
    """Negotiation could not fix the links with the nodes where they are: move nodes instead.
    Simulated annealing over the placement of nodes whose routes cross an overused
    (link, slot): a move re-places one such node (another PE up to three rows and three
    columns away, cut at the array edge, and another time within its dependence window) and
    reroutes its edges at PathFinder cost; the objective is the total overuse. True once
    nothing is over capacity."""
    succs = _successors(st.kernel)
    _retime(st, where, routes)
    cur = _overuse(st)
    for step in range(moves):
        if cur == 0:
            return True
        temp = REPAIR_START_TEMPERATURE * (1 - step / moves)
        new = _try_repair_move(st, where, routes, succs, rng, cur, temp)
        if new is not None:
            cur = new
    return cur == 0


def _successors(kernel: Kernel) -> dict[int, list[int]]:
    """Each node's consumers in the body, in node order, each once."""
    succs: dict[int, list[int]] = {n.id: [] for n in kernel.nodes}
    for n in kernel.nodes:
        for i in dict.fromkeys(n.inputs):
            succs[i].append(n.id)
    return succs


def _overuse(st: RouteState) -> int:
    """Values beyond capacity summed over every (link, slot) (kept by `RouteState`)."""
    return st.over_total


def _retime(st: RouteState, where, routes) -> None:
    """Delay each node by (its depth) x RETIME_IIS_PER_LEVEL x II. Slots and FU occupancy repeat
    every II and routes move with their endpoints, so nothing new collides, but every edge gains
    slack for moved nodes to route around congestion (at the price of a longer schedule)."""
    shift = RETIME_IIS_PER_LEVEL * st.ii
    depth: dict[int, int] = {}
    for n in st.kernel.nodes:
        depth[n.id] = max((depth[i] + 1 for i in n.inputs), default=0)
    for (copy, nid), p in list(where.items()):
        where[(copy, nid)] = dataclasses.replace(p, time=p.time + shift * depth[nid])
    for (copy, src, dst), (path, depart, keys) in list(routes.items()):
        routes[(copy, src, dst)] = (path, depart + shift * depth[src], keys)


def _dependence_window(kernel: Kernel, where, succs, copy: int, nid: int,
                       ii: int) -> tuple[int, int]:
    """(earliest, latest) start cycle of node `nid` of `copy`: after its inputs are ready,
    early enough for its consumers (an II after its current start when it has none)."""
    old = where[(copy, nid)]
    node = kernel.nodes[nid]
    lo = max((where[(copy, i)].time + where[(copy, i)].latency for i in node.inputs), default=0)
    hi = min((where[(copy, x)].time for x in succs[nid]), default=old.time + ii) - old.latency
    return lo, hi


def _pick_congested_node(st: RouteState, routes, rng: random.Random) -> tuple[int, int]:
    """(copy, node) at one end of a route through a random overused (link, slot)."""
    over = list(st.overused())
    key = rng.choice(over)
    # only routes of a value on that (link, slot) can cross it: the cheap test first
    on = st.carry[key]
    users = [rk for rk, (_, _, keys) in routes.items() if (rk[0], rk[1]) in on and key in keys]
    copy, s, d = rng.choice(users)
    return copy, rng.choice((s, d))


def _try_repair_move(st: RouteState, where, routes, succs, rng: random.Random, cur: int,
                     temp: float) -> int | None:
    """One repair move; the new total overuse if it is accepted, else None (state unchanged)."""
    kernel = st.kernel
    copy, nid = _pick_congested_node(st, routes, rng)
    old = where[(copy, nid)]
    node = kernel.nodes[nid]
    lo, hi = _dependence_window(kernel, where, succs, copy, nid, st.ii)
    if hi < lo:
        return None
    t = rng.randint(lo, hi)
    st.release(old.pe, old.time, node.op)
    cands = _repair_candidates(st, where, succs, copy, nid, t)
    if not cands:
        st.occupy(old.pe, old.time, node.op, (copy, nid))
        return None
    pe = rng.choice(cands)
    ins = [(copy, i, nid) for i in dict.fromkeys(node.inputs)]
    outs = [(copy, nid, x) for x in succs[nid]]
    saved = {k: routes.pop(k) for k in ins + outs if k in routes}
    _unreserve_routes(st, saved)
    where[(copy, nid)] = Placement(node=nid, copy=copy, pe=pe, time=t, latency=old.latency)
    st.occupy(pe, t, node.op, (copy, nid))
    added, ok = _reroute_at_pathfinder_cost(st, where, saved)
    new = _overuse(st) if ok else math.inf
    if ok and (new <= cur or rng.random() < math.exp(-(new - cur) / max(temp, MIN_TEMPERATURE))):
        routes.update(added)
        return new
    _unreserve_routes(st, added)
    st.release(pe, t, node.op)
    _restore(st, where, routes, saved, copy, nid, old)
    return None


def _repair_candidates(st: RouteState, where, succs, copy: int, nid: int, t: int) -> list:
    """PEs up to REPAIR_REACH rows and columns from node `nid`'s PE (not wrapping) with a free
    entry and slot at cycle t, from which every routed input arrives and every routed output
    leaves in time (by hop distance alone); not its current (PE, time)."""
    kernel, arch = st.kernel, st.arch
    rows, cols = arch.pe_array.rows, arch.pe_array.cols
    limit = arch.pe_array.instruction_entries
    old = where[(copy, nid)]
    node = kernel.nodes[nid]
    r, c = old.pe
    fl = st.flits[nid]
    reach = range(-REPAIR_REACH, REPAIR_REACH + 1)

    def inputs_arrive(q) -> bool:
        return all(st.hops(where[(copy, i)].pe, q) * st.hop + st.flits[i] - 1
                   <= t - where[(copy, i)].time - where[(copy, i)].latency
                   for i in node.inputs if not is_immediate(kernel, i))

    def outputs_leave(q) -> bool:
        return is_immediate(kernel, nid) or all(
            st.hops(q, where[(copy, x)].pe) * st.hop + fl - 1
            <= where[(copy, x)].time - t - old.latency for x in succs[nid])

    return [q for q in ((r + dr, c + dc) for dr in reach for dc in reach)
            if 0 <= q[0] < rows and 0 <= q[1] < cols and (q, t) != (old.pe, old.time)
            and st.entries[q] < limit and st.slot_free(q, t, node.op)
            and inputs_arrive(q) and outputs_leave(q)]


def _reroute_at_pathfinder_cost(st: RouteState, where, saved) -> tuple[dict, bool]:
    """Route the ripped-up edges `saved` between their endpoints' current places, overuse
    allowed (`search_route`, not strict), reserving as it goes; (routes added, all routed)."""
    kernel = st.kernel
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
    return added, ok


def _unreserve_routes(st: RouteState, rs) -> None:
    for k, (_, _, keys) in rs.items():
        st.unreserve(keys, (k[0], k[1]))


def _restore(st: RouteState, where, routes, saved, copy: int, nid: int,
             old: Placement) -> None:
    """Put node `nid` of `copy` back at `old` and its ripped-up routes `saved` back."""
    where[(copy, nid)] = old
    st.occupy(old.pe, old.time, st.kernel.nodes[nid].op, (copy, nid))
    for k, v in saved.items():
        routes[k] = v
        st.reserve(v[2], (k[0], k[1]))


def anneal(kernel: Kernel, arch: ArchSpec, ii: int, placements, routes, seed: int = 0,
           moves: int = 2000, temperature: float = 2.0):
    """Simulated annealing over node positions at fixed II: cost = schedule length x 16 +
    link hops. A move re-places one node of one copy (another PE up to two rows and two columns
    away, wrapping around the array edges, and another time within its dependence window, at
    most 2 II after its earliest) and reroutes its edges strictly within capacity; worse states
    are accepted with probability exp(-delta / T), T falling linearly to 0. Returns the best
    (placements, routes) seen — never worse than the input."""
    rng = random.Random(seed)
    st = RouteState(kernel, arch, ii)
    where = {(p.copy, p.node): p for p in placements}
    rmap = _reserve_routes(st, where, routes)
    for p in placements:
        st.occupy(p.pe, p.time, kernel.nodes[p.node].op, (p.copy, p.node))
    succs = _successors(kernel)
    cur = _anneal_cost(where, rmap)
    best = (cur, dict(where), dict(rmap))
    keys_all = list(where)
    for step in range(moves):
        temp = temperature * (1 - step / moves)
        new = _try_anneal_move(st, where, rmap, succs, rng, keys_all, cur, temp)
        if new is not None:
            cur = new
            if cur < best[0]:
                best = (cur, dict(where), dict(rmap))
    _, bw, br = best
    out = [Route(src=s, dst=d, copy=c, links=tuple(pairwise(path)), depart=dep)
           for (c, s, d), (path, dep, _) in br.items()]
    return list(bw.values()), out


def _reserve_routes(st: RouteState, where, routes) -> dict[RouteKey, tuple[tuple, int, list]]:
    """Reserve the links of `routes` in `st`; the routes by (copy, src, dst)."""
    rmap: dict[RouteKey, tuple[tuple, int, list]] = {}
    for r in routes:
        if r.links:
            path = (r.links[0][0],) + tuple(b for _, b in r.links)
        else:
            path = (where[(r.copy, r.src)].pe,)
        keys = st.link_keys(path, r.depart, st.flits[r.src])
        st.reserve(keys, (r.copy, r.src))
        rmap[(r.copy, r.src, r.dst)] = (path, r.depart, keys)
    return rmap


def _anneal_cost(where, rmap) -> float:
    length = max(p.time + p.latency for p in where.values())
    hops = sum(len(path) - 1 for path, _, _ in rmap.values())
    return LENGTH_WEIGHT * length + hops


def _try_anneal_move(st: RouteState, where, rmap, succs, rng: random.Random, keys_all,
                     cur: float, temp: float) -> float | None:
    """One annealing move; the new cost if it is accepted, else None (state unchanged)."""
    kernel, ii = st.kernel, st.ii
    rows, cols = st.arch.pe_array.rows, st.arch.pe_array.cols
    copy, nid = rng.choice(keys_all)
    old = where[(copy, nid)]
    node = kernel.nodes[nid]
    lo, hi = _dependence_window(kernel, where, succs, copy, nid, ii)
    if hi < lo:
        return None
    r, c = old.pe
    pe = ((r + rng.randint(-ANNEAL_REACH, ANNEAL_REACH)) % rows,
          (c + rng.randint(-ANNEAL_REACH, ANNEAL_REACH)) % cols)
    t = rng.randint(lo, min(hi, lo + ANNEAL_TIME_WINDOW_IIS * ii))
    if (pe, t) == (old.pe, old.time):
        return None
    # rip up
    st.release(old.pe, old.time, node.op)
    ins = [(copy, i, nid) for i in node.inputs]
    outs = [(copy, nid, s) for s in succs[nid]]
    saved = {k: rmap.pop(k) for k in dict.fromkeys(ins + outs)}
    _unreserve_routes(st, saved)
    ok = st.entries[pe] < st.arch.pe_array.instruction_entries and st.slot_free(pe, t, node.op)
    added = {}
    if ok:
        where[(copy, nid)] = Placement(node=nid, copy=copy, pe=pe, time=t, latency=old.latency)
        added, ok = _reroute_within_capacity(st, where, saved)
    if ok:
        st.occupy(pe, t, node.op, (copy, nid))
        rmap.update(added)
        new = _anneal_cost(where, rmap)
        delta = new - cur
        if delta <= 0 or (temp > 0 and rng.random() < math.exp(-delta / temp)):
            return new
        st.release(pe, t, node.op)
        for k in added:
            rmap.pop(k)
    _unreserve_routes(st, added)
    _restore(st, where, rmap, saved, copy, nid, old)
    return None


def _reroute_within_capacity(st: RouteState, where, saved) -> tuple[dict, bool]:
    """Route the ripped-up edges `saved` strictly within capacity (`quick_route`), reserving as
    it goes; (routes added, all routed). Stops at the first edge that does not route."""
    kernel = st.kernel
    added = {}
    for key in saved:
        src, dst = where[(key[0], key[1])], where[(key[0], key[2])]
        if is_immediate(kernel, key[1]):
            if dst.time < src.time + src.latency:
                return added, False
            added[key] = ((dst.pe,), src.time + src.latency, [])
            continue
        fl = st.flits[key[1]]
        got = st.quick_route(src.pe, src.time + src.latency, dst.pe, dst.time, fl,
                             (key[0], key[1]), None)
        if got is None:
            return added, False
        keys = st.link_keys(got[0], got[1], fl)
        st.reserve(keys, (key[0], key[1]))
        added[key] = (got[0], got[1], keys)
    return added, True
