"""`backend="cuda"` for the UST frontend ops (`dataflow.ust_frontend.ops.register_backend`).

matmul: dense x dense runs the tiled GEMM kernel; sparse A (any UST format, converted to CSR)
x dense B runs the CSR SpMM kernel; a sparse B is densified first (as the sim backend does).
Custom semirings have no CUDA kernel and say so. sddmm: the SDDMM kernel over the mask's CSR.
"""

from __future__ import annotations

import numpy as np


def matmul_executor(op) -> np.ndarray:
    from dataflow.cuda import ops
    from dataflow.ust_frontend.ops import csr_arrays, is_dense

    if op.semiring is not None:
        raise NotImplementedError("matmul on cuda: only the plus-times semiring has a kernel; "
                                  "use backend='numpy' for custom semirings")
    a, b = op.prologued_operands()
    bd = np.asarray(b.to_dense(), np.float32)
    if is_dense(a):
        return ops.gemm(np.asarray(a.to_dense(), np.float32), bd)
    pos, crd, val = csr_arrays(a)
    return ops.spmm(pos, crd, val, a.shape, bd)


def sddmm_executor(op) -> np.ndarray:
    from dataflow.cuda import ops

    if getattr(op, "semiring", None) is not None:
        raise NotImplementedError("sddmm on cuda: only the plus-times semiring has a kernel; "
                                  "use backend='numpy' for custom semirings")
    a, b = op.dense_operands()
    pos, crd, val = op.mask_csr()
    return ops.sddmm(a, b, pos, crd, val)


def register() -> None:
    from dataflow.ust_frontend.ops import register_backend

    register_backend("matmul", "cuda", matmul_executor)
    register_backend("sddmm", "cuda", sddmm_executor)
