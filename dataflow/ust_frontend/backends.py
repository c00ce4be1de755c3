"""Backend dispatch of the frontend's ops: `numpy` and `sim` are built in (methods of the op
classes in `ops.py`); further backends (`cuda`, ...) register one executor per op family."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from dataflow.errors import UserError

BACKENDS = ("numpy", "sim")  # built in: methods of the op classes below

# --- backend dispatch ------------------------------------------------------------------------
#
# Further backends (`cuda`, ...) live in their own modules and register one executor per op
# family with `register_backend`. An executor is `fn(op) -> raw`: it reads the op object and
# returns the raw result, before the epilog and before wrapping in A's package (both done by
# the op, the same way for every backend). What it reads and returns, per family:
#   "matmul":      `op.prologued_operands()` -> (A, B) UST Tensors with the prolog applied
#                  (B is k x 1 for SpMV/GEMV), `op.semiring` (None = plus-times, else a dict of
#                  "add"/"mul"/"zero"); returns the dense (m, n) product as a numpy array.
#   "sddmm":       `op.dense_operands()` -> (A, B) dense numpy arrays with the prolog applied,
#                  `op.semiring` (as for matmul),
#                  `op.mask_csr()` -> the mask's CSR (pos, crd, val); returns a 1-D numpy array
#                  of one value per mask entry, in CSR order: val[p] * (A[i] . B[:, crd[p]]).
#   "elementwise": `op.kind` ("add": union of stored entries, "multiply": intersection),
#                  `op.prologued_operands()` -> (A, B) same-shape UST Tensors with the prolog
#                  applied, `op.semiring` (as for matmul); returns a dense numpy array of A's
#                  shape, or a scipy.sparse matrix when `op.sparse_result`.
# The workload packages above the frontend dispatch their own ops the same way, so that they
# never import a backend module (which sits above them); their executors take the op's
# arguments, numpy in and out:
#   "attention":   fn(q, k, v, pos, crd, pattern, pattern_params) -> (q rows, v cols) output
#                  of softmax attention restricted to the CSR mask (pos, crd).
#   "fft":         fn(x) -> the complex FFT along the last axis.
#   "butterfly":   fn(x, factors) -> x times the butterfly product of the checked factors.
#   "butterfly_linear": fn(x, factors, bias); "butterfly_ffn": fn(x, f1, f2, b1, b2);
#   "fnet_attention": fn(x) -> FNet's real part of the 2-D FFT.
# An executor that cannot run some case (e.g. a custom semiring) raises NotImplementedError
# naming it. It may leave timing or a result object on `op.last_result`.

OP_FAMILIES = ("matmul", "sddmm", "elementwise", "attention", "fft", "butterfly",
               "butterfly_linear", "butterfly_ffn", "fnet_attention")
_EXECUTORS: dict[str, dict[str, Callable]] = {f: {} for f in OP_FAMILIES}
# Imported the first time their backend is asked for and not yet registered, so that
# `matmul(..., backend="cuda")` works without importing the backend module by hand.
BACKEND_MODULES: dict[str, str] = {"cuda": "dataflow.cuda"}


def _family(op_name: str) -> str:
    fam = op_name.split(":")[0].lower()
    if fam not in OP_FAMILIES:
        raise UserError(f"unknown op {op_name!r}; backends register for one of {OP_FAMILIES}")
    return fam


def register_backend(op_name: str, backend: str, fn: Callable, *, replace: bool = False) -> None:
    """Register `fn(op) -> raw` as the executor of op family `op_name` ("matmul", "sddmm",
    "elementwise") on `backend` (see the contract above). "numpy" and "sim" are built in and
    cannot be replaced; registering a different function twice needs `replace=True`."""
    fam = _family(op_name)
    if not isinstance(backend, str) or not backend:
        raise UserError(f"backend must be a non-empty string, got {backend!r}")
    if backend in BACKENDS:
        raise UserError(f"backend {backend!r} is built in and cannot be re-registered")
    if not callable(fn):
        raise TypeError(f"executor for {fam}/{backend} must be callable, got {type(fn).__name__}")
    old = _EXECUTORS[fam].get(backend)
    if old is not None and old is not fn and not replace:
        raise UserError(f"{fam} already has a {backend!r} executor ({old!r}); "
                         "pass replace=True to swap it")
    _EXECUTORS[fam][backend] = fn


def unregister_backend(op_name: str, backend: str) -> None:
    """Remove a registered executor (tests, or a backend that found no device)."""
    _EXECUTORS[_family(op_name)].pop(backend, None)


def available_backends(op_name: str | None = None) -> tuple[str, ...]:
    """Backends that run `op_name` now (built in first), or those of every family."""
    fams = OP_FAMILIES if op_name is None else (_family(op_name),)
    extra = sorted({b for f in fams for b in _EXECUTORS[f]})
    return BACKENDS + tuple(extra)


def _autoload(backend: str) -> str | None:
    """Import the module that registers `backend`; returns why it failed, or None."""
    module = BACKEND_MODULES.get(backend)
    if module is None:
        return None
    try:
        importlib.import_module(module)
    except ImportError as e:
        return f"importing {module} failed: {e}"
    return None


def get_executor(op_name: str, backend: str) -> Callable:
    """The registered executor of `op_name` on `backend`; a clear error listing what exists."""
    fam = _family(op_name)
    why = None
    if backend not in _EXECUTORS[fam]:
        why = _autoload(backend)
    if backend not in _EXECUTORS[fam]:
        hint = f" ({why})" if why else ""
        raise UserError(f"unknown backend {backend!r} for {fam}{hint}; available: "
                         f"{', '.join(available_backends(fam))}")
    return _EXECUTORS[fam][backend]
