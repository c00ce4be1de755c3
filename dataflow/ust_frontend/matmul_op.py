"""`Matmul` and `matmul`: nvmath-python's stateful and one-shot matrix products (c := epilog(
alpha * a @ b + beta * c)) on every backend."""

from __future__ import annotations

import numpy as np

from dataflow.errors import UserError
from dataflow.ust_frontend.extras import warn_if_grad
from dataflow.ust_frontend.interop import (
    is_device_array,
    is_torch,
    numpy_array,
)
from dataflow.ust_frontend.op_base import (
    _check_backend,
    _StatefulOp,
    _with_values,
    _wrap_like,
    as_tensor,
    lower_matmul,
    spgemm_structure,
)
from dataflow.ust_frontend.plan import (
    Plan,
    run_plan,
)
from dataflow.ust_frontend.reference import (  # re-exported: the definitions live there
    _check_shapes,
    elementwise,
    is_dense,
    matmul_reference,
    resolve_semiring,
    result_dtype,
    semiring_matmul,
    spgemm_reference,
)
from dataflow.ust_frontend.tensor import Tensor


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


