"""The shared half of the frontend's ops: operands as UST tensors, the matmul lowering, and
`_StatefulOp` (plan / execute / reset_operands, the plan cache, results wrapped like A)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from dataflow.arch import resolve_arch
from dataflow.dfg.lower import lower_gemm, lower_spmm_csr
from dataflow.dfg.lower_spgemm import gustavson_symbolic, lower_spgemm_csr
from dataflow.errors import UserError
from dataflow.ust_frontend.backends import (
    BACKENDS,
    get_executor,
)
from dataflow.ust_frontend.cache import PlanCache, default_cache
from dataflow.ust_frontend.index_operands import generic_matmul
from dataflow.ust_frontend.interop import (
    to_device_like,
)
from dataflow.ust_frontend.plan import (
    Plan,
    PlanMismatchError,
    build_plan,
    plan_key,
    run_plan,
    signature,
)
from dataflow.ust_frontend.reference import (  # re-exported: the definitions live there
    _check_shapes,
    _entries_csr,
    csr_arrays,
    elementwise,
    is_dense,
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
    """The `Program` for a @ b: dense GEMM, SpMM (sparse A, dense B: the generic lowering of A's
    own format for diagonal and block-row formats, `index_operands.generic_matmul`, else CSR),
    or Gustavson SpGEMM when B is sparse (A read as CSR; a dense A as CSR with every entry).
    The GEMM/SpMM output
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
    generic = generic_matmul(a, b_dense, dtype)  # A's own format, where that is faster
    if generic is not None:
        return generic
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


