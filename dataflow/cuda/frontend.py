"""`backend="cuda"` for the UST frontend ops (`dataflow.ust_frontend.ops.register_backend`).

matmul: dense x dense runs the tiled GEMM kernel; sparse A (any UST format, converted to CSR)
x dense B runs the CSR SpMM kernel; a sparse B runs it as C^T = B^T A^T (only stored entries
multiply). Custom semirings have no CUDA kernel and say so. The kernels compute in float32;
complex operands run as four real products (`Matmul.real_products`); the op then applies alpha,
beta and c and casts to the operands' dtype, as on every backend. sddmm: the SDDMM kernel
over the mask's CSR.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dataflow.attention.patterns import AttentionPattern, resolve
from dataflow.cuda import ops
from dataflow.ust_frontend.backends import register_backend
from dataflow.ust_frontend.ops import csr_arrays, is_dense


def _csr_t(t):
    """(pos, crd, val, shape) of the transpose of sparse `t`, in CSR (stored zeros kept)."""
    pos, crd, val = csr_arrays(t)
    m = sp.csr_matrix((np.asarray(val, np.float32), np.asarray(crd), np.asarray(pos)),
                      shape=t.shape).T.tocsr()
    return m.indptr, m.indices, m.data, m.shape


def matmul_executor(op) -> np.ndarray:
    """Only stored entries multiply (docs/conventions.md, special values): the CSR SpMM kernel
    walks the sparse side's stored entries, so a sparse B is the CSR side of C^T = B^T A^T
    unless densifying it is exact (A sparse with finite stored values: x * 0 = 0)."""
    if op.semiring is not None:
        raise NotImplementedError("matmul on cuda: only the plus-times semiring has a kernel; "
                                  "use backend='numpy' for custom semirings")
    outs = [_real_matmul(a, b) for a, b in op.real_products()]
    if len(outs) == 1:
        return outs[0]
    return (outs[0] - outs[1]) + 1j * (outs[2] + outs[3])


def _real_matmul(a, b) -> np.ndarray:
    """One real product on the kernels, multiplying stored entries only."""
    if is_dense(a) and is_dense(b):
        return ops.gemm(np.asarray(a.to_dense(), np.float32),
                        np.asarray(b.to_dense(), np.float32))
    if not is_dense(a) and (is_dense(b) or np.isfinite(np.asarray(a.val)).all()):
        pos, crd, val = csr_arrays(a)
        return ops.spmm(pos, crd, np.asarray(val, np.float32), a.shape,
                        np.asarray(b.to_dense(), np.float32))
    if not is_dense(a) and not np.isfinite(np.asarray(b.val)).all():
        raise NotImplementedError("matmul on cuda: sparse A and sparse B that both store inf "
                                  "or NaN have no kernel that multiplies stored entries only; "
                                  "use backend='numpy' or 'sim'")
    at = np.ascontiguousarray(np.asarray(a.to_dense(), np.float32).T)
    return np.ascontiguousarray(ops.spmm(*_csr_t(b), at).T)


def sddmm_executor(op) -> np.ndarray:
    if getattr(op, "semiring", None) is not None:
        raise NotImplementedError("sddmm on cuda: only the plus-times semiring has a kernel; "
                                  "use backend='numpy' for custom semirings")
    a, b = op.dense_operands()
    pos, crd, val = op.mask_csr()
    return ops.sddmm(a, b, pos, crd, val)


def attention_executor(q, k, v, pos, crd, pattern, pattern_params: dict | None = None, *,
                       runner=None) -> np.ndarray:
    """`dataflow.sparse_attention(..., backend="cuda")`: window and dilated patterns run the
    fused kernel in its affine mode (keys computed, no index arrays), any other pattern or
    mask over its CSR (pos, crd)."""
    p = pattern
    if isinstance(p, str):
        p = resolve(p, q.shape[0], **{k_: v_ for k_, v_ in (pattern_params or {}).items()
                                      if v_ is not None})
    if isinstance(p, AttentionPattern) and p.name in ("window", "dilated"):
        prm = dict(p.params)
        return ops.sparse_attention(q, k, v, window=prm["window"],
                                    dilation=prm.get("dilation", 1), runner=runner)
    return ops.sparse_attention(q, k, v, pos, crd, runner=runner)


def register() -> None:
    register_backend("matmul", "cuda", matmul_executor)
    register_backend("sddmm", "cuda", sddmm_executor)
    register_backend("attention", "cuda", attention_executor)
    register_backend("fft", "cuda", ops.fft)
    register_backend("butterfly", "cuda", ops.butterfly)
    register_backend("butterfly_linear", "cuda", ops.butterfly_linear)
    register_backend("butterfly_ffn", "cuda", ops.butterfly_ffn)
    register_backend("fnet_attention", "cuda", ops.fnet_attention)
