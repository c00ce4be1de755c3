"""Polymorphic ops of the frontend on numpy / scipy / torch / UST operands, with plan/execute.

The frontend turns operands into UST `Tensor`s (views, no copies) and chooses the kernel by
their formats: dense x dense -> GEMM, sparse x dense -> SpMM over CSR (SpMV when B is a
vector), sparse x sparse -> SpGEMM. Every op runs on a backend: `numpy` (the reference, the
definition of the op) or `sim` (lower -> map -> cycle-level engine).

The stateful ops follow nvmath-python: `Matmul(a, b, ...)`, `.plan(...)` (the expensive,
value-independent step; cached, see `dataflow.ust_frontend.cache`), `.execute(backend=...)`
(as often as wanted; `.reset_operands(...)` swaps in new values of the same structure).
`matmul`, `sddmm`, `add`, `multiply` are the one-shot function forms.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import scipy.sparse as sp

from dataflow.arch import resolve_arch
from dataflow.dfg.lower import lower_gemm, lower_spmm_csr
from dataflow.dfg.lower_elementwise import EwOperand, coiterate, lower_elementwise
from dataflow.dfg.lower_sddmm import lower_sddmm_csr
from dataflow.dfg.lower_spgemm import gustavson_symbolic, lower_spgemm_csr
from dataflow.errors import UserError
from dataflow.ust_frontend.backends import (
    BACKEND_MODULES,
    BACKENDS,
    OP_FAMILIES,
    available_backends,
    get_executor,
    register_backend,
    unregister_backend,
)
from dataflow.ust_frontend.cache import PlanCache, default_cache
from dataflow.ust_frontend.extras import warn_if_grad
from dataflow.ust_frontend.interop import (
    is_cupy,
    is_device_array,
    is_torch,
    numpy_array,
    to_device_like,
)
from dataflow.ust_frontend.named import NamedFormats
from dataflow.ust_frontend.plan import (
    Plan,
    PlanMismatchError,
    build_plan,
    plan_key,
    run_plan,
    signature,
)
from dataflow.ust_frontend.reference import (  # re-exported: the definitions live there
    SEMIRINGS,
    _check_shapes,
    _entries_csr,
    csr_arrays,
    elementwise,
    is_dense,
    matmul_reference,
    resolve_semiring,
    result_dtype,
    semiring_matmul,
    spgemm_reference,
)
from dataflow.ust_frontend.tensor import Tensor


def as_tensor(x, name: str = "operand") -> Tensor:
    """`x` as a UST Tensor on the host: a view of numpy / scipy / torch buffers; GPU (cupy)
    operands are copied to the host once, since the numpy and sim backends compute there
    (a registered GPU backend can read the original from the op's `_a_package`)."""
    if x is None:
        raise UserError(f"operand {name!r} is required, got None")
    t = x if isinstance(x, Tensor) else Tensor.from_package(x)
    return t.to_host()


def _check_backend(backend: str, op_name: str = "matmul") -> None:
    if backend not in BACKENDS:
        get_executor(op_name, backend)


def lower_matmul(a: Tensor, b: Tensor, dtype=np.float32, structure=None):
    """The `Program` for a @ b: dense GEMM, CSR SpMM (sparse A, dense B), or Gustavson SpGEMM
    when B is sparse (A read as CSR; a dense A as CSR with every entry). The GEMM/SpMM output
    `C` is the dense product; the SpGEMM output `C_val` holds C's values along the structure
    `spgemm_structure(a, b)` (pass it as `structure` to skip the symbolic phase)."""

    _check_shapes(a, b)
    if not is_dense(b):

        (ap, ac, av), (bp, bc, bv) = _entries_csr(a), csr_arrays(b)
        return lower_spgemm_csr(a.shape, ap, ac, av, b.shape, bp, bc, bv, dtype,
                                structure=structure)
    b_dense = b.to_dense()
    if is_dense(a):
        return lower_gemm(a.to_dense(), b_dense, dtype)
    pos, crd, val = csr_arrays(a)
    return lower_spmm_csr(a.shape, pos, crd, val, b_dense, dtype)


def spgemm_structure(a: Tensor, b: Tensor):
    """Gustavson's symbolic phase for a @ b with B sparse (`SpgemmStructure`: C's CSR
    structure and each entry's partial products); reads no values."""

    _check_shapes(a, b)
    (ap, ac, _), (bp, bc, _) = _entries_csr(a), csr_arrays(b)
    return gustavson_symbolic(a.shape, ap, ac, b.shape, bp, bc)


def _with_values(t: Tensor, fn: Callable | None) -> Tensor:
    """`t` with `fn` applied to its stored values (same structure, so the same plan)."""
    if fn is None:
        return t
    val = np.asarray(elementwise(fn)(np.asarray(t.val)))
    if val.shape != t.val.shape:
        raise UserError(f"prolog must be elementwise: {t.val.shape} values became {val.shape}")
    levels = range(t.num_levels)
    return Tensor(t.tensor_format, t.shape, [t.pos(lv) for lv in levels],
                  [t.crd(lv) for lv in levels], val)


def _wrap_like(result: np.ndarray, like):
    """Return `result` in the package of the first operand (numpy, scipy -> numpy, torch)."""
    torch = sys.modules.get("torch")  # a torch operand means torch is imported already
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.from_numpy(result)
    if isinstance(like, Tensor):  # a UST result backed by the package A's buffers came from
        if (like.package or "").startswith("torch"):
            import torch  # the torch extra; present, since A views torch buffers

            return Tensor.from_package(torch.from_numpy(result))
        return Tensor.from_package(result)

    return to_device_like(result, like)  # back to the GPU for cupy operands


class _StatefulOp:
    """plan()/execute() shared by the stateful ops. Subclasses set `op`, `_operands()`,
    `_lower()` (sim program from current values), `_reference()` and `_finish(raw)`."""

    op = "op"

    def __init__(self):
        self._plan: Plan | None = None
        self.plan_source: str | None = None  # "built", "memory" or "disk"
        self.last_result = None  # SimResult of the last sim execute

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def free(self) -> None:
        """Drop the plan and the last result (nvmath's `free`; nothing else is held)."""
        self._plan, self.last_result = None, None

    def _signatures(self):
        return tuple(signature(t) for t in self._operands())

    def _notes(self) -> tuple[str, ...]:
        return ()

    semiring: dict | None = None  # None: plus-times

    def _sim_check(self) -> None:
        if self.semiring is not None:
            raise NotImplementedError(
                f"{self.op}: the sim backend computes plus-times only (the engine's ACC adds, "
                "and absent entries read as 0); run this custom semiring with "
                "backend='numpy'")

    def plan(self, arch=None, backend: str = "sim", *, dataflow: str | None = None,
             cache=None) -> Plan:
        """Lower and map (sim) or record the reference (numpy); returns the `Plan`.

        `arch`: ArchSpec, preset name or YAML path (default: the `default` preset). `cache`: a
        `PlanCache`, None for the process default (memory + `$DATAFLOW_CACHE_DIR`), or False
        to always build."""

        _check_backend(backend, self.op)
        spec = None
        if backend == "sim":

            self._sim_check()
            spec = resolve_arch(arch)
        sigs = self._signatures()
        key = plan_key(self.op, backend, sigs, spec, dataflow)

        def build() -> Plan:
            return build_plan(key, self.op, backend, sigs, spec, dataflow, lower=self._lower,
                              notes=self._notes())

        if cache is False:
            self._plan, self.plan_source = build(), "built"
        else:
            store: PlanCache = default_cache() if cache is None else cache
            self._plan, self.plan_source = store.get_or_build(key, build)
        return self._plan

    def execute(self, backend: str | None = None):
        """Run on `backend` (default: the planned one, else numpy). sim needs a sim plan for
        the current structure (planned on the default arch if none was made); other backends
        run their registered executor (`register_backend`)."""
        backend = backend or (self._plan.backend if self._plan else "numpy")
        _check_backend(backend, self.op)
        if backend == "numpy":
            return self._finish(self._reference())
        if backend not in BACKENDS:
            return self._finish(get_executor(self.op, backend)(self))
        self._sim_check()
        if self._plan is None or self._plan.backend != "sim":
            self.plan(backend="sim")
        sigs = self._signatures()
        if sigs != self._plan.operands:
            raise PlanMismatchError(
                f"{self.op}: operand structure changed since plan() "
                f"(planned {[s.text() for s in self._plan.operands]}, now "
                f"{[s.text() for s in sigs]}); call plan() again")
        return self._finish(self._run_sim())

    def _run_sim(self):
        """The raw result of the planned program on the engine (sets `last_result`)."""
        self.last_result = run_plan(self._plan, self._lower())
        return self._sim_output(self.last_result)

    def _sim_output(self, res) -> np.ndarray:
        return np.asarray(res.output)


class Matmul(_StatefulOp):
    """c := epilog(alpha * prolog_a(A) @ prolog_b(B) + beta * c) over a semiring (default:
    +, *), nvmath-python's stateful sparse matmul.

    A, B: numpy / scipy.sparse / torch / UST Tensor. B may be a vector (SpMV/GEMV: planned as
    n = 1). `c` (optional, dense, shape (m, n)): the result is written into it in place and
    `execute()` returns that same object; without `c` the result comes back in A's package (a
    dense array; SpGEMM results too). `alpha` (default 1) and `beta` (default 0, c's values
    ignored) as in BLAS; the result keeps the operands' dtype (c's when given).
    `semiring`: a name from `SEMIRINGS` or {"add", "mul", "zero"} callables (numpy backend
    only); with `c` and `beta` the fold starts from beta * c: c := add(c, mul(a, b)).
    `prologs` (nvmath's spelling; `prolog` is this project's): one callable for both operands
    or {"a": f, "b": g}, applied to stored values; `epilog`: applied elementwise to the
    result. Callables may be written for one scalar (`math.sin`, `max`). `options` (nvmath's
    MatmulOptions) is accepted and not used; `qualifiers` (transposes) are not supported.
    A context manager (`with Matmul(a, b, c) as mm:`) that frees its plan on exit."""

    def __init__(self, a, b, c=None, *, alpha=None, beta=None, qualifiers=None, options=None,
                 semiring=None, prologs=None, prolog=None, epilog=None):
        super().__init__()
        if qualifiers is not None:
            raise UserError("Matmul: qualifiers (transpose / conjugate) are not supported; "
                            "pass the transposed operand instead")
        del options  # nvmath's MatmulOptions: nothing here to configure
        self.last_results: tuple = ()  # every SimResult of the last sim execute
        self._set_callables(semiring, _one_prolog(prologs, prolog), epilog)
        self._c_package, self.c = None, None
        self.alpha, self.beta = None, None
        self.reset_operands(a, b, c, alpha=alpha, beta=beta)

    def _set_callables(self, semiring, prolog, epilog) -> None:
        self.semiring = resolve_semiring(semiring)
        if isinstance(prolog, dict) and not set(prolog) <= {"a", "b"}:
            raise UserError(f"prolog keys must be 'a' and/or 'b', got {sorted(prolog)}")
        self.prolog, self.epilog = prolog, epilog

    def plan(self, arch=None, backend: str = "sim", *, dataflow: str | None = None,
             cache=None, prologs=None, prolog=None, epilog=None, semiring=None,
             compute_capability=None) -> Plan:
        """`_StatefulOp.plan`, also taking nvmath's `prologs`, `epilog` and `semiring` (they
        replace those given to the constructor). `compute_capability` is ignored."""
        del compute_capability
        new_prolog = _one_prolog(prologs, prolog)
        if new_prolog is not None or epilog is not None or semiring is not None:
            self._set_callables(semiring if semiring is not None else self.semiring,
                                new_prolog if new_prolog is not None else self.prolog,
                                epilog if epilog is not None else self.epilog)
        return super().plan(arch, backend, dataflow=dataflow, cache=cache)

    def reset_operands(self, a=None, b=None, c=None, *, alpha=None, beta=None,
                       stream=None) -> None:
        """New operand values (and alpha, beta); the plan stays valid while formats, shapes
        and structure do."""
        del stream
        warn_if_grad("matmul", a, b, c)
        if a is not None or not hasattr(self, "a"):
            self._a_package, self.a = a, as_tensor(a, "a")
        if b is not None or not hasattr(self, "b"):
            tb = as_tensor(b, "b")
            self.vector = len(tb.shape) == 1
            if self.vector:  # SpMV / GEMV: B as a k x 1 matrix (a sparse vector is densified)
                tb = Tensor.from_package(np.ascontiguousarray(tb.to_dense()).reshape(-1, 1))
            self.b = tb
        _check_shapes(self.a, self.b)
        if alpha is not None:
            self.alpha = _scalar(alpha, "alpha")
        if beta is not None:
            self.beta = _scalar(beta, "beta")
        if c is not None:
            self._c_package, self.c = c, self._check_c(c)
        self._spgemm = None  # Gustavson's symbolic phase, once per structure
        kind = ("spgemm" if not is_dense(self.b) else "spmm") if not is_dense(self.a) else \
            ("gemm" if is_dense(self.b) else "gemm_sparse_b")
        if self.vector and kind in ("spmm", "gemm"):
            kind = {"spmm": "spmv", "gemm": "gemv"}[kind]
        self.op = f"matmul:{kind}"

    def _check_c(self, c) -> Tensor:
        if isinstance(c, str):
            raise UserError(f"matmul: c must be an array or Tensor, got the string {c!r}; "
                            "name the backend with backend=...")
        tc = as_tensor(c, "c")
        want = (self.a.shape[0],) if self.vector else (self.a.shape[0], self.b.shape[1])
        if not is_dense(tc):
            raise UserError(f"matmul: c must be dense, got {tc.tensor_format}")
        if tuple(tc.shape) not in (want, want + (1,) if self.vector else want):
            raise UserError(f"matmul: c has shape {tc.shape}, the product has {want}")
        if tc.on_device or is_device_array(c):
            raise UserError("matmul: c must be in host memory")
        return tc

    @property
    def result_dtype(self) -> np.dtype:
        """The product's dtype: c's when given, else the operands' (`result_dtype`)."""
        if self.c is not None:
            return self.c.dtype
        return result_dtype(self.a.dtype, self.b.dtype)

    @property
    def complex_parts(self) -> bool:
        """True when the engine runs the product as four real ones (complex operands)."""
        return bool(np.issubdtype(result_dtype(self.a.dtype, self.b.dtype),
                                  np.complexfloating))

    def _operands(self):
        return (self.a, self.b)

    def _notes(self) -> tuple[str, ...]:
        notes = []
        if not is_dense(self.b):
            notes.append("sim: B is sparse: Gustavson row-wise SpGEMM (symbolic phase at "
                         "lowering, one numeric kernel: gathers, multiply, accumulate per C "
                         "entry); the product comes back dense")
        if self.vector:
            notes.append("B is a vector: planned as an n = 1 matrix")
        if self.complex_parts:
            notes.append("sim: complex operands run as four real products on the engine "
                         "(re·re, im·im, re·im, im·re; `last_results` holds each SimResult, "
                         "`last_result` the first)")
        return tuple(notes)

    def prologued_operands(self) -> tuple[Tensor, Tensor]:
        """(A, B) as UST Tensors with the prolog applied to their stored values."""
        p = self.prolog
        fa, fb = (p.get("a"), p.get("b")) if isinstance(p, dict) else (p, p)
        return _with_values(self.a, fa), _with_values(self.b, fb)

    def real_products(self) -> tuple[tuple[Tensor, Tensor], ...]:
        """The real (A, B) pairs whose products make up A @ B: (A, B) itself, or for complex
        operands (re A, re B), (im A, im B), (re A, im B), (im A, re B), so that
        A @ B = (p0 - p1) + i (p2 + p3). Same structure in every pair."""
        a, b = self.prologued_operands()
        if not self.complex_parts:
            return ((a, b),)
        ra, ia = _with_values(a, np.real), _with_values(a, np.imag)
        rb, ib = _with_values(b, np.real), _with_values(b, np.imag)
        return ((ra, rb), (ia, ib), (ra, ib), (ia, rb))

    def _lower(self, pair=None):
        a, b = pair or self.real_products()[0]
        if not is_dense(b) and self._spgemm is None:
            self._spgemm = spgemm_structure(a, b)
        return lower_matmul(a, b, structure=self._spgemm)

    def _run_sim(self):
        results = tuple(run_plan(self._plan, self._lower(pair))
                        for pair in self.real_products())
        self.last_result, self.last_results = results[0], results
        outs = [self._sim_output(r) for r in results]
        if len(outs) == 1:
            return outs[0]
        return (outs[0] - outs[1]) + 1j * (outs[2] + outs[3])

    def _sim_output(self, res) -> np.ndarray:
        out = np.asarray(res.output)
        if self._spgemm is None:
            return out
        st = self._spgemm  # C's values along its structure -> the dense product
        dense = np.zeros(st.shape, out.dtype)
        dense[np.repeat(np.arange(st.shape[0]), np.diff(st.pos)), st.crd] = out
        return dense

    def _c_values(self) -> np.ndarray | None:
        """beta * c (current values of c), or None when c plays no part in the sum."""
        if self.c is None or self.beta is None or self.beta == 0:
            return None
        return self.beta * self.c.to_dense().reshape(self.a.shape[0], -1)

    def _reference(self) -> np.ndarray:
        a, b = self.prologued_operands()
        if self.semiring is not None:
            if self.alpha not in (None, 1):
                raise UserError("matmul: alpha with a custom semiring is not defined; scale "
                                "in a prolog instead")
            return semiring_matmul(a, b, self.semiring, init=self._c_values())
        if not is_dense(a) and not is_dense(b):
            return spgemm_reference(a, b)
        return matmul_reference(a, b)

    def _finish(self, raw: np.ndarray):
        out = np.asarray(raw)
        if self.semiring is None:
            if self.alpha is not None:
                out = self.alpha * out
            scaled_c = self._c_values()
            if scaled_c is not None:
                out = out + scaled_c
        if self.epilog is not None:
            out = np.asarray(elementwise(self.epilog)(out))
        out = out.astype(self.result_dtype, copy=False)
        if self.c is not None:
            return self._write_c(out)
        if self.vector:
            out = out.reshape(-1)
        return _wrap_like(np.ascontiguousarray(out), self._a_package)

    def _write_c(self, out: np.ndarray):
        """Write the result into c's buffers (c's package object sees it) and return c."""
        c, tc = self._c_package, self.c
        if isinstance(c, np.ndarray):
            c[...] = out.reshape(c.shape)
            return c
        if not isinstance(c, Tensor) and is_torch(c):
            import torch  # the torch extra: c is a torch tensor, so torch is present

            with torch.no_grad():
                c.copy_(torch.from_numpy(np.ascontiguousarray(out)).reshape(c.shape))
            return c
        numpy_array(tc.tensor_format, tc.shape, tc.val)[...] = out.reshape(tc.shape)
        return c


def _one_prolog(prologs, prolog):
    """nvmath's `prologs` or this project's `prolog` (one of them)."""
    if prologs is not None and prolog is not None:
        raise UserError("give prologs= (nvmath's name) or prolog=, not both")
    return prologs if prologs is not None else prolog


def _scalar(x, name: str):
    """alpha / beta as a Python number (complex kept)."""
    if isinstance(x, bool) or not np.isscalar(x) and np.ndim(x) != 0:
        raise UserError(f"{name} must be a scalar, got {x!r}")
    value = complex(x) if np.iscomplexobj(x) else float(x)
    return value


class Sddmm(_StatefulOp):
    """C = mask ⊙ (A @ B) on the mask's stored entries: C.val[p] = mask.val[p] * (A[i] . B[:, j]).

    A (m x k) and B (k x n) dense, mask (m x n) sparse in any format; the result is a CSR
    `Tensor` with the mask's structure. `prolog` ({"a": f, "b": g} or one callable for both)
    maps A and B elementwise first; `epilog` maps the result's values. `semiring` (numpy
    backend only): C.val[p] = mul(mask.val[p], add over k of mul(A[i, k], B[k, j])). sim
    lowers to the SDDMM kernel of `dataflow.dfg.lower_sddmm`."""

    op = "sddmm"

    def __init__(self, a, b, mask, *, semiring=None, prolog=None, epilog=None):
        super().__init__()
        self.semiring = resolve_semiring(semiring)
        if isinstance(prolog, dict) and not set(prolog) <= {"a", "b"}:
            raise UserError(f"prolog keys must be 'a' and/or 'b', got {sorted(prolog)}")
        self.prolog, self.epilog = prolog, epilog
        self.reset_operands(a, b, mask)

    def reset_operands(self, a=None, b=None, mask=None) -> None:
        warn_if_grad("sddmm", a, b)
        if a is not None:
            self.a = as_tensor(a)
        if b is not None:
            self.b = as_tensor(b)
        if mask is not None:
            self.mask = as_tensor(mask)
        _check_shapes(self.a, self.b)
        if tuple(self.mask.shape) != (self.a.shape[0], self.b.shape[1]):
            raise UserError(f"sddmm mask shape {self.mask.shape} != A @ B shape "
                             f"{(self.a.shape[0], self.b.shape[1])}")
        self._csr = csr_arrays(self.mask)

    def _operands(self):
        return (self.a, self.b, self.mask)

    def mask_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The mask's (pos, crd, val) in CSR: the result's structure, in this order."""
        return self._csr

    def dense_operands(self) -> tuple[np.ndarray, np.ndarray]:
        """(A, B) as dense numpy arrays with the prolog applied."""
        return self._dense_ab()

    def _dense_ab(self) -> tuple[np.ndarray, np.ndarray]:
        p = self.prolog
        fa, fb = (p.get("a"), p.get("b")) if isinstance(p, dict) else (p, p)
        return _with_values(self.a, fa).to_dense(), _with_values(self.b, fb).to_dense()

    def _lower(self):
        pos, crd, val = self._csr
        return lower_sddmm_csr(*self._dense_ab(), pos, crd, val)

    def _reference(self) -> np.ndarray:
        pos, crd, val = self._csr
        rows = np.repeat(np.arange(self.mask.shape[0]), np.diff(pos))
        ad, bd = (x.astype(np.float64) for x in self._dense_ab())
        val = np.asarray(val, np.float64)
        if self.semiring is None:
            return val * np.einsum("pk,kp->p", ad[rows], bd[:, crd])
        add, mul = self.semiring["add"], self.semiring["mul"]
        acc = np.full(len(val), float(self.semiring.get("zero", 0.0)))
        for kk in range(ad.shape[1]):  # vectorised over the mask's entries
            acc = add(acc, mul(ad[rows, kk], bd[kk, crd]))
        return mul(val, acc)

    def _sim_output(self, res) -> np.ndarray:
        return np.asarray(res.output).reshape(-1)

    def _finish(self, raw: np.ndarray) -> Tensor:
        val = np.asarray(raw)
        if self.epilog is not None:
            val = np.asarray(elementwise(self.epilog)(val))
        pos, crd, _ = self._csr
        return Tensor(NamedFormats.CSR, self.mask.shape, [None, pos], [None, crd],
                      val.astype(np.float32))


class Elementwise(_StatefulOp):
    """`add` (union of stored entries) or `multiply` (intersection) of two same-shape
    tensors. Two sparse 2-D operands give a sparse CSR result (a scipy matrix when A is scipy,
    else a UST Tensor; entries that come out zero are dropped, as scipy does); otherwise a
    dense array in A's package.

    `prolog` ({"a": f, "b": g} or one callable for both) maps the operands' stored values
    first (absent entries stay absent); `epilog` maps the result's values (the stored ones of a
    sparse result). sim lowers to `dataflow.dfg.lower_elementwise` (co-iteration of the
    operands' structures). `semiring` (numpy backend only): `add` applies its add, `multiply`
    its mul; an absent entry is its zero, so the result is dense (an absent result entry is
    the zero, e.g. +inf for min_plus, which no sparse package can leave implicit)."""

    _FNS: ClassVar[dict[str, str]] = {"add": "__add__", "multiply": "multiply"}

    def __init__(self, kind: str, a, b, *, semiring=None, prolog=None, epilog=None):
        super().__init__()
        self.semiring = resolve_semiring(semiring)
        if kind not in self._FNS:
            raise UserError(f"unknown elementwise op {kind!r}; choose one of {list(self._FNS)}")
        if isinstance(prolog, dict) and not set(prolog) <= {"a", "b"}:
            raise UserError(f"prolog keys must be 'a' and/or 'b', got {sorted(prolog)}")
        self.kind, self.op = kind, f"elementwise:{kind}"
        self.prolog, self.epilog = prolog, epilog
        self.reset_operands(a, b)

    def reset_operands(self, a=None, b=None) -> None:
        """New operand values; the plan stays valid while formats, shapes and structure do."""
        warn_if_grad("elementwise", a, b)
        if a is not None:
            self._a_package, self.a = a, as_tensor(a)
        if b is not None:
            self.b = as_tensor(b)
        if tuple(self.a.shape) != tuple(self.b.shape):
            raise UserError(f"{self.kind}: shapes differ, {self.a.shape} vs {self.b.shape}")
        self._coiteration = None  # the merged structure, computed once per structure

    @property
    def sparse_result(self) -> bool:
        return (not is_dense(self.a) and not is_dense(self.b) and len(self.a.shape) == 2
                and self.semiring is None)

    def _operands(self):
        return (self.a, self.b)

    def prologued_operands(self) -> tuple[Tensor, Tensor]:
        """(A, B) as UST Tensors with the prolog applied to their stored values."""
        p = self.prolog
        fa, fb = (p.get("a"), p.get("b")) if isinstance(p, dict) else (p, p)
        return _with_values(self.a, fa), _with_values(self.b, fb)

    def _view2d(self):
        shape = self.a.shape
        rows, cols = (int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]) if shape else (1, 1)
        ops = []
        for t in self.prologued_operands():
            if is_dense(t):
                ops.append(EwOperand(t.to_dense().reshape(-1)))
                continue
            if len(shape) == 2:
                pos, crd, val = csr_arrays(t)
            else:  # other ranks: rows are the leading dimensions, raveled

                coords, val = t.entries()
                r = (np.ravel_multi_index(coords[:-1], shape[:-1]) if len(shape) > 1
                     else np.zeros(len(val), np.int64))
                m = sp.csr_matrix((val, (r, coords[-1])), shape=(rows, cols))
                m.sum_duplicates()
                pos, crd, val = m.indptr, m.indices, m.data
            ops.append(EwOperand(np.asarray(val), np.asarray(pos, np.int64),
                                 np.asarray(crd, np.int64)))
        return (rows, cols), ops

    def _lower(self):
        shape, (a, b) = self._view2d()
        if self._coiteration is None and not (a.is_dense and b.is_dense):
            self._coiteration = coiterate(self.kind, shape, a, b)
        return lower_elementwise(self.kind, shape, a, b, sparse_output=self.sparse_result,
                                 co=self._coiteration)

    def _reference(self):
        a, b = self.prologued_operands()
        if self.semiring is not None:
            zero = float(self.semiring.get("zero", 0.0))
            fn = self.semiring["add" if self.kind == "add" else "mul"]
            out = fn(*(_dense_filled(t, zero) for t in (a, b)))
            return np.asarray(out).astype(np.result_type(a.dtype, b.dtype))
        if self.sparse_result:

            mats = []
            for t in (a, b):
                pos, crd, val = csr_arrays(t)
                mats.append(sp.csr_matrix((val, crd, pos), shape=t.shape))
            out = getattr(mats[0], self._FNS[self.kind])(mats[1])
            return sp.csr_matrix(out)
        ad, bd = a.to_dense(), b.to_dense()
        return np.add(ad, bd) if self.kind == "add" else np.multiply(ad, bd)

    def _sim_output(self, res):
        out = np.asarray(res.output)
        if not self.sparse_result:
            return out.reshape(self.a.shape)

        co = self._coiteration
        m = sp.csr_matrix((out, co.crd, co.pos), shape=self.a.shape)
        m.eliminate_zeros()  # as scipy's own add/multiply do
        return m

    def _finish(self, raw):
        if sp.issparse(raw):
            raw = sp.csr_matrix(raw)
            raw.sort_indices()
            if self.epilog is not None:
                raw.data = np.asarray(elementwise(self.epilog)(raw.data)).astype(raw.dtype)
            if sp.issparse(self._a_package):
                return raw

            if is_cupy(self._a_package):
                return to_device_like(raw, self._a_package)  # cupyx operands: a cupyx result
            return Tensor.from_package(raw)
        raw = np.asarray(raw)
        if self.epilog is not None:
            raw = np.asarray(elementwise(self.epilog)(raw))
        return _wrap_like(np.ascontiguousarray(raw), self._a_package)


# --- function forms ------------------------------------------------------------------------

def matmul(a, b, /, c=None, *, alpha=None, beta=None, qualifiers=None, options=None,
           prologs=None, epilog=None, semiring=None, backend: str = "numpy", arch=None,
           dataflow: str | None = None, return_result: bool = False, prolog=None,
           cache=None, execution=None, stream=None):
    """c := epilog(alpha * a @ b + beta * c) on `backend`, nvmath-python's `matmul` (see
    `Matmul`): with `c` the result is written into it and `c` is returned; without, the
    product comes back in A's package. `c` is never a backend name: pass `backend=`.

    `arch` (an ArchSpec, preset name or YAML path; default the `default` preset) is used by the
    `sim` backend, whose plan comes from the plan cache (`cache`, see `Matmul.plan`). With
    `return_result=True` returns (product, SimResult or None). `execution` and `stream`
    (nvmath's CUDA options) are accepted and not used."""
    del execution, stream
    if isinstance(backend, str):
        _check_backend(backend)
    else:
        raise UserError(f"backend must be a name, got {type(backend).__name__}")
    op = Matmul(a, b, c, alpha=alpha, beta=beta, qualifiers=qualifiers, options=options,
                semiring=semiring, prologs=prologs, prolog=prolog, epilog=epilog)
    if backend == "sim":
        op.plan(arch=arch, backend="sim", dataflow=dataflow, cache=cache)
    out = op.execute(backend)
    return (out, op.last_result) if return_result else out


def sddmm(a, b, mask, backend: str = "numpy", arch=None, dataflow: str | None = None, *,
          semiring=None, prolog=None, epilog=None, cache=None) -> Tensor:
    """mask ⊙ (a @ b) on the mask's entries, as a CSR `Tensor` (see `Sddmm`)."""
    _check_backend(backend, "sddmm")
    op = Sddmm(a, b, mask, semiring=semiring, prolog=prolog, epilog=epilog)
    if backend == "sim":
        op.plan(arch=arch, backend="sim", dataflow=dataflow, cache=cache)
    return op.execute(backend)


def _dense_filled(t: Tensor, fill: float) -> np.ndarray:
    """`t` densified in float64 with `fill` where it stores no entry (a semiring's zero)."""
    if is_dense(t):
        return t.to_dense().astype(np.float64)
    coords, values = t.entries()
    out = np.full(t.shape, fill)
    present = np.zeros(t.shape, bool)
    present[tuple(coords)] = True
    out[present] = 0.0
    np.add.at(out, tuple(coords), np.asarray(values, np.float64))
    return out


def _elementwise(kind, a, b, backend, arch, dataflow, cache, prolog, epilog, semiring):
    _check_backend(backend, "elementwise")
    op = Elementwise(kind, a, b, semiring=semiring, prolog=prolog, epilog=epilog)
    if backend == "sim":
        op.plan(arch=arch, backend="sim", dataflow=dataflow, cache=cache)
    return op.execute(backend)


def add(a, b, backend: str = "numpy", arch=None, dataflow: str | None = None, *, cache=None,
        semiring=None, prolog=None, epilog=None):
    """a + b over the union of stored entries (see `Elementwise`)."""
    return _elementwise("add", a, b, backend, arch, dataflow, cache, prolog, epilog, semiring)


def multiply(a, b, backend: str = "numpy", arch=None, dataflow: str | None = None, *,
             cache=None, semiring=None, prolog=None, epilog=None):
    """a * b elementwise over the intersection of stored entries (see `Elementwise`)."""
    return _elementwise("multiply", a, b, backend, arch, dataflow, cache, prolog, epilog,
                        semiring)


__all__ = [
    "BACKENDS",
    "BACKEND_MODULES",
    "OP_FAMILIES",
    "SEMIRINGS",
    "Elementwise",
    "Matmul",
    "PlanMismatchError",
    "Sddmm",
    "add",
    "as_tensor",
    "available_backends",
    "get_executor",
    "lower_matmul",
    "matmul",
    "matmul_reference",
    "multiply",
    "register_backend",
    "resolve_semiring",
    "sddmm",
    "semiring_matmul",
    "spgemm_reference",
    "spgemm_structure",
    "unregister_backend",
]
