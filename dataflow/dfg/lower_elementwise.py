"""Lowering of element-wise ops: `add` over the union, `multiply` over the intersection of the
operands' stored entries (a dense operand stores every entry).

Both are the generic lowering (`dataflow.dfg.index`) of `C[i,j] = A[i,j] + B[i,j]` or
`A[i,j] * B[i,j]`: two dense operands give one vectorised loop nest over i, j; a sparse operand
makes the lowering co-iterate (`dataflow.dfg.index.merge`): the merge of the operands' sorted
coordinate lists is resolved when lowering (the symbolic phase, `coiterate`), and the kernel
(the numeric phase) streams the merged structure S, reading each operand directly, through
crd, or through its position map (PIT's SRead).

Operands arrive as level arrays of a 2-D row-major view (the frontend flattens other ranks).
"""

from __future__ import annotations

import numpy as np

from dataflow.dfg.graph import DFGError, Kernel, Program
from dataflow.dfg.index.lower import index_kernel
from dataflow.dfg.index.merge import KINDS, Coiteration, EwOperand, coiterate, merge_kernel
from dataflow.dfg.index.program import index_program
from dataflow.dfg.index.tensors import TensorLevels, csr, dense
from dataflow.dfg.lower import run_passes

__all__ = ["KINDS", "Coiteration", "EwOperand", "coiterate", "coiteration_kernel",
           "dense_elementwise_kernel", "lower_elementwise"]


def _statement(kind: str) -> str:
    if kind not in KINDS:
        raise DFGError(f"unknown element-wise op {kind!r}; choose one of {list(KINDS)}")
    return f"C[i,j] = A[i,j] {'+' if kind == 'add' else '*'} B[i,j]"


def dense_elementwise_kernel(kind: str, r: int, c: int) -> Kernel:
    """C[i, j] = A[i, j] op B[i, j], j vectorised over the SIMD lanes (the generic lowering
    over row-major operands)."""
    return index_kernel(_statement(kind), {"A": dense((r, c)), "B": dense((r, c))},
                        name=f"{kind}_dense")


def coiteration_kernel(kind: str, co: Coiteration, dense: tuple[bool, bool], sizes: tuple[int, int],
                       sparse_output: bool) -> Kernel:
    """for i, for p in S.pos[i]..S.pos[i+1]: C(p) = A(p) op B(p) (`merge.merge_kernel`)."""
    return merge_kernel(kind, co, dense, sizes, sparse_output)


def _levels(x: EwOperand, shape: tuple[int, int]) -> TensorLevels:
    return dense(shape, val=x.val) if x.is_dense else csr(shape, x.pos, x.crd, x.val)


def lower_elementwise(kind: str, shape: tuple[int, int], a: EwOperand, b: EwOperand,
                      dtype=np.float32, sparse_output: bool | None = None,
                      co: Coiteration | None = None) -> Program:
    """The program for A op B on a 2-D view of `shape`. The output `C` is the values along the
    merged structure S (`sparse_output`, default when both operands are sparse) or the dense
    row-major R*C result. `co`: a `coiterate` result to reuse (else computed here)."""
    r, c = (int(v) for v in shape)
    stmt = _statement(kind)
    if a.is_dense and b.is_dense:
        sparse_output, co = False, None
    elif sparse_output is None:
        sparse_output = not a.is_dense and not b.is_dense
    tensors = {"A": _levels(a, (r, c)), "B": _levels(b, (r, c)),
               "C": csr((r, c)) if sparse_output else dense((r, c))}
    if a.is_dense and b.is_dense:
        kernel, program = f"{kind}_dense", f"{kind}_dense_{r}x{c}"
    else:
        co = co or coiterate(kind, (r, c), a, b)
        kernel, program = f"{kind}_coiterate", f"{kind}_coiterate_{r}x{c}_nnz{co.nnz}"
    prog = index_program(stmt, tensors, name=kernel, program_name=program, dtype=dtype,
                         coiteration=co)
    return run_passes(prog)
