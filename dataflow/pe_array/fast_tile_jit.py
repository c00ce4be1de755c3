"""The batched memo-hit pass (`fast_tile.py`) as one compiled loop over iterations and nodes.

Numpy's batched pass still makes several calls per node over (iterations, lanes) arrays; this
module runs the same values in one numba call per kernel: iteration by iteration, each node in
id order (inputs before users), every lane. The arithmetic is `semantics.apply_op`'s in
float32, each result rounded to float32 as it is made (a MAC's product, then its add: no fused
multiply-add; numba contracts nothing without fastmath), dead lanes of a load read as 0 as
`fast._gather` zeroes them (a VSUM adds them), a maximum as np.maximum (NaN wins, the first
operand on ties). Accumulators fold in a register per node, flushed where lane 0's word or the
copy changes and at every tile's end (`fast._flushes`); the flushes and store values come
back to `fast._apply_writes`, which commits as before. Kernels with an op whose float32 bits
numba need not share with numpy (exp: numpy has its own SIMD exp) are not compiled
(`program` returns None) and take numpy's batched pass. Loads read one float64 image of the
kernel's read-only buffers (float32 and integers below 2^53 are exact there).
docs/architecture.md#batched-memo-hits.
"""

from __future__ import annotations

import functools

import numpy as np

from dataflow.dfg.ops import Op

_ARITH = {Op.CONST: 0, Op.MUL: 2, Op.ADD: 3, Op.SUB: 4, Op.MAC: 5, Op.MAX: 6, Op.DIV: 7,
          Op.VSUM: 8, Op.ROUTE: 9, Op.BFLY: 10}
_LOAD, _ACC, _STORE = 1, 11, 12
#: mask kinds of a memory node: one lane, the iteration's live lanes, the first `span`
_SCALAR, _ACTIVE, _SPAN = 0, 1, 2


@functools.cache
def _compiled():
    import numba

    return numba.njit(cache=True, error_model="numpy")(_batch_loops)


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
            if n.op not in _ARITH:
                return None  # exp: numpy's own SIMD bits
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
        from dataflow.pe_array import fast

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
    """(float64 image of the loaded buffers, each one's offset), or None when a buffer's
    values are not exact in float64 (an integer of 2^53 or more, another dtype)."""
    parts, offs, at = [], [], 0
    for name in prog["buffers"]:
        b = np.asarray(bufs[name])
        if b.ndim != 1 or b.dtype.kind not in "fiu" or (b.dtype.kind == "f" and b.itemsize > 8):
            return None
        if b.dtype.kind in "iu" and len(b) and int(np.abs(b).max()) >= 1 << 53:
            return None
        parts.append(b)
        offs.append(at)
        at += len(b)
    img = np.concatenate(parts).astype(np.float64) if parts else np.zeros(0)
    return img, np.array(offs + [at], np.int64)


def run(prog: dict, img, offs, aff, active, copy, tile_end, lanes: int):
    """Run the compiled pass: per writer, its lane-0 words (iterations), its flushed registers
    or stored values, and for an accumulator the iterations it flushed at."""
    n = aff.shape[1]
    nw = len(prog["writers"])
    vals = np.zeros((nw, n, lanes), np.float32)
    sel = np.zeros((nw, n), np.int64)
    cnt = np.zeros(nw, np.int64)
    a0w = np.zeros((nw, n), np.int64)
    _compiled()(prog["op"], prog["ins"], prog["lane"], prog["cval"], prog["cneg"],
                prog["width"], prog["mterm"], prog["mconst"], prog["istride"], prog["lstride"],
                prog["mkind"], prog["span"], prog["bufid"], prog["slot"], prog["accmax"],
                prog["macc"], aff, active, copy, tile_end, img, offs, lanes, vals, sel, cnt, a0w)
    return vals, sel, cnt, a0w


