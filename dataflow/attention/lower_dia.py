"""Attention over a DIA mask: a gather-free lowering for banded patterns.

A window or dilated-window mask is a set of whole diagonals j = i + o_t with equally spaced
offsets o_t = o_0 + step * t (t < T), which is what its UST format, DIA
`(i, j) -> (j - i : compressed, i : range)`, stores: one value per (diagonal, row), filler zeros
where a diagonal runs off the matrix. Stored per row ([i, t], T values a row), every access is
affine in the loop variables, so no kernel loads column indices or gathers:

1. `sddmm`         S[i, t] = sum_c vsum(Q[i, chunk c] * K[i + o_t, chunk c])   (SIMD over d)
2. `softmax_max`   rowmax[i] = max_t (S[i, t] + bias[i, t])                   (accmax)
3. `softmax_exp`   E[i, t] = exp(scale * (S + bias - rowmax[i]));  rowsum[i] += E[i, t]
4. `softmax_norm`  P[i, t] = E[i, t] / rowsum[i]
5. `spmm`          O[i, :] += P[i, t] * V[i + o_t, :]                         (SIMD over dv)

K and V get `pad` zero rows on both sides so off-matrix positions read zeros, and `bias` is 0
on the matrix and -inf off it (the DIA fillers), so those positions get exp = 0 and add nothing.
Compared with the CSR lowering (`lower.py`) the body loses the crd loads and the gathers and
streams K and V by row windows instead of holding them whole; it iterates over T * seq
positions (fillers included) instead of nnz.
"""

from __future__ import annotations

import math

import numpy as np

from dataflow.dfg.graph import Addr, Buffer, DFGError, Kernel, Loop, Node, Program
from dataflow.dfg.lower import run_passes
from dataflow.dfg.ops import Op


def band_offsets(pos: np.ndarray, crd: np.ndarray, n: int) -> tuple[int, int, int] | None:
    """(o_0, step, T) when the CSR mask (m x n) is exactly the whole diagonals o_0 + step * t,
    t < T, within the matrix; else None."""
    m = len(pos) - 1
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(pos))
    offs = np.unique(crd - rows)
    if len(offs) == 0:
        return None
    step = int(offs[1] - offs[0]) if len(offs) > 1 else 1
    if len(offs) > 1 and not (np.diff(offs) == step).all():
        return None
    i = np.repeat(np.arange(m, dtype=np.int64), len(offs))
    j = i + np.tile(offs, m)
    ok = (j >= 0) & (j < n)
    if ok.sum() != len(crd):  # some in-range position of a diagonal is missing
        return None
    return int(offs[0]), step, len(offs)


def _kernel(name, loops, nodes, buffers, vector_var, carried=()):
    return Kernel(name=name, loops=loops, nodes=tuple(nodes), buffers=tuple(buffers),
                  vector_var=vector_var, carried=carried)


