"""Lowering of masked attention O = softmax(mask(Q K^T / sqrt(d))) V to one `Program`.

Four kernels over the mask's CSR arrays (pos, crd), run one after another:

1. `sddmm`         S[p] = sum_c vsum(Q[i, c*L : c*L+L] * K[crd[p], c*L : c*L+L])   (L = lanes)
2. `softmax_max`   rowmax[i] = max_p S[p]                                   (accmax)
3. `softmax_exp`   E[p] = exp(scale * (S[p] - rowmax[i]));  rowsum[i] += E[p]
4. `spmm`          O[i, :] += (E[p] / rowsum[i]) * V[crd[p], :]   (the CSR SpMM of lower.py with
                   the softmax's normalisation folded in: `normalised_spmm_kernel`)

Only stored entries are touched, so every kernel's iteration count scales with the mask's nnz
(the dense pattern is the CSR of an all-ones mask). The row max is subtracted before exp as in
any numerically safe softmax; `rowmax` starts at -inf (Buffer.init). The normalisation is the
SpMM's (docs/conventions.md#attention-fold): each probability E[p] / rowsum[i] is divided out
as the SpMM loads it -- the same division as a kernel of its own that writes P would make, so
the same values -- and no kernel writes P and reads it back. Q and K are padded with
zero columns to a multiple of L so the reduction vectorises (zeros add nothing to a dot product).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dataflow.attention.row_softmax import (
    hand_over,
    row_softmax_kernel,
    row_width,
)
from dataflow.dfg.graph import Addr, Buffer, DFGError, Kernel, Loop, Node, Program
from dataflow.dfg.lower import run_passes, spmm_csr_kernel
from dataflow.dfg.lower_sddmm import sddmm_csr_vector_kernel
from dataflow.dfg.ops import Op

#: Kernel names in program order, and the phase each belongs to (SimResult breakdowns).
KERNEL_PHASE = {"sddmm": "sddmm", "softmax_max": "softmax", "softmax_exp": "softmax",
                "spmm": "spmm", "softmax_norm": "softmax",  # the DIA lowering's
                "key_compact": "sddmm",  # the block lowering's (lower_block.py), with the
                **{f"softmax_max_{i}": "softmax" for i in range(1, 9)}}  # accmax-free levels


def rename_buffers(kernel: Kernel, names: dict[str, str], name: str) -> Kernel:
    """The same kernel with buffers (and domain arrays) renamed, so library kernels chain."""
    def rn(x):
        return names.get(x, x)

    nodes = tuple(dataclasses.replace(n, buffer=rn(n.buffer)) if n.buffer else n
                  for n in kernel.nodes)
    loops = tuple(dataclasses.replace(lp, pos=rn(lp.pos)) if lp.pos else lp for lp in kernel.loops)
    return dataclasses.replace(
        kernel, name=name, nodes=nodes, loops=loops,
        buffers=tuple(dataclasses.replace(b, name=rn(b.name)) for b in kernel.buffers),
        domain_arrays=tuple((rn(k), v) for k, v in kernel.domain_arrays))


def _row_entry_kernel(name: str, m: int, pos: np.ndarray, nodes: tuple[Node, ...],
                      buffers: tuple[Buffer, ...], carried=()) -> Kernel:
    """A kernel over (i, p in pos[i]..pos[i+1]): one iteration per stored mask entry."""
    return Kernel(name=name, loops=(Loop("i", m), Loop("p", pos="M_pos", parent="i")),
                  nodes=nodes, buffers=buffers, carried=carried,
                  domain_arrays=(("M_pos", np.asarray(pos, dtype=np.int64)),))


def softmax_max_kernel(m: int, pos: np.ndarray) -> Kernel:
    """rowmax[i] = max over the row's stored entries of S[p] (rowmax starts at -inf); the
    running max stays in the accmax's register (a carried edge of distance 1, like an acc's)."""
    nnz = int(pos[-1])
    nodes = (
        Node(0, Op.LOAD, buffer="S", addr=Addr((("p", 1),)), name="s"),
        Node(1, Op.ACC_MAX, (0,), buffer="rowmax", addr=Addr((("i", 1),)), name="max="),
    )
    return _row_entry_kernel("softmax_max", m, pos, nodes,
                             (Buffer("S", nnz), Buffer("rowmax", m, "output", init=-math.inf)),
                             carried=((1, 1, 1),))


def softmax_exp_kernel(m: int, pos: np.ndarray, scale: float) -> Kernel:
    """E[p] = exp(scale * (S[p] - rowmax[i])); rowsum[i] += E[p]. Scaling after the max is
    the same softmax, since max(scale * s) = scale * max(s) for scale > 0."""
    nnz = int(pos[-1])
    nodes = (
        Node(0, Op.LOAD, buffer="S", addr=Addr((("p", 1),)), name="s"),
        Node(1, Op.LOAD, buffer="rowmax", addr=Addr((("i", 1),)), name="max"),
        Node(2, Op.SUB, (0, 1), name="s-max"),
        Node(3, Op.CONST, value=scale, name="1/sqrt(d)"),
        Node(4, Op.MUL, (2, 3), name="*scale"),
        Node(5, Op.EXP, (4,), name="exp"),
        Node(6, Op.STORE, (5,), buffer="E", addr=Addr((("p", 1),)), name="E="),
        Node(7, Op.ACC, (5,), buffer="rowsum", addr=Addr((("i", 1),)), name="sum+="),
    )
    return _row_entry_kernel(
        "softmax_exp", m, pos, nodes,
        (Buffer("S", nnz), Buffer("rowmax", m), Buffer("E", nnz, "output"),
         Buffer("rowsum", m, "output")), carried=((7, 7, 1),))


def normalised_spmm_kernel(m: int, n: int, dv: int, pos: np.ndarray) -> Kernel:
    """O[i, :] += (E[p] / rowsum[i]) * V[crd[p], :]: the CSR SpMM (`spmm_csr_kernel`, j over
    dv vectorised, p innermost) with the softmax's normalisation folded in
    (docs/conventions.md#attention-fold). rowsum[i] does not move with p: the compiler holds
    it (docs/conventions.md#held-loads), so a row's sum is read once per row, not per entry."""
    spmm = rename_buffers(spmm_csr_kernel(m, n, dv, pos),
                          {"A_val": "E", "A_crd": "M_crd", "B": "V", "C": "O", "A_pos": "M_pos"},
                          "spmm")
    e, crd, gather, mul, acc = spmm.nodes
    if (e.op, crd.op, gather.op, mul.op, acc.op) != (Op.LOAD, Op.LOAD, Op.GATHER, Op.MUL,
                                                     Op.ACC):
        raise DFGError(f"normalised_spmm_kernel: unexpected SpMM body {spmm}")
    nodes = (e, Node(1, Op.LOAD, buffer="rowsum", addr=Addr((("i", 1),)), name="sum"),
             Node(2, Op.DIV, (0, 1), name="e/sum"),
             dataclasses.replace(crd, id=3),
             dataclasses.replace(gather, id=4, inputs=(3,)),
             dataclasses.replace(mul, id=5, inputs=(2, 4)),
             dataclasses.replace(acc, id=6, inputs=(5,)))
    out = dataclasses.replace(spmm, nodes=nodes, buffers=(*spmm.buffers, Buffer("rowsum", m)),
                              carried=((6, 6, 1),))
    out.verify()
    return out


def lower_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos: np.ndarray,
                    crd: np.ndarray, lanes: int = 8, dtype=np.float32,
                    row_bodies: bool = False, on_chip: bool = False) -> Program:
    """The attention `Program` for Q (m x d), K (n x d), V (n x dv) and a CSR mask (pos, crd)
    of shape m x n. `lanes` is the SIMD width the reduction is vectorised over (the arch's
    `pe_array.simd_lanes`). `row_bodies`: where every row attends the same number of keys,
    the softmax takes a whole row per iteration (`row_softmax.py`, no accmax) and writes the
    probabilities P, and the SpMM is the plain CSR SpMM over them; `on_chip` (with row
    bodies): S and P handed over in the SPM (`row_softmax.hand_over`). Output `O` (m x dv)."""
    for nm, x in (("q", q), ("k", k), ("v", v)):
        if np.ndim(x) != 2:
            raise DFGError(f"attention takes matrices; {nm} has shape {np.shape(x)}")
    (m, d), (n, d2), (n2, dv) = q.shape, k.shape, v.shape
    if d != d2 or n != n2:
        raise DFGError(f"attention shapes do not agree: q {q.shape}, k {k.shape}, v {v.shape}")
    pos, crd = np.asarray(pos, dtype=np.int64), np.asarray(crd, dtype=np.int64)
    if len(pos) != m + 1 or int(pos[-1]) != len(crd):
        raise DFGError(f"malformed CSR mask: pos has {len(pos)} entries for {m} rows, "
                       f"crd {len(crd)}, pos[-1] = {int(pos[-1]) if len(pos) else None}")
    if len(crd) and (int(crd.max()) >= n or int(crd.min()) < 0):
        raise DFGError(f"CSR mask column out of range [0, {n})")
    if lanes < 1:
        raise DFGError(f"lanes must be >= 1, got {lanes}")
    nnz = len(crd)
    dp = -(-d // lanes) * lanes
    qp = np.zeros((m, dp), dtype=dtype)
    kp = np.zeros((n, dp), dtype=dtype)
    qp[:, :d], kp[:, :d] = q, k
    scale = 1.0 / math.sqrt(d)
    sddmm = rename_buffers(sddmm_csr_vector_kernel(m, dp, n, pos, lanes),
                           {"A": "Q", "BT": "K", "C_val": "S"}, "sddmm")
    width = row_width(pos) if row_bodies else None
    softmax = ((row_softmax_kernel(m, width, scale),) if width
               else (softmax_max_kernel(m, pos), softmax_exp_kernel(m, pos, scale)))
    spmm = (rename_buffers(spmm_csr_kernel(m, n, dv, pos), {"A_val": "P", "A_crd": "M_crd",
                                                           "B": "V", "C": "O",
                                                           "A_pos": "M_pos"}, "spmm")
            if width else normalised_spmm_kernel(m, n, dv, pos))
    kernels = (sddmm, *softmax, spmm)
    if width and on_chip:
        kernels = hand_over(kernels, m, nnz)
    prog = Program(
        name=f"attention_{m}x{n}x{d}_nnz{nnz}", kernels=kernels,
        inputs=(("M_crd", crd), ("Q", qp.ravel()), ("K", kp.ravel()),
                ("V", np.ascontiguousarray(v, dtype=dtype).ravel())),
        outputs=(("O", (m, dv)),), dtype=np.dtype(dtype).name, macs=nnz * (d + dv),
    )
    return run_passes(prog)
