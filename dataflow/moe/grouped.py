"""The `grouped` placement of a mixture-of-experts layer: every expert in one kernel.

`parallel` and `sequential` run one small kernel per expert, each paying a reconfiguration, a
DMA latency and its weights' transfer before it computes, and a dispatch kernel that copies
the tokens into expert order through DRAM. Here the experts are one grouped GEMM over the
dispatched rows:

    for r in rows, j in hidden (vector), kk in dim:
        Yd[r, j] += X[token_of_row[r], kk] * W[expert_of_row[r], kk, j]

X is gathered by token (the dispatch is folded into the expert kernel: no Xd round trip
through DRAM) and each row's weights are gathered from the experts' stacked weights by the
row's expert, so the rows of every expert run back to back in one modulo schedule, the
weights cross the DRAM interface in one transfer and the compiler's schedule search
(`plan.compile`: macc, the vector loop unrolled-and-jammed so a row's x is loaded once for
several output vectors) applies to all experts at once. The program is gate -> experts ->
combine; the layer's values and floors are those of the other placements
(docs/conventions.md#register-blocking, section "MoE").
"""

from __future__ import annotations

import numpy as np

from dataflow.dfg.graph import Addr, Buffer, Kernel, Loop, Node, Program
from dataflow.dfg.lower import run_passes
from dataflow.dfg.ops import Op
from dataflow.moe.gating import Routing
from dataflow.moe.lower import combine_kernel, gate_kernel


def grouped_expert_kernel(offsets: np.ndarray, tokens: int, dim: int, hidden: int) -> Kernel:
    """Yd[r, :] = X[token_of_row[r], :] @ W[e] for the rows r of each expert e
    (offsets[e] <= r < offsets[e + 1]: a sparse loop, as a CSR row's nonzeros)."""
    experts, rows = len(offsets) - 1, int(offsets[-1])
    nodes = (
        Node(0, Op.LOAD, buffer="token_of_row", addr=Addr((("r", 1),)), name="tok"),
        Node(1, Op.GATHER, (0,), buffer="X", addr=Addr((("kk", 1),), index_stride=dim),
             name="x"),
        Node(2, Op.LOAD, buffer="W", addr=Addr((("e", dim * hidden), ("kk", hidden), ("j", 1))),
             name="w"),
        Node(3, Op.MUL, (1, 2), name="x*w"),
        Node(4, Op.ACC, (3,), buffer="Yd", addr=Addr((("r", hidden), ("j", 1))), name="y+="),
    )
    return Kernel(name="experts",
                  loops=(Loop("e", experts), Loop("r", pos="expert_pos", parent="e"),
                         Loop("j", hidden), Loop("kk", dim)),
                  nodes=nodes,
                  buffers=(Buffer("token_of_row", rows), Buffer("X", tokens * dim),
                           Buffer("W", experts * dim * hidden),
                           Buffer("Yd", rows * hidden, "output")),
                  vector_var="j", carried=((4, 4, 1),),
                  domain_arrays=(("expert_pos", np.asarray(offsets, dtype=np.int64)),))


def grouped_program(x, wg, w, routing: Routing) -> Program:
    """gate -> experts (one grouped kernel) -> combine, on the whole array."""
    (t, d), (e, _, h) = x.shape, w.shape
    rows = len(routing.token_of_row)
    k = routing.expert.shape[1]

    def f32(v):
        return np.ascontiguousarray(v, dtype=np.float32).ravel()

    return run_passes(Program(
        name=f"moe_grouped_{t}x{d}x{h}_e{e}_k{k}",
        kernels=(gate_kernel(t, d, e), grouped_expert_kernel(routing.offsets, t, d, h),
                 combine_kernel(t, k, h)),
        inputs=(("X", f32(x)), ("Wg", f32(wg)),
                ("token_of_row", routing.token_of_row.astype(np.int64)),
                ("W", f32(w)),
                ("row_of", routing.row_of.ravel().astype(np.int64)), ("gate", f32(routing.gate))),
        outputs=(("Y", (t, h)),), macs=t * d * e + rows * d * h + rows * h))
