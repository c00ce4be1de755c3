"""Polymorphic ops of the frontend on numpy / scipy / torch / UST operands, with plan/execute.

The frontend turns operands into UST `Tensor`s (views, no copies) and chooses the kernel by
their formats: dense x dense -> GEMM, sparse x dense -> SpMM (SpMV when B is a vector: a BSR
operand, or a DIA one times a vector, on its own format through the generic lowering, any
other over CSR), sparse x sparse -> SpGEMM. Every op runs on a backend: `numpy` (the reference, the
definition of the op) or `sim` (lower -> map -> cycle-level engine).

The stateful ops follow nvmath-python: `Matmul(a, b, ...)`, `.plan(...)` (the expensive,
value-independent step; cached, see `dataflow.ust_frontend.cache`), `.execute(backend=...)`
(as often as wanted; `.reset_operands(...)` swaps in new values of the same structure).
`matmul`, `sddmm`, `add`, `multiply` are the one-shot function forms.

This module is the frontend's one place to import the ops from; they live in `op_base.py`
(operands, the matmul lowering, `_StatefulOp`), `matmul_op.py` and `sddmm_op.py`, and the
numpy definitions in `reference.py`.
"""

from __future__ import annotations

from dataflow.ust_frontend.backends import (
    BACKEND_MODULES,
    BACKENDS,
    OP_FAMILIES,
    available_backends,
    get_executor,
    register_backend,
    unregister_backend,
)
from dataflow.ust_frontend.matmul_op import Matmul, matmul
from dataflow.ust_frontend.op_base import _StatefulOp, as_tensor, lower_matmul, spgemm_structure
from dataflow.ust_frontend.plan import PlanMismatchError
from dataflow.ust_frontend.reference import (
    SEMIRINGS,
    csr_arrays,
    elementwise,
    is_dense,
    matmul_reference,
    resolve_semiring,
    semiring_matmul,
    spgemm_reference,
)
from dataflow.ust_frontend.sddmm_op import Elementwise, Sddmm, add, multiply, sddmm

__all__ = [
    "BACKENDS", "BACKEND_MODULES", "OP_FAMILIES", "SEMIRINGS", "Elementwise", "Matmul",
    "PlanMismatchError", "Sddmm", "_StatefulOp", "add", "as_tensor", "available_backends",
    "csr_arrays", "elementwise", "get_executor", "is_dense", "lower_matmul", "matmul",
    "matmul_reference", "multiply", "register_backend", "resolve_semiring", "sddmm",
    "semiring_matmul", "spgemm_reference", "spgemm_structure", "unregister_backend",
]
