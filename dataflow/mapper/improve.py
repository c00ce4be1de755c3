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


def repair_placement(st: RouteState, where, routes, rng: random.Random, moves: int = REPAIR_MOVES) -> bool:
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



def anneal(kernel: Kernel, arch: ArchSpec, ii: int, placements, routes, seed: int = 0,
           moves: int = 2000, temperature: float = 2.0):
    """Simulated annealing over node positions at fixed II: cost = schedule length x 16 +
    link hops. A move re-places one node of one copy (another PE within two hops, another time
    within its dependence window) and reroutes its edges strictly within capacity; worse states
    are accepted with probability exp(-delta / T), T falling linearly to 0. Returns the best
    (placements, routes) seen — never worse than the input."""
    rng = random.Random(seed)
    st = RouteState(kernel, arch, ii)
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
