"""The numpy definitions of the frontend's matmul family (the reference every backend is
checked against) and the semirings the ops accept."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dataflow.errors import UserError
from dataflow.ust_frontend.interop import scipy_sparse
from dataflow.ust_frontend.named import NamedFormats
from dataflow.ust_frontend.tensor import Tensor

# name -> (add, mul, zero); zero is the identity of add (what an absent entry contributes)
SEMIRINGS: dict[str, dict] = {
    "plus_times": {"add": np.add, "mul": np.multiply, "zero": 0.0},
    "max_plus": {"add": np.maximum, "mul": np.add, "zero": -np.inf},
    "min_plus": {"add": np.minimum, "mul": np.add, "zero": np.inf},
    "max_times": {"add": np.maximum, "mul": np.multiply, "zero": -np.inf},
}


class ScalarOrArray:
    """A callable written for arrays or for one scalar (``math.sin``, ``max``): called on the
    whole arrays first; when that raises (numpy's "only 0-dimensional arrays", "truth value
    ... ambiguous") or does not keep the broadcast shape, applied element by element."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self._per_element = False

    def __call__(self, *args):
        arrays = [np.asarray(x) for x in args]
        shape = np.broadcast_shapes(*(x.shape for x in arrays))
        if not self._per_element:
            try:
                out = self.fn(*arrays)
                if np.shape(out) == shape:
                    return out
            except (TypeError, ValueError):
                pass
            self._per_element = True
        return np.vectorize(self.fn, otypes=[np.result_type(*arrays)])(*arrays)


def elementwise(fn: Callable | None) -> Callable | None:
    """`fn` as an elementwise array function (ufuncs as they are; see `ScalarOrArray`)."""
    if fn is None or isinstance(fn, (np.ufunc, ScalarOrArray)):
        return fn
    if not callable(fn):
        raise UserError(f"expected a callable (prolog, epilog or semiring op), got {fn!r}")
    return ScalarOrArray(fn)


def result_dtype(*dtypes) -> np.dtype:
    """The dtype of a product of operands of these dtypes: numpy's promotion for floating and
    complex operands (float16 stays float16), float64 for integer ones."""
    dt = np.result_type(*dtypes)
    return dt if np.issubdtype(dt, np.inexact) else np.dtype(np.float64)


def accumulate_dtype(dt) -> np.dtype:
    """The dtype the numpy reference accumulates in: complex128 or float64."""
    return np.dtype(np.complex128 if np.issubdtype(dt, np.complexfloating) else np.float64)


def resolve_semiring(semiring) -> dict | None:
    """None for plus-times (the default), else a dict with "add", "mul" and "zero" (nvmath's
    extra "atomic_add" is accepted and not needed). The callables may be written for one
    scalar (Python's ``max``): they are applied element by element then."""
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
    if semiring is SEMIRINGS["plus_times"]:
        return None
    return {**semiring, "add": elementwise(semiring["add"]), "mul": elementwise(semiring["mul"])}


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


#: Below this many products (stored entries of A times columns of B) a sparse @ dense
#: reference is summed in numpy (`_stored_times_dense`), which spares the command the 0.3 s
#: import of scipy.sparse (the default `dataflow simulate` job: 210k; start-up, issue 14);
#: above it scipy's CSR kernel is the faster. Both add each row's products in stored order,
#: so they give the same bits (tests/test_startup.py).
NUMPY_MAX_PRODUCTS = 1 << 21


def _stored_csr(t: Tensor, dtype):
    """A sparse operand's stored entries as a scipy CSR matrix of `dtype` (stored zeros kept)."""
    pos, crd, val = csr_arrays(t)
    return scipy_sparse().csr_matrix((np.asarray(val, dtype), np.asarray(crd), np.asarray(pos)),
                                     shape=t.shape)


def _stored_times_dense(t: Tensor, dense: np.ndarray) -> np.ndarray:
    """`t @ dense` over the stored entries of a sparse `t`, in `dense`'s dtype: each row adds
    its entries' products in stored order, as scipy's CSR kernel does (hence the same bits),
    one entry slot of every row per numpy step (as many steps as the longest row has entries).
    """
    if len(t.val) * dense.shape[1] > NUMPY_MAX_PRODUCTS:
        return np.asarray(_stored_csr(t, dense.dtype) @ dense)
    pos, crd, val = csr_arrays(t)
    pos = np.asarray(pos, np.int64)
    counts = np.diff(pos)
    val = np.asarray(val, dense.dtype)
    out = np.zeros((t.shape[0], dense.shape[1]), dense.dtype)
    rows = np.arange(t.shape[0])
    for slot in range(int(counts.max(initial=0))):
        rows = rows[counts[rows] > slot]  # the rows with a slot-th entry
        at = pos[rows] + slot
        out[rows] += val[at, None] * dense[np.asarray(crd)[at]]
    return out


def matmul_reference(a: Tensor, b: Tensor) -> np.ndarray:
    """The definition: a @ b from the stored entries, accumulated in float64 (complex128 for
    complex operands) and returned in the operands' dtype (`result_dtype`).

    Only stored entries multiply (docs/conventions.md, special values): an implicit zero of a
    sparse operand contributes nothing, so an inf or NaN meets only the other operand's stored
    entries; every entry of a dense operand is stored."""
    _check_shapes(a, b)
    out = result_dtype(a.dtype, b.dtype)
    acc = accumulate_dtype(out)
    if is_dense(a) and is_dense(b):
        r = a.to_dense().astype(acc) @ b.to_dense().astype(acc)
    elif is_dense(b):
        r = _stored_times_dense(a, b.to_dense().astype(acc))
    elif is_dense(a):  # (B^T A^T)^T: scipy walks B's stored entries only
        r = (_stored_csr(b, acc).T @ a.to_dense().astype(acc).T).T
    else:
        r = (_stored_csr(a, acc) @ _stored_csr(b, acc)).toarray()
    return np.asarray(r).astype(out)


def spgemm_reference(a: Tensor, b: Tensor) -> np.ndarray:
    """Sparse x sparse through scipy (float64 / complex128 accumulate), densified, in the
    operands' dtype."""
    return matmul_reference(a, b)


def _entries_csr(t: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pos, crd, val) of the entries that take part in a product: all of a dense operand,
    the stored ones of a sparse operand."""
    if is_dense(t):
        m, k = t.shape
        return (np.arange(0, m * k + 1, k, dtype=np.int64), np.tile(np.arange(k), m),
                t.to_dense().ravel())
    return csr_arrays(t)


def semiring_matmul(a: Tensor, b: Tensor, semiring: dict, init: np.ndarray | None = None
                    ) -> np.ndarray:
    """C[i, j] = add over stored k of mul(A[i, k], B[k, j]); absent entries are `zero`.

    `add`/`mul` are elementwise callables; rows of A with no entries give `zero`. With `init`
    (nvmath's in-place c) the fold starts from init[i, j] instead: c := add(c, mul(a, b)).
    Vectorised over rows: step t combines every row's t-th entry. Returns float64."""
    _check_shapes(a, b)
    semiring = resolve_semiring(semiring) or SEMIRINGS["plus_times"]
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
    out = np.full((a.shape[0], n), zero) if init is None else \
        np.array(init, np.float64).reshape(a.shape[0], n)
    for t in range(int(counts.max()) if counts.size else 0):
        rows = np.flatnonzero(counts > t)
        p = pos[rows] + t
        out[rows] = add(out[rows], mul(val[p][:, None], bd[crd[p], :]))
    return out
