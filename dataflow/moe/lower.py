"""Kernels of a mixture-of-experts layer: gate GEMM, token dispatch, per-expert GEMMs, combine.

- `gate`: logits = X @ Wg on the array (a dense GEMM). The top-k choice itself is a sort the
  DFG has no op for; it is made on the host (`dataflow.moe.gating.route`) and decides the
  dispatch order, as a sparse operand's pos/crd arrays decide a domain.
- `dispatch`: Xd[r, :] = X[token_of_row[r], :], the tokens regrouped by expert (a GATHER of rows,
  PIT's SRead).
- `expert{e}`: Yd[rows of e, :] = Xd[rows of e, :] @ W[e], one kernel per expert, so an expert
  that received more tokens runs longer and the imbalance is visible in the timeline.
- `combine`: Y[t, :] = sum over t's choices s of gate[t, s] * Yd[row_of[t, s], :] (a GATHER of
  the expert outputs back into token order, weighted).
"""

from __future__ import annotations

import numpy as np

from dataflow.dfg.graph import Addr, Buffer, Kernel, Loop, Node, Program
from dataflow.dfg.lower import gemm_kernel, run_passes
from dataflow.dfg.ops import Op
from dataflow.dynamic.lower import renamed
from dataflow.moe.gating import Routing


def gate_kernel(tokens: int, dim: int, experts: int) -> Kernel:
    return renamed(gemm_kernel(tokens, dim, experts), {"A": "X", "B": "Wg", "C": "logits"}, "gate")


def dispatch_kernel(rows: int, tokens: int, dim: int) -> Kernel:
    nodes = (
        Node(0, Op.LOAD, buffer="token_of_row", addr=Addr((("r", 1),)), name="tok"),
        Node(1, Op.GATHER, (0,), buffer="X", addr=Addr((("j", 1),), index_stride=dim),
             name="X[tok]"),
        Node(2, Op.STORE, (1,), buffer="Xd", addr=Addr((("r", dim), ("j", 1))), name="Xd="),
    )
    return Kernel(name="dispatch", loops=(Loop("r", rows), Loop("j", dim)), nodes=nodes,
                  buffers=(Buffer("token_of_row", rows), Buffer("X", tokens * dim),
                           Buffer("Xd", rows * dim, "output")), vector_var="j")


def expert_kernel(e: int, n_rows: int, row0: int, dim: int, hidden: int, x_name: str, x_rows: int,
                  y_name: str, y_rows: int) -> Kernel:
    """y[row0 + i, :] = x[row0 + i, :] @ W{e} for i < n_rows (output stationary, as gemm)."""
    w = f"W{e}"
    nodes = (
        Node(0, Op.LOAD, buffer=x_name, addr=Addr((("i", dim), ("kk", 1)), const=row0 * dim),
             name="x"),
        Node(1, Op.LOAD, buffer=w, addr=Addr((("kk", hidden), ("j", 1))), name="w"),
        Node(2, Op.MUL, (0, 1), name="x*w"),
        Node(3, Op.ACC, (2,), buffer=y_name,
             addr=Addr((("i", hidden), ("j", 1)), const=row0 * hidden), name="y+="),
    )
    return Kernel(name=f"expert{e}", loops=(Loop("i", n_rows), Loop("j", hidden), Loop("kk", dim)),
                  nodes=nodes,
                  buffers=(Buffer(x_name, x_rows * dim), Buffer(w, dim * hidden),
                           Buffer(y_name, y_rows * hidden, "output")),
                  vector_var="j", carried=((3, 3, 1),))


