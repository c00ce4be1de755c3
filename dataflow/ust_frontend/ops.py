"""Polymorphic ops of the frontend: `matmul` on numpy / scipy / torch / UST operands.

The frontend turns operands into UST `Tensor`s (views, no copies), chooses the kernel by their
formats (dense x dense -> GEMM, sparse x dense -> SpMM over CSR), and runs it on a backend:
`numpy` (the reference, the definition of the op) or `sim` (lower -> map -> cycle-level engine).
"""

from __future__ import annotations

import numpy as np

from dataflow.ust_frontend.named import NamedFormats
from dataflow.ust_frontend.tensor import Tensor

BACKENDS = ("numpy", "sim")


def as_tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor.from_package(x)


def is_dense(t: Tensor) -> bool:
    return t.tensor_format.is_dense


def _check_shapes(a: Tensor, b: Tensor) -> None:
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ValueError(f"matmul takes matrices; got shapes {a.shape} and {b.shape}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul shapes do not agree: {a.shape} @ {b.shape} "
                         f"({a.shape[1]} != {b.shape[0]})")


def csr_arrays(a: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pos, crd, val) of `a` in CSR, converting through level iteration when needed."""
    csr = a if a.tensor_format == NamedFormats.CSR else a.convert(tensor_format=NamedFormats.CSR)
    return csr.pos(1), csr.crd(1), csr.val


def lower_matmul(a: Tensor, b: Tensor, dtype=np.float32):
    """The `Program` for a @ b (dense GEMM or CSR SpMM)."""
    from dataflow.dfg.lower import lower_gemm, lower_spmm_csr

    _check_shapes(a, b)
    if not is_dense(b):
        b_dense = b.to_dense()
    else:
        b_dense = b.to_dense()
    if is_dense(a):
        return lower_gemm(a.to_dense(), b_dense, dtype)
    pos, crd, val = csr_arrays(a)
    return lower_spmm_csr(a.shape, pos, crd, val, b_dense, dtype)


def matmul_reference(a: Tensor, b: Tensor) -> np.ndarray:
    """The definition: a @ b in float64 from the stored entries, returned as float32."""
    _check_shapes(a, b)
    ad = a.to_dense().astype(np.float64)
    bd = b.to_dense().astype(np.float64)
    return (ad @ bd).astype(np.float32)


def _wrap_like(result: np.ndarray, like):
    """Return `result` in the package of the first operand (numpy, scipy -> numpy, torch)."""
    try:
        import torch

        if isinstance(like, torch.Tensor):
            return torch.from_numpy(result)
    except ImportError:
        pass
    if isinstance(like, Tensor):
        return Tensor.from_package(result)
    return result


def matmul(a, b, backend: str = "numpy", arch=None, dataflow: str | None = None,
           return_result: bool = False):
    """a @ b on `backend`; the product comes back in the operands' package.

    `arch` (an ArchSpec or a YAML path; default `arch_configs/default.yaml`) is used by the
    `sim` backend. With `return_result=True` returns (product, SimResult or None).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    ta, tb = as_tensor(a), as_tensor(b)
    if backend == "numpy":
        out, res = matmul_reference(ta, tb), None
    else:
        from dataflow.api import resolve_arch
        from dataflow.mapper import map_program
        from dataflow.pe_array.simulate import simulate_mapping

        arch = resolve_arch(arch)
        prog = lower_matmul(ta, tb)
        res = simulate_mapping(map_program(prog, arch, dataflow=dataflow))
        out = res.output
    out = _wrap_like(np.asarray(out), a)
    return (out, res) if return_result else out
