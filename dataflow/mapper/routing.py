"""Routing on the PE array: the interconnect graph, distances, and the reservation state of one
(copies, II) attempt with PathFinder costs (McMurchie & Ebeling, FPGA 1995).

A link carries `links_per_direction` values per cycle; a value of w words crosses a link of
width W in ceil(w / W) flits, one per cycle (wormhole: the hop latency applies to the head flit,
the tail arrives ceil(w / W) - 1 cycles later); a value multicast to several consumers rides a
link once. Each (link, slot) costs (1 + history) x (1 + present_factor x overuse).

Nothing here grows with the array before it is used: hop counts come in closed form from the
mesh / torus / skip-hop geometry (`hop`), shortest paths and the Dijkstra search visit only PEs
on or near the route, and a `RouteState`'s neighbour and link tables fill in as routes touch
PEs, so routing work follows the PEs a kernel uses, not the PEs the array has.
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

Link = tuple[tuple[int, int], tuple[int, int]]

# cost per cycle a route waits before departing: a tie-breaker, far below one link's cost, so of
# equally cheap routes the earliest departure wins
DEPART_DELAY_COST = 0.01
# cost of a flit that rides one of the same value already on that (link, slot) (multicast): not
# zero, so of two shared routes the shorter still wins
SHARED_FLIT_COST = 0.05
_NOTHING_PENDING: dict = {}  # a search's `extra` when the caller has none (never written)


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


def _geometry(arch: ArchSpec) -> tuple:
    """(rows, columns, torus?, skip-hop strides largest first): what decides the links, as a
    small tuple that is cheap to hash (hashing the whole `ArchSpec` per PE dominated the
    searches)."""
    return (arch.pe_array.rows, arch.pe_array.cols,
            arch.interconnect.topology == Topology.TORUS,
            tuple(sorted(arch.interconnect.skip_hop_strides, reverse=True)))


@functools.lru_cache(maxsize=1 << 17)
def _grid_neighbours(geo: tuple, pe: tuple[int, int], cols_first: bool = False) -> tuple:
    rows, cols, torus, strides = geo
    r, c = pe
    out = []
    for stride in (*strides, 1):
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


def _neighbours(arch: ArchSpec, pe: tuple[int, int], cols_first: bool = False) -> tuple:
    """The PEs one link away from `pe`, largest stride first, rows before columns (columns
    first with `cols_first`)."""
    return _grid_neighbours(_geometry(arch), pe, cols_first)


@functools.lru_cache(maxsize=65536)
def shortest_path(arch: ArchSpec, src: tuple[int, int], dst: tuple[int, int],
                  cols_first: bool = False) -> tuple:
    """PEs from src to dst over the interconnect (BFS; rows-first or columns-first ties).
    Cached: `ArchSpec` is frozen and hashable. The search steps only to PEs one hop nearer
    to dst (`hop`), so it visits the PEs on shortest routes, not every PE nearer to src than
    dst: the same path as the plain BFS (a PE on a shortest route is first reached from
    another one), found in time independent of the array's size."""
    if src == dst:
        return (src,)
    geo = _geometry(arch)
    rows_from, cols_from = _line_tables(arch)
    to_row, to_col = rows_from(dst[0]), cols_from(dst[1])
    prev = {src: None}
    frontier = [src]
    while frontier:
        nxt = []
        for pe in frontier:
            closer = to_row[pe[0]] + to_col[pe[1]] - 1
            for nb in _grid_neighbours(geo, pe, cols_first):
                if nb not in prev and to_row[nb[0]] + to_col[nb[1]] == closer:
                    prev[nb] = pe
                    if nb == dst:
                        path = [dst]
                        while prev[path[-1]] is not None:
                            path.append(prev[path[-1]])
                        return tuple(path[::-1])
                    nxt.append(nb)
        frontier = nxt
    raise MappingError(f"no route from PE {src} to PE {dst}")


