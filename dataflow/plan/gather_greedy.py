"""The greedy of the line-aware gather order (`gather_lines.py`,
docs/conventions.md#gather-lines): within each row of the sparse loop, the slot issued next
takes the not-yet-placed nonzero whose gathered rows land on the least loaded SPM lines of
their cycles, then rounds of swaps within rows. Written as plain loops over numpy arrays so
that numba compiles it (`_jit`, on first use); below `PY_MAX_WORK` of work in a process
without numba it runs in Python (`_runner`: a small job does not pay numba's import).
"""

from __future__ import annotations

import functools
import sys

# Deferred imports: numba is imported by `_jit`, on first use (start-up).

#: weight of one stall cycle in a cycle's cost (`_cycle_cost`)
BIG = 1 << 20
#: weight of a read beyond the ports against the sum of squared reads per line (balance)
BALANCE = 1 << 10


def _touch1(cnt, k, r, sign, gcyc, goff, gwidth, gstride, stride, wpr, lut):
    """Add (sign 1) or remove (-1) the row reads of iteration k's gathers at index r."""
    for g in range(gcyc.shape[1]):
        c = gcyc[k, g]
        a = goff[k, g] + stride * r
        reach = (gwidth[g] - 1) * gstride[g]
        if 0 <= reach < wpr:  # within a row or two: the first lane's and the last's
            row, last = a // wpr, (a + reach) // wpr
            cnt[c, lut[row]] += sign
            if last != row:
                cnt[c, lut[last]] += sign
            continue
        prev = -1
        for lane in range(gwidth[g]):
            row = (a + lane * gstride[g]) // wpr
            if row != prev:
                prev = row
                cnt[c, lut[row]] += sign


