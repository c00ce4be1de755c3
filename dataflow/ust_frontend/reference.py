"""The numpy definitions of the frontend's matmul family (the reference every backend is
checked against) and the semirings the ops accept."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dataflow.errors import UserError
from dataflow.ust_frontend.named import NamedFormats
from dataflow.ust_frontend.tensor import Tensor

# name -> (add, mul, zero); zero is the identity of add (what an absent entry contributes)
SEMIRINGS: dict[str, dict] = {
    "plus_times": {"add": np.add, "mul": np.multiply, "zero": 0.0},
    "max_plus": {"add": np.maximum, "mul": np.add, "zero": -np.inf},
    "min_plus": {"add": np.minimum, "mul": np.add, "zero": np.inf},
    "max_times": {"add": np.maximum, "mul": np.multiply, "zero": -np.inf},
}


def resolve_semiring(semiring) -> dict | None:
    """None for plus-times (the default), else a dict with "add", "mul" and "zero"."""
    if semiring is None:
        return None
    if isinstance(semiring, str):
        if semiring not in SEMIRINGS:
            raise UserError(f"unknown semiring {semiring!r}; choose one of {list(SEMIRINGS)}"
                             " or pass {'add': f, 'mul': g, 'zero': z}")
        semiring = SEMIRINGS[semiring]
    if not isinstance(semiring, dict) or not {"add", "mul"} <= set(semiring):
        raise UserError("a semiring needs 'add' and 'mul' callables (and 'zero', the "
                         "identity of add; default 0)")
    return None if semiring is SEMIRINGS["plus_times"] else semiring


def is_dense(t: Tensor) -> bool:
    return t.tensor_format.is_dense


def _check_shapes(a: Tensor, b: Tensor) -> None:
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise UserError(f"matmul takes matrices; got shapes {a.shape} and {b.shape}")
    if a.shape[1] != b.shape[0]:
        raise UserError(f"matmul shapes do not agree: {a.shape} @ {b.shape} "
                         f"({a.shape[1]} != {b.shape[0]})")


def csr_arrays(a: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pos, crd, val) of `a` in CSR, converting through level iteration when needed."""
    csr = a if a.tensor_format == NamedFormats.CSR else a.convert(tensor_format=NamedFormats.CSR)
    return csr.pos(1), csr.crd(1), csr.val


def _stored_csr(t: Tensor) -> sp.csr_matrix:
    """A sparse operand's stored entries as a float64 scipy CSR matrix (stored zeros kept)."""
    pos, crd, val = csr_arrays(t)
    return sp.csr_matrix((np.asarray(val, np.float64), np.asarray(crd), np.asarray(pos)),
                         shape=t.shape)


def matmul_reference(a: Tensor, b: Tensor) -> np.ndarray:
    """The definition: a @ b in float64 from the stored entries, returned as float32.

    Only stored entries multiply (docs/conventions.md, special values): an implicit zero of a
    sparse operand contributes nothing, so an inf or NaN meets only the other operand's stored
    entries; every entry of a dense operand is stored."""
    _check_shapes(a, b)
    if is_dense(a) and is_dense(b):
        out = a.to_dense().astype(np.float64) @ b.to_dense().astype(np.float64)
    elif is_dense(b):
        out = _stored_csr(a) @ b.to_dense().astype(np.float64)
    elif is_dense(a):  # (B^T A^T)^T: scipy walks B's stored entries only
        out = (_stored_csr(b).T @ a.to_dense().astype(np.float64).T).T
    else:
        out = (_stored_csr(a) @ _stored_csr(b)).toarray()
    return np.asarray(out).astype(np.float32)


def spgemm_reference(a: Tensor, b: Tensor) -> np.ndarray:
    """Sparse x sparse through scipy (float64 accumulate), densified, as float32."""
    return matmul_reference(a, b)


def _entries_csr(t: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pos, crd, val) of the entries that take part in a product: all of a dense operand,
    the stored ones of a sparse operand."""
    if is_dense(t):
        m, k = t.shape
        return (np.arange(0, m * k + 1, k, dtype=np.int64), np.tile(np.arange(k), m),
                t.to_dense().ravel())
    return csr_arrays(t)


def semiring_matmul(a: Tensor, b: Tensor, semiring: dict) -> np.ndarray:
    """C[i, j] = add over stored k of mul(A[i, k], B[k, j]); absent entries are `zero`.

    `add`/`mul` are elementwise numpy callables; rows of A with no entries give `zero`.
    Vectorised over rows: step t combines every row's t-th entry. Returns float64."""
    _check_shapes(a, b)
    add, mul, zero = semiring["add"], semiring["mul"], float(semiring.get("zero", 0.0))
    k, n = b.shape
    if is_dense(b):
        bd = b.to_dense().astype(np.float64)
    else:
        bd = np.full((k, n), zero)
        bp, bc, bv = csr_arrays(b)
        bd[np.repeat(np.arange(k), np.diff(bp)), bc] = bv
    pos, crd, val = _entries_csr(a)
    pos, crd, val = np.asarray(pos), np.asarray(crd), np.asarray(val, np.float64)
    counts = np.diff(pos)
    out = np.full((a.shape[0], n), zero)
    for t in range(int(counts.max()) if counts.size else 0):
        rows = np.flatnonzero(counts > t)
        p = pos[rows] + t
        out[rows] = add(out[rows], mul(val[p][:, None], bd[crd[p], :]))
    return out
