"""Lowering of SDDMM: C.val[p] = M.val[p] * sum_kk A[i, kk] * B[kk, M.crd[p]] over a CSR mask M.

One kernel, loops i (dense rows), p (the mask row's stored entries), kk (the reduction,
innermost, so the dot product stays in the accumulator register until p moves on). B is
streamed transposed (n x k) so the gather B^T[crd, kk] reads one contiguous row per entry.
Scalar (no vector loop): the reduction runs along kk, which the generic lowering never picks as
the vector loop. `sddmm_csr_vector_kernel` (the attention's scores) vectorises it: kk split by
the SIMD lanes, each vector's lanes summed (`vsum`) before the accumulation. Both kernels are
the generic lowering (`dataflow.dfg.index`) of their statement, the second with the schedule
`split` + `vectorise_reduction` (`dataflow.dfg.transform`).
"""

from __future__ import annotations

import numpy as np

from dataflow.dfg import transform
from dataflow.dfg.graph import DFGError, Kernel, Program
from dataflow.dfg.index.lower import index_kernel
from dataflow.dfg.index.tensors import csr, dense
from dataflow.dfg.lower import run_passes

#: the statement `sddmm_csr_kernel` lowers: the mask's values times A @ B on its entries
SDDMM = "C[i,j] = A[i,kk] * B[kk,j] * M[i,j]"


def sddmm_csr_kernel(m: int, k: int, n: int, pos: np.ndarray, name: str = "sddmm_csr") -> Kernel:
    """The generic lowering of `SDDMM` with M and C in CSR (the structure `pos` alone; C
    written at M's positions), A row-major and B column-major (stored as B^T, `BT`)."""
    return index_kernel(SDDMM, {"A": dense((m, k)), "B": dense((k, n), order=(1, 0), buffer="BT"),
                                "M": csr((m, n), pos), "C": csr((m, n), pos)}, name=name)


def lower_sddmm_csr(a: np.ndarray, b: np.ndarray, pos: np.ndarray, crd: np.ndarray,
                    val: np.ndarray, dtype=np.float32) -> Program:
    """SDDMM program for dense A (m x k), dense B (k x n) and a CSR mask (pos, crd, val) of
    shape m x n. The output `C_val` holds one value per mask entry (the mask's structure)."""
    if a.ndim != 2 or b.ndim != 2:
        raise DFGError(f"sddmm takes matrices; got A {a.shape}, B {b.shape}")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise DFGError(f"sddmm shapes do not agree: A is {m}x{k}, B is {k2}x{n} ({k} != {k2})")
    if len(pos) != m + 1 or len(crd) != len(val) or int(pos[-1]) != len(crd):
        raise DFGError(f"malformed CSR mask: pos has {len(pos)} entries for {m} rows, "
                       f"crd {len(crd)}, val {len(val)}")
    if len(crd) and (int(np.max(crd)) >= n or int(np.min(crd)) < 0):
        raise DFGError(f"CSR mask column out of range [0, {n})")
    nnz = len(val)
    prog = Program(
        name=f"sddmm_csr_{m}x{k}x{n}_nnz{nnz}", kernels=(sddmm_csr_kernel(m, k, n, pos),),
        inputs=(("M_val", np.asarray(val, dtype=dtype)), ("M_crd", np.asarray(crd, dtype=np.int64)),
                ("A", np.ascontiguousarray(a, dtype=dtype).ravel()),
                ("BT", np.ascontiguousarray(np.asarray(b).T, dtype=dtype).ravel())),
        outputs=(("C_val", (nnz,)),), dtype=np.dtype(dtype).name, macs=nnz * k,
    )
    return run_passes(prog)



#: the pattern-only SDDMM: the mask M's structure drives, its values are not read
SDDMM_PATTERN = "M[i,j] = A[i,kk] * B[kk,j]"


def sddmm_csr_vector_kernel(m: int, k: int, n: int, pos: np.ndarray, lanes: int,
                            name: str = "sddmm_csr_vector") -> Kernel:
    """Pattern-only SDDMM with the reduction vectorised: C[p] = sum over chunks c of
    vsum(A[i, c*lanes : (c+1)*lanes] * B^T[M.crd[p], c*lanes : (c+1)*lanes]).

    `k` must be a multiple of `lanes` (pad A and B^T with zero columns). Each chunk is one SIMD
    multiply and one lane sum (vsum); the scalar accumulator holds C[p] over the chunks, so the
    reduction runs `lanes` MACs per iteration instead of one as in `sddmm_csr_kernel`. The
    generic lowering of `SDDMM_PATTERN` (M's structure `pos` drives, its values buffer is
    `C_val`), kk split into chunks c of `lanes` lanes l, l vectorised
    (`transform.vectorise_reduction`)."""
    if k % lanes:
        raise DFGError(f"sddmm_csr_vector_kernel: k={k} must be a multiple of lanes={lanes}")
    kern = index_kernel(SDDMM_PATTERN, {
        "A": dense((m, k)), "B": dense((k, n), order=(1, 0), buffer="BT"),
        "M": csr((m, n), pos, buffer="C_val")}, name=name)
    return transform.vectorise_reduction(transform.split(kern, "kk", lanes, outer="c",
                                                         inner="l"), "l")