# -- distances ------------------------------------------------------------------------------------
#
# Every link moves a value along one axis by +-1 or +-a skip-hop stride (wrapping on a torus,
# bounded by the edges on a mesh), and which moves exist along the rows does not depend on the
# column (nor the other way round): the interconnect is the Cartesian product of a row line and
# a column line, so the hops between two PEs are the row line's distance plus the column line's.
# Without skip hops a line's distance is |x - y| (mesh) or min(|x - y|, n - |x - y|) (torus);
# with them it is a breadth-first search over the n positions of that one line (exact for any
# strides, at the edges too), n entries per starting row or column: never a PE x PE table.


@functools.lru_cache(maxsize=8192)
def line_hops(n: int, strides: tuple[int, ...], wrap: bool, x: int) -> tuple[int, ...]:
    """Hops from position x to every position of a line of n PEs whose links step +-1 and
    +-each stride (`wrap`: modulo n, a torus; else within [0, n), a mesh)."""
    if not strides:
        if wrap:
            return tuple(min(abs(y - x), n - abs(y - x)) for y in range(n))
        return tuple(abs(y - x) for y in range(n))
    steps = sorted({s for stride in (1, *strides) for s in (stride, -stride)})
    dist = [-1] * n
    dist[x] = 0
    frontier = [x]
    while frontier:
        nxt = []
        for p in frontier:
            for s in steps:
                q = (p + s) % n if wrap else p + s
                if 0 <= q < n and dist[q] < 0:
                    dist[q] = dist[p] + 1
                    nxt.append(q)
        frontier = nxt
    return tuple(dist)


def _line_tables(arch: ArchSpec):
    """(row line, column line): `line_hops` with the array's row and column geometry bound."""
    ic = arch.interconnect
    strides = tuple(sorted(set(ic.skip_hop_strides)))
    wrap = ic.topology == Topology.TORUS
    return (functools.partial(line_hops, arch.pe_array.rows, strides, wrap),
            functools.partial(line_hops, arch.pe_array.cols, strides, wrap))


def hop(arch: ArchSpec, a: tuple[int, int], b: tuple[int, int]) -> int:
    """Hop count of the shortest route from PE a to PE b (the interconnect's graph distance),
    in closed form over the mesh, torus and skip-hop geometry: row-line plus column-line
    distance (see `line_hops`)."""
    rows_from, cols_from = _line_tables(arch)
    return rows_from(a[0])[b[0]] + cols_from(a[1])[b[1]]


def hop_distance(arch: ArchSpec) -> dict:
    """All-pairs hop counts, {a: {b: hops}}: O(PEs^2), for tests and small arrays only (the
    mapper asks `hop` for the pairs it needs)."""
    pes = [(r, c) for r in range(arch.pe_array.rows) for c in range(arch.pe_array.cols)]
    return {a: {b: hop(arch, a, b) for b in pes} for a in pes}


def ball(arch: ArchSpec, centre: tuple[int, int]):
    """The PEs around `centre` layer by layer: yields, for d = 0, 1, 2, ..., the list of PEs
    exactly d hops away (breadth-first over the links), until the array is exhausted. Visits
    only as many PEs as the caller consumes layers for."""
    geo = _geometry(arch)
    seen = {centre}
    layer = [centre]
    while layer:
        yield layer
        nxt = []
        for pe in layer:
            for nb in _grid_neighbours(geo, pe):
                if nb not in seen:
                    seen.add(nb)
                    nxt.append(nb)
        layer = nxt