def _batch_loops(op, ins, lane, cval, cneg, width, mterm, mconst,  # noqa: C901
                 istride, lstride, mkind, span, bufid, slot, accmax, macc, aff, active, copy,
                 tile_end, img, offs, lanes, vals, sel, cnt, a0w):  # pragma: no cover - numba
    nn = op.shape[0]
    n = aff.shape[1]
    v = np.zeros((nn, lanes), dtype=np.float32)
    a0 = np.zeros(nn, dtype=np.int64)
    reg = np.zeros((nn, lanes), dtype=np.float32)
    for e in range(n):
        for j in range(nn):
            o = op[j]
            wj = width[j]
            if o == 0:
                v[j, 0] = cval[j]
                continue
            if o == 1 or o == 11 or o == 12:  # a memory node's lane-0 word
                a = aff[mterm[j], e] + mconst[j]
                if istride[j] != 0:
                    src = ins[j, 0]
                    a += istride[j] * np.int64(img[offs[bufid[src]] + a0[src]])
                if o == 1:
                    if mkind[j] == 0:
                        live = 1
                    elif mkind[j] == 1:
                        live = active[e]
                    else:
                        live = span[j]
                    base = offs[bufid[j]] + a
                    for ln in range(wj):
                        if ln < live:
                            v[j, ln] = np.float32(img[base + ln * lstride[j]])
                        else:
                            v[j, ln] = np.float32(0.0)
                    a0[j] = a
                    continue
                s = slot[j]
                a0w[s, e] = a
                last = ins[j, 2] if ins[j, 2] >= 0 else (ins[j, 1] if ins[j, 1] >= 0
                                                           else ins[j, 0])
                lw = width[last]
                if o == 12:
                    for ln in range(wj):
                        vals[s, e, ln] = v[last, ln if lw > 1 else 0]
                    continue
                if e == 0 or tile_end[e - 1] or copy[e] != copy[e - 1] or a != a0[j]:
                    if e > 0:
                        c = cnt[s]
                        for ln in range(wj):
                            vals[s, c, ln] = reg[j, ln]
                        sel[s, c] = e - 1
                        cnt[s] = c + 1
                    for ln in range(wj):
                        reg[j, ln] = -np.inf if accmax[j] else 0.0
                a0[j] = a
                if macc[j]:
                    i0, i1 = ins[j, 0], ins[j, 1]
                    w0, w1 = width[i0], width[i1]
                    for ln in range(wj):
                        x0 = v[i0, lane[j]] if lane[j] >= 0 else v[i0, ln if w0 > 1 else 0]
                        p = np.float32(x0 * v[i1, ln if w1 > 1 else 0])
                        reg[j, ln] = np.float32(reg[j, ln] + p)
                elif accmax[j]:
                    for ln in range(wj):
                        x = v[last, ln if lw > 1 else 0]
                        r = reg[j, ln]
                        if not (r >= x or r != r):
                            reg[j, ln] = x
                else:
                    for ln in range(wj):
                        reg[j, ln] = np.float32(reg[j, ln] + v[last, ln if lw > 1 else 0])
                continue
            i0, i1, i2 = ins[j, 0], ins[j, 1], ins[j, 2]
            if o == 8:  # lanes summed in lane order
                w0 = width[i0]
                s_ = v[i0, 0]
                for ln in range(1, w0):
                    s_ = np.float32(s_ + v[i0, ln])
                v[j, 0] = s_
                continue
            for ln in range(wj):
                if lane[j] >= 0:
                    x = v[i0, lane[j]]
                else:
                    x = v[i0, ln if width[i0] > 1 else 0]
                if o == 9:
                    v[j, ln] = x
                    continue
                y = v[i1, ln if width[i1] > 1 else 0]
                if o == 2:
                    v[j, ln] = np.float32(x * y)
                elif o == 3:
                    v[j, ln] = np.float32(x + y)
                elif o == 4:
                    v[j, ln] = np.float32(x - y)
                elif o == 5:
                    z = v[i2, ln if width[i2] > 1 else 0]
                    p = np.float32(x * y)
                    v[j, ln] = np.float32(z - p) if cneg[j] else np.float32(p + z)
                elif o == 6:
                    v[j, ln] = x if (x >= y or x != x) else y
                elif o == 7:
                    v[j, ln] = np.float32(x / y)
                else:  # butterfly: a + s*b, s = +-1
                    v[j, ln] = np.float32(x + np.float32(cval[j] * y))
    for j in range(nn):
        if op[j] == 11 and n > 0:
            s = slot[j]
            c = cnt[s]
            for ln in range(width[j]):
                vals[s, c, ln] = reg[j, ln]
            sel[s, c] = n - 1
            cnt[s] = c + 1