def combine_kernel(tokens: int, top_k: int, hidden: int) -> Kernel:
    rows = tokens * top_k
    nodes = (
        Node(0, Op.LOAD, buffer="row_of", addr=Addr((("s", 1),)), name="row"),
        Node(1, Op.GATHER, (0,), buffer="Yd", addr=Addr((("j", 1),), index_stride=hidden),
             name="Yd[row]"),
        Node(2, Op.LOAD, buffer="gate", addr=Addr((("s", 1),)), name="g"),
        Node(3, Op.MUL, (1, 2), name="g*y"),
        Node(4, Op.ACC, (3,), buffer="Y", addr=Addr((("t", hidden), ("j", 1))), name="Y+="),
    )
    return Kernel(name="combine",
                  loops=(Loop("t", tokens), Loop("j", hidden),
                         Loop("s", pos="choice_pos", parent="t")),
                  nodes=nodes,
                  buffers=(Buffer("row_of", rows), Buffer("Yd", rows * hidden),
                           Buffer("gate", rows), Buffer("Y", tokens * hidden, "output")),
                  vector_var="j", carried=((4, 4, 1),),
                  domain_arrays=(("choice_pos", np.arange(0, rows + 1, top_k, dtype=np.int64)),))


def _f32(x):
    return np.ascontiguousarray(x, dtype=np.float32).ravel()


def front_program(x, wg, routing: Routing) -> Program:
    """gate + dispatch; output Xd (dispatched rows x dim)."""
    (t, d), e = x.shape, wg.shape[1]
    rows = len(routing.token_of_row)
    return run_passes(Program(
        name=f"moe_front_{t}x{d}_e{e}", kernels=(gate_kernel(t, d, e), dispatch_kernel(rows, t, d)),
        inputs=(("X", _f32(x)), ("Wg", _f32(wg)),
                ("token_of_row", routing.token_of_row.astype(np.int64))),
        outputs=(("Xd", (rows, d)),), macs=t * d * e))


def expert_program(e: int, xe: np.ndarray, we: np.ndarray) -> Program:
    """One expert alone (its own region of the array): Ye = Xe @ W{e}."""
    n, d = xe.shape
    h = we.shape[1]
    return run_passes(Program(
        name=f"moe_expert{e}_{n}x{d}x{h}",
        kernels=(expert_kernel(e, n, 0, d, h, "Xe", n, "Ye", n),),
        inputs=(("Xe", _f32(xe)), (f"W{e}", _f32(we))), outputs=(("Ye", (n, h)),), macs=n * d * h))


def combine_program(yd: np.ndarray, routing: Routing, tokens: int) -> Program:
    rows, h = yd.shape
    k = routing.expert.shape[1]
    return run_passes(Program(
        name=f"moe_combine_{tokens}x{h}_k{k}", kernels=(combine_kernel(tokens, k, h),),
        inputs=(("row_of", routing.row_of.ravel().astype(np.int64)), ("Yd", _f32(yd)),
                ("gate", _f32(routing.gate))),
        outputs=(("Y", (tokens, h)),), macs=rows * h))


def sequential_program(x, wg, w, routing: Routing) -> Program:
    """The whole layer as one program on the whole array, experts one after another."""
    (t, d), h = x.shape, w.shape[2]
    rows = len(routing.token_of_row)
    kernels = [gate_kernel(t, d, wg.shape[1]), dispatch_kernel(rows, t, d)]
    for e, n in enumerate(routing.tokens_per_expert):
        if n:  # an expert no token chose has no kernel
            kernels.append(expert_kernel(e, int(n), int(routing.offsets[e]), d, h,
                                         "Xd", rows, "Yd", rows))
    kernels.append(combine_kernel(t, routing.expert.shape[1], h))
    used = [e for e, n in enumerate(routing.tokens_per_expert) if n]
    return run_passes(Program(
        name=f"moe_{t}x{d}x{h}_e{w.shape[0]}_k{routing.expert.shape[1]}", kernels=tuple(kernels),
        inputs=(("X", _f32(x)), ("Wg", _f32(wg)),
                ("token_of_row", routing.token_of_row.astype(np.int64)),
                *((f"W{e}", _f32(w[e])) for e in used),
                ("row_of", routing.row_of.ravel().astype(np.int64)), ("gate", _f32(routing.gate))),
        outputs=(("Y", (t, h)),), macs=t * d * wg.shape[1] + rows * d * h + rows * h))