class _Neighbours(dict):
    """PE -> ((neighbour, link id), ...), filled on first use. A link's id is
    (PE index) x (most links a PE can have) + its position among the PE's links: the same
    link gets the same id in every `RouteState` of an array (the congestion history carries
    over between placement attempts), and no per-array table is built up front."""

    def __init__(self, arch: ArchSpec):
        super().__init__()
        self.arch = arch
        self.cols = arch.pe_array.cols
        self.width = 4 * (len(set(arch.interconnect.skip_hop_strides)) + 1)
        self.ids: dict[Link, int] = {}

    def __missing__(self, pe):
        base = (pe[0] * self.cols + pe[1]) * self.width
        out = self[pe] = tuple((nb, base + j) for j, nb in enumerate(_neighbours(self.arch, pe)))
        return out

    def link_id(self, link: Link) -> int:
        got = self.ids.get(link)
        if got is None:
            got = next((lid for nb, lid in self[link[0]] if nb == link[1]), None)
            if got is None:
                raise MappingError(f"no link from PE {link[0]} to PE {link[1]}")
            self.ids[link] = got
        return got

    def link_of(self, lid: int) -> Link:
        pe = divmod(lid // self.width, self.cols)
        return pe, _neighbours(self.arch, pe)[lid % self.width]


class _IntNeighbours(dict):
    """PE index (row x cols + column) -> ((neighbour's index, link id x II, its row, its
    column), ...): `_Neighbours` for the router's int states at one II (link id x II + slot
    is a (link, slot) key), filled on first use."""

    def __init__(self, nbrs: _Neighbours, ii: int):
        super().__init__()
        self.nbrs, self.cols, self.ii = nbrs, nbrs.cols, ii

    def __missing__(self, i):
        cols, ii = self.cols, self.ii
        out = self[i] = tuple((nb[0] * cols + nb[1], lid * ii, nb[0], nb[1])
                              for nb, lid in self.nbrs[divmod(i, cols)])
        return out


class RouteState:
    """Reservation tables and PathFinder costs for one (copies, II) attempt."""

    def __init__(self, kernel: Kernel, arch: ArchSpec, ii: int):
        self.kernel, self.arch, self.ii = kernel, arch, ii
        self.hop = arch.interconnect.hop_latency_cycles
        self.cap = arch.interconnect.links_per_direction
        self.flits = value_flits(kernel, arch)
        self.rows_from, self.cols_from = _line_tables(arch)
        # (PE, slot) -> ops issued there: at most `issue_width`, each on its own unit (`fu`)
        # (docs/architecture.md#issue-width)
        self.width = arch.pe_array.issue_width
        self.slots: dict[tuple[tuple[int, int], int], int] = {}
        self.fu: dict[tuple[tuple[int, int], str, int], tuple[int, int]] = {}
        # (link, slot) -> {value: routes using it}; a link carries each value once per cycle
        # however many consumers downstream share it (multicast), so occupancy = distinct values
        self.carry: dict = {}
        # kept with `carry` by reserve / unreserve: the total overuse, the overused keys, and
        # each key's position in `carry` (keys are never removed), so `overused` lists them in
        # carry's order without scanning every (link, slot)
        # (docs/planning_speed.md#router-and-repair-bookkeeping)
        self.over_total = 0
        self.over_keys: set = set()
        self.seq: dict = {}
        self.history: Counter = Counter()
        self.present_factor = 0.5
        self.entries: Counter = Counter()
        self.paths_cache: dict = {}
        self.lids_cache: dict = {}  # path -> link ids along it
        # links as small ints so (link, slot) keys are ints (link_id * II + slot): hashing
        # nested tuples dominated the route search; PE -> ((neighbour, link id), ...), lazily
        self.nbrs = _Neighbours(arch)
        self.cols = arch.pe_array.cols
        self.int_nbrs = _IntNeighbours(self.nbrs, ii)

    def hops(self, a: tuple[int, int], b: tuple[int, int]) -> int:
        """`hop(arch, a, b)`."""
        return self.rows_from(a[0])[b[0]] + self.cols_from(a[1])[b[1]]

    # -- FU slots -------------------------------------------------------------------------------
    def fu_keys(self, pe, t, op: Op):
        fu = self.arch.fu_for(op.value)
        return [(pe, fu.name, (t + j) % self.ii) for j in range(fu.issue_interval_cycles)]

    def slot_free(self, pe, t, op: Op) -> bool:
        """Whether `op` may issue on `pe` at t: the PE issues fewer than `issue_width` ops in
        slot t mod II, and op's unit is free for its issue interval."""
        if self.slots.get((pe, t % self.ii), 0) >= self.width:
            return False
        return not any(k in self.fu for k in self.fu_keys(pe, t, op))

    def occupy(self, pe, t, op: Op, who) -> None:
        key = (pe, t % self.ii)
        self.slots[key] = self.slots.get(key, 0) + 1
        for k in self.fu_keys(pe, t, op):
            self.fu[k] = who
        self.entries[pe] += 1

    def release(self, pe, t, op: Op) -> None:
        key = (pe, t % self.ii)
        if self.slots[key] == 1:
            del self.slots[key]
        else:
            self.slots[key] -= 1
        for k in self.fu_keys(pe, t, op):
            del self.fu[k]
        self.entries[pe] -= 1

    # -- links ----------------------------------------------------------------------------------
    def path_lids(self, path) -> list[int]:
        """The link ids along `path`, kept per path for this attempt."""
        got = self.lids_cache.get(path)
        if got is None:
            lid = self.nbrs.link_id
            got = self.lids_cache[path] = [lid(link) for link in pairwise(path)]
        return got

    def link_keys(self, path, depart, flits):
        ii, hop = self.ii, self.hop
        return [lid * ii + (depart + h * hop + j) % ii
                for h, lid in enumerate(self.path_lids(path)) for j in range(flits)]

    def describe(self, key) -> tuple:
        """(link, slot) of an int (link, slot) key."""
        return self.nbrs.link_of(key // self.ii), key % self.ii

    def arrival(self, hops: int, depart: int, flits: int) -> int:
        return depart + hops * self.hop + (flits - 1 if hops else 0)

    def reserve(self, keys, value) -> None:
        carry, cap = self.carry, self.cap
        for k in keys:
            c = carry.get(k)
            if c is None:
                c = carry[k] = Counter()
                self.seq[k] = len(self.seq)
            if value not in c and len(c) >= cap:  # one more distinct value, over capacity
                self.over_total += 1
                self.over_keys.add(k)
            c[value] += 1

    def unreserve(self, keys, value) -> None:
        cap = self.cap
        for k in keys:
            c = self.carry[k]
            c[value] -= 1
            if not c[value]:
                del c[value]
                if len(c) >= cap:  # it was over capacity by one more
                    self.over_total -= 1
                if len(c) <= cap:
                    self.over_keys.discard(k)

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
        """(link, slot) key -> values beyond capacity, for the overused keys in `carry`'s
        order."""
        carry, cap = self.carry, self.cap
        return {k: len(carry[k]) - cap for k in sorted(self.over_keys, key=self.seq.__getitem__)}

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
            lids, ii, hop, new_flit = self.path_lids(path), self.ii, self.hop, self.new_flit
            for depart in range(ready, min(last, ready + ii - 1) + 1):
                # `fits(link_keys(path, depart, flits))`, stopping at the first key over
                # capacity (the same keys in the same order)
                if all((o := new_flit(lid * ii + (depart + h * hop + j) % ii, value, extra))
                       is None or o <= 0
                       for h, lid in enumerate(lids) for j in range(flits)):
                    return path, depart
        return None

    def search_route(self, src_pe, ready, dst_pe, t, flits, strict: bool, value, extra=None):
        """Cheapest route in the time-expanded graph (Dijkstra), any path and departure that
        arrives by t. Cost per (link, slot): (1 + history) x (1 + present_factor x overuse);
        strict forbids overuse. Returns (path, depart, cost) or None."""
        hop, ii = self.hop, self.ii
        best = None
        # a step's price depends on its link and its head's slot only, and nothing it reads
        # changes during this call: priced once for every departure (docs/planning_speed.md)
        steps: dict = {}
        for depart in range(ready, ready + min(ii, max(1, t - ready + 1))):
            max_hops = (t - depart - (flits - 1)) // hop
            if self.hops(src_pe, dst_pe) > max_hops:
                break
            if src_pe == dst_pe:
                return (src_pe,), depart, 0.0
            start_cost = DEPART_DELAY_COST * (depart - ready)
            got = self._cheapest_path(src_pe, dst_pe, depart, start_cost, max_hops, flits,
                                      strict, value, extra, steps,
                                      math.inf if best is None else best[2])
            if got is not None and (best is None or got[1] < best[2]):
                best = (got[0], depart, got[1])
        return best

    def _cheapest_path(self, src_pe, dst_pe, depart, start_cost, max_hops, flits, strict,
                       value, extra, steps=None, bound=math.inf):
        """Dijkstra over (PE, hops) for one departure cycle, at most `max_hops` hops;
        (path, cost) or None when dst_pe is not reached at a cost below `bound` (the cost of
        an earlier departure's route, which only a cheaper one replaces: states at `bound` or
        above are never pushed, and every state below it is popped in the order it was).

        The innermost loop of the mapper (issue 14; docs/planning_speed.md): `_hop_cost` is
        inlined with the state in locals, a step is priced once per (link, head slot) (the
        carried values, history and `extra` do not change during one search; `steps` may be
        shared by the departures of one `search_route`), and a PE is the int
        row x cols + column, a state the int PE x (max_hops + 1) + hops: the heap orders
        (cost, hops, PE) as it ordered (cost, hops, (row, column)), and the floating-point
        operations are the same in the same order, so the paths and costs are those of the
        plain loop."""
        cols = self.cols
        span = max_hops + 1
        seen: dict = {}
        # hops left to dst_pe from each row and column (distances are symmetric)
        to_row, to_col = self.rows_from(dst_pe[0]), self.cols_from(dst_pe[1])
        src_i, dst_i = src_pe[0] * cols + src_pe[1], dst_pe[0] * cols + dst_pe[1]
        heap = [(start_cost, 0, src_i)]
        prev = {src_i * span: -1}
        table, hop, ii, cap = self.int_nbrs, self.hop, self.ii, self.cap
        carry_get, hist_get, present = self.carry.get, self.history.get, self.present_factor
        extra_get = (extra or _NOTHING_PENDING).get
        if steps is None:
            steps = {}  # lid x II + head slot -> step cost, or None where strict forbids it
        inf, heappop, heappush = math.inf, heapq.heappop, heapq.heappush
        while heap:
            cost, h, pi = heappop(heap)
            if pi == dst_i:
                return _backtrack_ints(prev, pi * span + h, span, cols), cost
            here = pi * span + h
            if h >= max_hops or seen.get(here, inf) < cost:
                continue
            left = max_hops - h - 1
            slot = (depart + h * hop) % ii
            h1 = h + 1
            for nb_i, lbase, nr, nc in table[pi]:
                if to_row[nr] + to_col[nc] > left:
                    continue
                sk = lbase + slot
                step = steps.get(sk, -1.0)
                if step == -1.0:
                    # `_hop_cost`, inlined; within capacity the factor
                    # (1 + present x max(0, over)) is exactly 1.0 and is left out
                    step = 0.0
                    for j in range(flits):
                        k = lbase + (slot + j) % ii
                        held, pending = carry_get(k, ()), extra_get(k, ())
                        if value in held or value in pending:
                            step += SHARED_FLIT_COST
                            continue
                        over = len(held) + len(pending) + 1 - cap
                        if over > 0:
                            if strict:
                                step = None
                                break
                            step += (1.0 + hist_get(k, 0)) * (1.0 + present * over)
                        else:
                            step += 1.0 + hist_get(k, 0)
                    steps[sk] = step
                if step is None:
                    continue
                c2 = cost + step
                if c2 >= bound:
                    continue
                nk = nb_i * span + h1
                if c2 < seen.get(nk, inf):
                    seen[nk] = c2
                    prev[nk] = here
                    heappush(heap, (c2, h1, nb_i))
        return None

    def _hop_cost(self, lid, head, flits, strict: bool, value, extra) -> float | None:
        """PathFinder cost of `value`'s flits crossing link `lid` from cycle `head` on; None
        when strict and a flit would overuse its (link, slot). (`_cheapest_path` inlines it.)"""
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


def _backtrack_ints(prev, state: int, span: int, cols: int) -> tuple:
    """The PEs from the search's start to `state` (PE x span + hops), following `prev`."""
    path = []
    while state != -1:
        path.append(divmod(state // span, cols))
        state = prev[state]
    return tuple(path[::-1])