def lower_attention_dia(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos: np.ndarray,
                        crd: np.ndarray, lanes: int = 8, dtype=np.float32) -> Program:
    """The attention `Program` of a banded (DIA) mask; raises DFGError when the mask is not
    whole equally spaced diagonals or seq is not a multiple of `lanes`. Output `O` (m x dv)."""
    (m, d), (n, _), (_, dv) = q.shape, k.shape, v.shape
    if m != n:
        raise DFGError(f"dia lowering needs a square mask, got {m} x {n}")
    band = band_offsets(np.asarray(pos), np.asarray(crd), n)
    if band is None:
        raise DFGError("dia lowering needs a mask of whole, equally spaced diagonals "
                       "(window or dilated patterns)")
    o0, step, T = band
    pad = max(0, -o0, o0 + step * (T - 1))
    offs = o0 + step * np.arange(T)
    on = (np.arange(m)[None, :] + offs[:, None] >= 0) & (np.arange(m)[None, :] + offs[:, None] < n)
    bias = np.where(on, 0.0, -np.inf).astype(dtype)
    dp = -(-d // lanes) * lanes  # q, k padded with zero columns to whole SIMD chunks
    qp = np.zeros((m, dp), dtype=dtype)
    qp[:, :d] = q
    kp = np.zeros((n + 2 * pad, dp), dtype=dtype)
    kp[pad:pad + n, :d] = k
    vp = np.zeros((n + 2 * pad, dv), dtype=dtype)
    vp[pad:pad + n] = v
    scale = 1.0 / math.sqrt(d)
    mt = m * T
    it = (("i", T), ("t", 1))  # [i, t] of an (m x T) buffer: each row's diagonals together
    rows = (Loop("i", m), Loop("t", T))

    sddmm = _kernel(
        "sddmm", (Loop("i", m), Loop("t", T), Loop("c", dp // lanes), Loop("l", lanes)),
        [Node(0, Op.LOAD, buffer="Q", addr=Addr((("i", dp), ("c", lanes), ("l", 1))), name="q"),
         Node(1, Op.LOAD, buffer="K", addr=Addr((("i", dp), ("t", step * dp), ("c", lanes),
                                                  ("l", 1)), const=(pad + o0) * dp),
              name="k[i+o_t]"),
         Node(2, Op.MUL, (0, 1), name="q*k"),
         Node(3, Op.VSUM, (2,), name="sum lanes"),
         Node(4, Op.ACC, (3,), buffer="S", addr=Addr(it), name="S+=")],
        [Buffer("Q", m * dp), Buffer("K", (n + 2 * pad) * dp), Buffer("S", mt, "output")],
        "l", carried=((4, 4, 1),))
    smax = _kernel(
        "softmax_max", rows,
        [Node(0, Op.LOAD, buffer="S", addr=Addr(it), name="s"),
         Node(1, Op.LOAD, buffer="bias", addr=Addr(it), name="bias"),
         Node(2, Op.ADD, (0, 1), name="s+bias"),
         Node(3, Op.ACC_MAX, (2,), buffer="rowmax", addr=Addr((("i", 1),)), name="max=")],
        [Buffer("S", mt), Buffer("bias", mt), Buffer("rowmax", m, "output", init=-math.inf)],
        None, carried=((3, 3, 1),))
    sexp = _kernel(
        "softmax_exp", rows,
        [Node(0, Op.LOAD, buffer="S", addr=Addr(it), name="s"),
         Node(1, Op.LOAD, buffer="bias", addr=Addr(it), name="bias"),
         Node(2, Op.ADD, (0, 1), name="s+bias"),
         Node(3, Op.LOAD, buffer="rowmax", addr=Addr((("i", 1),)), name="max"),
         Node(4, Op.SUB, (2, 3), name="-max"),
         Node(5, Op.CONST, value=scale, name="1/sqrt(d)"),
         Node(6, Op.MUL, (4, 5), name="*scale"),
         Node(7, Op.EXP, (6,), name="exp"),
         Node(8, Op.STORE, (7,), buffer="E", addr=Addr(it), name="E="),
         Node(9, Op.ACC, (7,), buffer="rowsum", addr=Addr((("i", 1),)), name="sum+=")],
        [Buffer("S", mt), Buffer("bias", mt), Buffer("rowmax", m), Buffer("E", mt, "output"),
         Buffer("rowsum", m, "output")],
        None, carried=((9, 9, 1),))
    snorm = _kernel(
        "softmax_norm", rows,
        [Node(0, Op.LOAD, buffer="E", addr=Addr(it), name="e"),
         Node(1, Op.LOAD, buffer="rowsum", addr=Addr((("i", 1),)), name="sum"),
         Node(2, Op.DIV, (0, 1), name="e/sum"),
         Node(3, Op.STORE, (2,), buffer="P", addr=Addr(it), name="P=")],
        [Buffer("E", mt), Buffer("rowsum", m), Buffer("P", mt, "output")], None)
    spmm = _kernel(
        "spmm", (Loop("i", m), Loop("j", dv), Loop("t", T)),
        [Node(0, Op.LOAD, buffer="P", addr=Addr(it), name="p"),
         Node(1, Op.LOAD, buffer="V", addr=Addr((("i", dv), ("t", step * dv), ("j", 1)),
                                                 const=(pad + o0) * dv), name="v[i+o_t]"),
         Node(2, Op.MUL, (0, 1), name="p*v"),
         Node(3, Op.ACC, (2,), buffer="O", addr=Addr((("i", dv), ("j", 1))), name="O+=")],
        [Buffer("P", mt), Buffer("V", (n + 2 * pad) * dv), Buffer("O", m * dv, "output")],
        "j", carried=((3, 3, 1),))
    prog = Program(
        name=f"attention_dia_{m}x{n}x{d}_diag{T}", kernels=(sddmm, smax, sexp, snorm, spmm),
        inputs=(("Q", qp.ravel()), ("K", kp.ravel()), ("bias", bias.T.ravel()),
                ("V", vp.ravel())),
        outputs=(("O", (m, dv)),), dtype=np.dtype(dtype).name, macs=len(crd) * (d + dv),
    )
    return run_passes(prog)
