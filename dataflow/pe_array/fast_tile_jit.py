"""The batched memo-hit pass (`fast_tile.py`) as compiled loops over nodes and iterations.

Numpy's batched pass still makes several calls per node over (iterations, lanes) arrays; this
module computes the same values in one numba call per kernel: node by node in id order
(inputs before users), each in one tight loop over every iteration and lane. The arithmetic
is `semantics.apply_op`'s in float32, each result rounded to float32 as it is made (a MAC's
product, then its add: no fused multiply-add; numba contracts nothing without fastmath),
dead lanes of a load read as 0 as `fast._gather` zeroes them (a VSUM adds them), a maximum
as np.maximum (NaN wins, the first operand on ties). An exp is numpy's (its float32 bits are
numpy's own SIMD exp, which numba's need not share): the loop runs the nodes before it,
numpy the exp on that node's row, the loop the nodes after. Accumulators fold in a register
per node, flushed where lane 0's word or the copy changes and at every tile's end
(`fast._flushes`). The updates then commit in one more compiled loop (`commit`) in
`semantics.commit_order`, each as `semantics.commit` applies it. Loads read one image of the
kernel's read-only buffers (float32 when every value is exact there, else float64).
docs/architecture.md#batched-memo-hits.
"""

from __future__ import annotations

import functools
from collections import OrderedDict

import numpy as np

from dataflow.dfg.ops import Op
from dataflow.pe_array import fast

_ARITH = {Op.CONST: 0, Op.MUL: 2, Op.ADD: 3, Op.SUB: 4, Op.MAC: 5, Op.MAX: 6, Op.DIV: 7,
          Op.VSUM: 8, Op.ROUTE: 9, Op.BFLY: 10}
_LOAD, _ACC, _STORE, _EXP = 1, 11, 12, 13
#: mask kinds of a memory node: one lane, the iteration's live lanes, the first `span`
_SCALAR, _ACTIVE, _SPAN = 0, 1, 2


@functools.cache
def _compiled():
    import numba

    g = globals()  # callees first, so the caller compiles against them (as gather_greedy._jit)
    for name in ("_memory_node", "_lane_sum_node", "_arith_node", "_batch_loops"):
        g[name] = numba.njit(cache=True, error_model="numpy")(g[name])
    return g["_batch_loops"]


def program(ctx, shape_of) -> dict | None:
    """The kernel as arrays for `_batch_loops`, or None where it cannot run compiled."""
    kernel = ctx.km.kernel
    if np.dtype(ctx.dtype) != np.float32:
        return None
    nodes = kernel.nodes
    nn = len(nodes)
    op = np.zeros(nn, np.int64)
    ins = np.full((nn, 3), -1, np.int64)
    lane = np.full(nn, -1, np.int64)
    cval = np.zeros(nn, np.float32)
    cneg = np.zeros(nn, np.int64)
    width = np.ones(nn, np.int64)
    mterm = np.zeros(nn, np.int64)
    mconst = np.zeros(nn, np.int64)
    istride = np.zeros(nn, np.int64)
    lstride = np.zeros(nn, np.int64)
    mkind = np.zeros(nn, np.int64)
    span = np.zeros(nn, np.int64)
    bufid = np.zeros(nn, np.int64)
    slot = np.full(nn, -1, np.int64)
    accmax = np.zeros(nn, np.int64)
    terms: dict = {}
    buffers: dict = {}
    writers = []
    for n in nodes:
        j = n.id
        if j != nodes.index(n) or any(i >= j for i in n.inputs) or len(n.inputs) > 3:
            return None
        ins[j, :len(n.inputs)] = n.inputs
        if n.lane is not None:
            if width[n.inputs[0]] <= 1:
                return None
            lane[j] = n.lane
        if not n.op.is_memory:
            if n.op is Op.EXP:  # numpy's own (SIMD) exp, between compiled node ranges
                op[j] = _EXP
                width[j] = width[n.inputs[0]]
                continue
            if n.op not in _ARITH:
                return None
            op[j] = _ARITH[n.op]
            if n.op is Op.CONST:
                cval[j] = np.float32(n.value)
                width[j] = 1
            elif n.op is Op.VSUM:
                width[j] = 1
            else:
                ws = [1 if (k == 0 and n.lane is not None) else width[i]
                      for k, i in enumerate(n.inputs)]
                width[j] = max(ws) if ws else 1
            cneg[j] = n.op is Op.MAC and n.value < 0
            if n.op is Op.BFLY:
                cval[j] = np.float32(n.value)
            continue
        w_, s_ = shape_of(ctx, n)
        width[j], lstride[j] = w_, s_
        mterm[j] = terms.setdefault(fast._affine_terms(ctx, n), len(terms))
        mconst[j] = n.addr.const
        istride[j] = n.addr.index_stride
        mkind[j] = _SCALAR if n.id not in ctx.vec else (_SPAN if n.addr.span else _ACTIVE)
        span[j] = n.addr.span or 0
        if n.op in (Op.LOAD, Op.GATHER):
            op[j] = _LOAD
            bufid[j] = buffers.setdefault(n.buffer, len(buffers))
        else:
            op[j] = _ACC if n.op.accumulates else _STORE
            if n.op is Op.MACC and len(n.inputs) != 2:
                return None
            accmax[j] = n.op is Op.ACC_MAX
            slot[j] = len(writers)
            writers.append(n)
        if n.addr.index_stride and op[nodes[n.inputs[0]].id] != _LOAD:
            return None
    return {"op": op, "ins": ins, "lane": lane, "cval": cval, "cneg": cneg, "width": width,
            "mterm": mterm, "mconst": mconst, "istride": istride, "lstride": lstride,
            "mkind": mkind, "span": span, "bufid": bufid, "slot": slot, "accmax": accmax,
            "terms": list(terms), "buffers": list(buffers), "writers": writers,
            "macc": np.array([n.op is Op.MACC for n in nodes], np.int64)}