def _cycle_cost(cnt, wcnt, c, rp, wp):
    """BIG x the stall cycles of cycle c (`spm/lines.py:port_cycles`), then the reads beyond
    the ports on its lines (a smoother second key), then the sum of squared reads per line
    (spare ports kept spread over the lines, for the gathers placed after)."""
    most_r, most_w, over, square = 0, 0, 0, 0
    for ln in range(cnt.shape[1]):
        x = cnt[c, ln]
        square += x * x
        if x > most_r:
            most_r = x
        if x > rp:
            over += x - rp
        if wcnt[c, ln] > most_w:
            most_w = wcnt[c, ln]
    top = max((most_r + rp - 1) // rp, (most_w + wp - 1) // wp, 1)
    return BIG * (top - 1) + BALANCE * over + square


def _touch(cnt, k, r, sign, gcyc, goff, gwidth, gstride, stride, wpr, lut, nxt):
    """`_touch1` over iteration k and the iterations after it that read the same slot."""
    while k >= 0:
        _touch1(cnt, k, r, sign, gcyc, goff, gwidth, gstride, stride, wpr, lut)
        k = nxt[k]


def _iter_cost(cnt, wcnt, k, gcyc, rp, wp, nxt):
    """`_cycle_cost` of the cycles of iteration k's gathers and of those after it that read
    the same slot."""
    total = 0
    while k >= 0:
        for g in range(gcyc.shape[1]):
            if g == 0 or gcyc[k, g] != gcyc[k, g - 1]:
                total += _cycle_cost(cnt, wcnt, gcyc[k, g], rp, wp)
        k = nxt[k]
    return total


def _order_tile(order, slot, lo, hi, k_of, crd, gcyc, goff, gwidth, gstride, stride, wpr,
                lut, cnt, wcnt, rp, wp, perm, used, nxt, head, passes, tries):
    """The greedy of `line_order` over one tile, then `passes` rounds of swaps within rows
    that shorten stalled cycles (see the module docstring); fills `perm` (slot -> nonzero).
    The consecutive iterations that read one slot (loops inside the sparse one: an SDDMM's
    chunks) are placed together: `head` marks the first, `nxt` links each to the next."""
    for t in range(order.shape[0]):
        k = order[t]
        if not head[k]:  # an iteration after the first of its slot's run: counted with it
            continue
        s = slot[k]
        if perm[s] < 0:
            best, best_cost = -1, BIG * BIG
            for q in range(lo[s], hi[s]):
                if used[q]:
                    continue
                _touch(cnt, k, crd[q], 1, gcyc, goff, gwidth, gstride, stride, wpr, lut, nxt)
                cost = _iter_cost(cnt, wcnt, k, gcyc, rp, wp, nxt)
                _touch(cnt, k, crd[q], -1, gcyc, goff, gwidth, gstride, stride, wpr, lut, nxt)
                if cost < best_cost:
                    best, best_cost = q, cost
            perm[s] = best
            used[best] = True
        _touch(cnt, k, crd[perm[s]], 1, gcyc, goff, gwidth, gstride, stride, wpr, lut, nxt)
    trials = 0
    for _ in range(passes):
        moved = 0
        for t in range(order.shape[0]):
            k = order[t]
            s = slot[k]
            if k_of[s] != k or _iter_cost(cnt, wcnt, k, gcyc, rp, wp, nxt) < BIG:
                continue
            width = hi[s] - lo[s]
            for step in range(1, min(width, tries + 1)):  # the next slots of the row, round
                s2 = lo[s] + (s - lo[s] + step) % width
                k2 = k_of[s2]
                if k2 < 0:
                    continue
                trials += 1
                before = _iter_cost(cnt, wcnt, k, gcyc, rp, wp, nxt) \
                    + _iter_cost(cnt, wcnt, k2, gcyc, rp, wp, nxt)
                a, b = crd[perm[s]], crd[perm[s2]]
                _touch(cnt, k, a, -1, gcyc, goff, gwidth, gstride, stride, wpr, lut, nxt)
                _touch(cnt, k2, b, -1, gcyc, goff, gwidth, gstride, stride, wpr, lut, nxt)
                _touch(cnt, k, b, 1, gcyc, goff, gwidth, gstride, stride, wpr, lut, nxt)
                _touch(cnt, k2, a, 1, gcyc, goff, gwidth, gstride, stride, wpr, lut, nxt)
                after = _iter_cost(cnt, wcnt, k, gcyc, rp, wp, nxt) \
                    + _iter_cost(cnt, wcnt, k2, gcyc, rp, wp, nxt)
                if after < before:
                    perm[s], perm[s2] = perm[s2], perm[s]
                    moved += 1
                    if _iter_cost(cnt, wcnt, k, gcyc, rp, wp, nxt) < BIG:
                        break
                    continue
                _touch(cnt, k, b, -1, gcyc, goff, gwidth, gstride, stride, wpr, lut, nxt)
                _touch(cnt, k2, a, -1, gcyc, goff, gwidth, gstride, stride, wpr, lut, nxt)
                _touch(cnt, k, a, 1, gcyc, goff, gwidth, gstride, stride, wpr, lut, nxt)
                _touch(cnt, k2, b, 1, gcyc, goff, gwidth, gstride, stride, wpr, lut, nxt)
        if not moved:
            break
    return trials


#: the greedy in Python, as written (`_runner`)
_PY_ORDER = _order_tile
#: below this much work (iterations x the longest row) the greedy runs in Python while numba
#: is not loaded (start-up, issue 14: a small job does not pay numba's import)
PY_MAX_WORK = 3_000


#: the Python work done so far in this process: the budget is the process's, not a tile's (eight
#: tiles of 20,000 each took 11 s in Python, against numba's ~0.5 s load)
_PY_SPENT = [0]


def _runner(work: int):
    if _PY_SPENT[0] + work <= PY_MAX_WORK and "numba" not in sys.modules:
        _PY_SPENT[0] += work
        return _PY_ORDER
    return _jit()


@functools.cache
def _jit():
    """The greedy and its helpers compiled (numba is loaded on first use: start-up)."""
    import numba

    g = globals()
    for name in ("_touch1", "_cycle_cost", "_touch", "_iter_cost", "_order_tile"):  # callees first
        g[name] = numba.njit(cache=True)(g[name])
    return g["_order_tile"]
