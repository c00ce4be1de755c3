"""`Sddmm` and `Elementwise` (add, multiply) with their one-shot forms `sddmm`, `add`,
`multiply`."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from dataflow.arch import resolve_arch
from dataflow.dfg.lower_elementwise import EwOperand, coiterate, lower_elementwise
from dataflow.dfg.lower_sddmm import lower_sddmm_csr
from dataflow.errors import UserError
from dataflow.ust_frontend.extras import warn_if_grad
from dataflow.ust_frontend.interop import (
    is_cupy,
    is_scipy_sparse,
    scipy_sparse,
    to_device_like,
)
from dataflow.ust_frontend.named import NamedFormats
from dataflow.ust_frontend.op_base import (
    _check_backend,
    _StatefulOp,
    _with_values,
    _wrap_like,
    as_tensor,
)
from dataflow.ust_frontend.plan import Plan, plan_key
from dataflow.ust_frontend.reference import (  # re-exported: the definitions live there
    _check_shapes,
    csr_arrays,
    elementwise,
    is_dense,
    resolve_semiring,
)
from dataflow.ust_frontend.sddmm_split import plan_sddmm_split, run_sddmm_split
from dataflow.ust_frontend.tensor import Tensor


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

    _split_block: int | None = None  # columns per block when Bᵀ does not fit the SPM

    def plan(self, arch=None, backend: str = "sim", *, dataflow: str | None = None,
             cache=None) -> Plan:
        """As every op's `plan`; an SDDMM whose Bᵀ does not fit the SPM is planned as column
        blocks instead (`sddmm_split`, docs/conventions.md#sddmm-of-any-size): the plan
        holds no mapping, each block is mapped when it runs."""
        self._split_block = None
        if backend == "sim":
            self._sim_check()
            spec = resolve_arch(arch)
            block = plan_sddmm_split(spec, self.a.shape[1], self.b.shape[1], self._csr[0])
            if block is not None:
                sigs = self._signatures()
                self._split_block, self.plan_source = block, "built"
                self._plan = Plan(
                    key=plan_key(self.op, backend, sigs, spec, dataflow, f"split {block}"),
                    op=self.op, backend=backend, operands=sigs, arch=spec, dataflow=dataflow,
                    kernel_mappings=(), program_name="",
                    summary=f"sddmm in column blocks of {block} (Bᵀ does not fit the SPM)")
                return self._plan
        return super().plan(arch, backend, dataflow=dataflow, cache=cache)

    def _run_sim(self):
        if self._split_block is None:
            return super()._run_sim()
        pos, crd, val = self._csr
        out, self.last_result = run_sddmm_split(*self._dense_ab(), pos, crd, val,
                                                self._plan.arch, self._split_block)
        return out

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
                m = scipy_sparse().csr_matrix((val, (r, coords[-1])), shape=(rows, cols))
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

            sp = scipy_sparse()
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
        m = scipy_sparse().csr_matrix((out, co.crd, co.pos), shape=self.a.shape)
        m.eliminate_zeros()  # as scipy's own add/multiply do
        return m

    def _finish(self, raw):
        if is_scipy_sparse(raw):
            raw = scipy_sparse().csr_matrix(raw)
            raw.sort_indices()
            if self.epilog is not None:
                raw.data = np.asarray(elementwise(self.epilog)(raw.data)).astype(raw.dtype)
            if is_scipy_sparse(self._a_package):
                return raw

            if is_cupy(self._a_package):
                return to_device_like(raw, self._a_package)  # cupyx operands: a cupyx result
            return Tensor.from_package(raw)
        raw = np.asarray(raw)
        if self.epilog is not None:
            raw = np.asarray(elementwise(self.epilog)(raw))
        return _wrap_like(np.ascontiguousarray(raw), self._a_package)


# --- function forms ------------------------------------------------------------------------

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