def image(prog: dict, bufs: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(image of the loaded buffers end to end, each one's offset): float32 when every value
    is exact there (float32 buffers, integers below 2^24), else float64; None when a
    buffer's values are not exact in float64 (an integer of 2^53 or more, another dtype)."""
    parts, offs, at = [], [], 0
    narrow = True
    for name in prog["buffers"]:
        b = np.asarray(bufs[name])
        if b.ndim != 1 or b.dtype.kind not in "fiu" or (b.dtype.kind == "f" and b.itemsize > 8):
            return None
        if b.dtype.kind in "iu" and len(b):
            top = int(np.abs(b).max())
            if top >= 1 << 53:
                return None
            narrow &= top < 1 << 24
        else:
            narrow &= b.dtype == np.float32
        parts.append(b)
        offs.append(at)
        at += len(b)
    img = (np.concatenate(parts).astype(np.float32 if narrow else np.float64) if parts
           else np.zeros(0, np.float32))
    return img, np.array(offs + [at], np.int64)


#: scratch arrays by (name, shape), reused across passes (fresh pages of a few MB cost their
#: page faults each call, and freeing them as much); every entry is written before it is
#: read; at most `SCRATCH_BYTES` held, the least recently used dropped first
_SCRATCH: OrderedDict = OrderedDict()
SCRATCH_BYTES = 64 << 20


def _scratch(name: str, shape: tuple, dtype) -> np.ndarray:
    key = (name, shape)
    got = _SCRATCH.get(key)
    if got is None:
        got = _SCRATCH[key] = np.empty(shape, dtype)
        held = sum(a.nbytes for a in _SCRATCH.values())
        while held > SCRATCH_BYTES and len(_SCRATCH) > 1:
            _, old = _SCRATCH.popitem(last=False)
            held -= old.nbytes
    else:
        _SCRATCH.move_to_end(key)
    return got


def run(prog: dict, img, offs, aff, active, copy, tile_end, lanes: int):
    """Run the compiled pass: per writer, its lane-0 words (iterations), its flushed registers
    or stored values, and for an accumulator the iterations it flushed at. The arrays are
    scratch, valid until the next pass."""
    n = aff.shape[1]
    nw, nn = len(prog["writers"]), len(prog["op"])
    vals = _scratch("vals", (nw, n, lanes), np.float32)
    sel = _scratch("sel", (nw, n), np.int64)
    cnt = np.zeros(nw, np.int64)
    a0w = _scratch("a0w", (nw, n), np.int64)
    v = _scratch("v", (nn, n, lanes), np.float32)
    a0 = _scratch("a0", (nn, n), np.int64)
    op = prog["op"]
    start = 0
    for j in [*np.flatnonzero(op == _EXP).tolist(), nn]:  # compiled runs of nodes, exp between
        if j > start:
            _compiled()(op, prog["ins"], prog["lane"], prog["cval"], prog["cneg"],
                        prog["width"], prog["mterm"], prog["mconst"], prog["istride"],
                        prog["lstride"], prog["mkind"], prog["span"], prog["bufid"],
                        prog["slot"], prog["accmax"], prog["macc"], aff, active, copy, tile_end,
                        img, offs, lanes, vals, sel, cnt, a0w, v, a0, start, j)
        if j < nn:  # `semantics.apply_op`'s np.exp on a contiguous float32 array
            wj = prog["width"][j]
            v[j, :, :wj] = np.exp(np.ascontiguousarray(v[prog["ins"][j, 0], :, :wj]))
        start = j + 1
    return vals, sel, cnt, a0w


#: how a writer's update combines with the word: add, maximum, overwrite (`semantics.commit`)
_ADD, _MAX, _PUT = 0, 1, 2


def commit(order, slot, row, at, prog: dict, names: list, shape, offs, a0w, vals, active,
           img) -> None:
    """Apply the pass's updates to `img` (the written buffers end to end, `offs` apart) in
    `order`: update u is writer slot[u]'s row[u] of `vals` at iteration at[u]."""
    ws = prog["writers"]
    kind = np.array([_MAX if w.op is Op.ACC_MAX else (_ADD if w.op.accumulates else _PUT)
                     for w in ws], np.int64)
    wbuf = np.array([names.index(w.buffer) for w in ws], np.int64)
    slots = prog["slot"]
    ids = [w.id for w in ws]
    assert all(slots[i] == s for s, i in enumerate(ids))
    _compiled_commit()(order, slot, row, at, kind, wbuf, np.ascontiguousarray(shape[:, 0]),
                       np.ascontiguousarray(shape[:, 1]), prog["mkind"][ids],
                       prog["span"][ids], offs, a0w, vals, active, img)


@functools.cache
def _compiled_commit():
    import numba

    return numba.njit(cache=True, error_model="numpy")(_commit_loops)


def _commit_loops(order, slot, row, at, kind, wbuf, width, stride, mkind, span, offs,
                  a0w, vals, active, img):  # pragma: no cover - compiled by numba
    """Each update in order, its live lanes (a prefix) in lane order: add as a rounded float32
    add, maximum as np.maximum (NaN wins, the word on ties), overwrite."""
    for q in range(order.shape[0]):
        u = order[q]
        s, r, e = slot[u], row[u], at[u]
        mk = mkind[s]
        live = 1 if mk == 0 else (active[e] if mk == 1 else span[s])
        base = offs[wbuf[s]] + a0w[s, e]
        kd = kind[s]
        for ln in range(min(live, width[s])):
            a = base + ln * stride[s]
            x = vals[s, r, ln]
            if kd == 0:
                img[a] = np.float32(img[a] + x)
            elif kd == 1:
                c = img[a]
                if not (c >= x or c != c):
                    img[a] = x
            else:
                img[a] = x


def _batch_loops(op, ins, lane, cval, cneg, width, mterm, mconst,
                 istride, lstride, mkind, span, bufid, slot, accmax, macc, aff, active, copy,
                 tile_end, img, offs, lanes, vals, sel, cnt, a0w, v, a0, j0,
                 j1):  # pragma: no cover - compiled by numba
    """Node by node (ids in order: inputs first), each over every iteration and lane: one
    tight loop per node, values kept per (node, iteration, lane) in `v`, lane-0 words in
    `a0` (scratch: a node writes every entry it or a user reads); nodes j0 to j1 - 1."""
    n = aff.shape[1]
    for j in range(j0, j1):
        o = op[j]
        wj = width[j]
        i0, i1, i2 = ins[j, 0], ins[j, 1], ins[j, 2]
        if o == 0:
            for e in range(n):
                v[j, e, 0] = cval[j]
            continue
        if o == 1 or o == 11 or o == 12:  # a memory node: its lane-0 words first
            _memory_node(j, o, wj, i0, i1, i2, ins, lane, width, mterm, mconst, istride,
                         lstride, mkind, span, bufid, slot, accmax, macc, aff, active, copy,
                         tile_end, img, offs, vals, sel, cnt, a0w, v, a0, n)
            continue
        if o == 8:
            _lane_sum_node(j, i0, width, v, n)
            continue
        _arith_node(j, o, wj, i0, i1, i2, lane, cval, cneg, width, v, n)


def _memory_node(j, o, wj, i0, i1, i2, ins, lane, width, mterm, mconst, istride, lstride,  # noqa: C901
                 mkind, span, bufid, slot, accmax, macc, aff, active, copy, tile_end, img, offs,
                 vals, sel, cnt, a0w, v, a0, n):  # pragma: no cover - compiled by numba
    """A load, accumulation or store node of `_batch_loops`: its lane-0 words, then a load's
    lanes, a store's values, or an accumulation's register runs flushed where its word, copy
    or tile changes (`fast._flushes`)."""
    t, c, st = mterm[j], mconst[j], istride[j]
    for e in range(n):
        a0[j, e] = aff[t, e] + c
    if st != 0:  # the index: lane 0 of its load, or the selected word of a row load
        base = offs[bufid[i0]] + (lane[j] if lane[j] > 0 else 0)
        for e in range(n):
            a0[j, e] += st * np.int64(img[base + a0[i0, e]])
    if o == 1:
        base, ls, mk, sp = offs[bufid[j]], lstride[j], mkind[j], span[j]
        for e in range(n):
            live = 1 if mk == 0 else (active[e] if mk == 1 else sp)
            a = base + a0[j, e]
            if live >= wj:
                for ln in range(wj):
                    v[j, e, ln] = np.float32(img[a + ln * ls])
            else:
                for ln in range(wj):
                    v[j, e, ln] = np.float32(img[a + ln * ls]) if ln < live else 0.0
        return
    s = slot[j]
    for e in range(n):
        a0w[s, e] = a0[j, e]
    last = i2 if i2 >= 0 else (i1 if i1 >= 0 else i0)
    lw = width[last]
    if o == 12:
        for e in range(n):
            for ln in range(wj):
                vals[s, e, ln] = v[last, e, ln if lw > 1 else 0]
        return
    ident = -np.inf if accmax[j] else 0.0
    lj, sl = lane[j], 1 if lw > 1 else 0
    s0 = 1 if width[i0] > 1 else 0
    s1 = 1 if (i1 >= 0 and width[i1] > 1) else 0
    reg = np.full(wj, ident, dtype=np.float32)
    c = 0
    for e in range(n):
        if e > 0 and (tile_end[e - 1] or copy[e] != copy[e - 1]
                      or a0[j, e] != a0[j, e - 1]):
            for ln in range(wj):
                vals[s, c, ln] = reg[ln]
                reg[ln] = ident
            sel[s, c] = e - 1
            c += 1
        if macc[j]:
            for ln in range(wj):
                x0 = v[i0, e, lj] if lj >= 0 else v[i0, e, ln * s0]
                p = np.float32(x0 * v[i1, e, ln * s1])
                reg[ln] = np.float32(reg[ln] + p)
        elif accmax[j]:
            for ln in range(wj):
                x = v[last, e, ln * sl]
                r = reg[ln]
                if not (r >= x or r != r):
                    reg[ln] = x
        else:
            for ln in range(wj):
                reg[ln] = np.float32(reg[ln] + v[last, e, ln * sl])
    if n > 0:
        for ln in range(wj):
            vals[s, c, ln] = reg[ln]
        sel[s, c] = n - 1
        c += 1
    cnt[s] = c


def _lane_sum_node(j, i0, width, v, n):  # pragma: no cover - compiled by numba
    """A `vsum` node of `_batch_loops`: lanes summed in lane order."""
    w0 = width[i0]
    for e in range(n):
        s_ = v[i0, e, 0]
        for ln in range(1, w0):
            s_ = np.float32(s_ + v[i0, e, ln])
        v[j, e, 0] = s_


def _arith_node(j, o, wj, i0, i1, i2, lane, cval, cneg, width, v, n):  # noqa: C901  # pragma: no cover
    """An arithmetic node of `_batch_loops` over every iteration and lane (compiled by numba)."""
    # an operand of one lane is read at lane 0 for every lane (its step 0)
    s0 = 1 if width[i0] > 1 else 0
    s1 = 1 if (i1 >= 0 and width[i1] > 1) else 0
    s2 = 1 if (i2 >= 0 and width[i2] > 1) else 0
    lj = lane[j]
    if lj >= 0:  # input 0 is one lane of a vector, broadcast
        for e in range(n):
            x = v[i0, e, lj]
            for ln in range(wj):
                v[j, e, ln] = x
        i0, s0 = j, 1  # ... read from this node's own row, then overwritten in order
    if o == 9:
        for e in range(n):
            for ln in range(wj):
                v[j, e, ln] = v[i0, e, ln * s0]
    elif o == 2:
        for e in range(n):
            for ln in range(wj):
                v[j, e, ln] = np.float32(v[i0, e, ln * s0] * v[i1, e, ln * s1])
    elif o == 3:
        for e in range(n):
            for ln in range(wj):
                v[j, e, ln] = np.float32(v[i0, e, ln * s0] + v[i1, e, ln * s1])
    elif o == 4:
        for e in range(n):
            for ln in range(wj):
                v[j, e, ln] = np.float32(v[i0, e, ln * s0] - v[i1, e, ln * s1])
    elif o == 5:
        neg = cneg[j]
        for e in range(n):
            for ln in range(wj):
                p = np.float32(v[i0, e, ln * s0] * v[i1, e, ln * s1])
                z = v[i2, e, ln * s2]
                v[j, e, ln] = np.float32(z - p) if neg else np.float32(p + z)
    elif o == 6:
        for e in range(n):
            for ln in range(wj):
                x = v[i0, e, ln * s0]
                y = v[i1, e, ln * s1]
                v[j, e, ln] = x if (x >= y or x != x) else y
    elif o == 7:
        for e in range(n):
            for ln in range(wj):
                v[j, e, ln] = np.float32(v[i0, e, ln * s0] / v[i1, e, ln * s1])
    else:  # butterfly: a + s*b, s = +-1
        sign = cval[j]
        for e in range(n):
            for ln in range(wj):
                v[j, e, ln] = np.float32(v[i0, e, ln * s0] + np.float32(sign
                                                                       * v[i1, e, ln * s1]))
