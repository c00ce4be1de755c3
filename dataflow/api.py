"""The Python entry points: `load_arch`, `simulate`, `matmul`."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from dataflow.arch import ArchSpec, load_arch, preset_path, resolve_arch  # noqa: F401 (re-exported)
from dataflow.testing import max_abs_error, values_match
from dataflow.workloads import Param, Workload, register

ROOT = Path(__file__).resolve().parent.parent  # the repository in a source checkout (benchmarks)
#: The default preset's file, inside the package. `resolve_arch` (imported above from
#: dataflow.arch, kept importable from here) takes preset names and paths.
DEFAULT_ARCH = preset_path("default")
MATMUL_WORKLOADS = ("gemm", "spmm")


def make_operands(workload: str, m: int, k: int, n: int, density: float = 0.1, seed: int = 0):
    """Seeded random operands: dense A (gemm) or CSR A at `density` (spmm), dense B; fp32."""
    if workload not in MATMUL_WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose one of {MATMUL_WORKLOADS}")
    for name, v in (("m", m), ("k", k), ("n", n)):
        if v <= 0:
            raise ValueError(f"--{name} must be a positive integer, got {v}")
    rng = np.random.default_rng(seed)
    b = rng.standard_normal((k, n), dtype=np.float32)
    if workload == "gemm":
        return rng.standard_normal((m, k), dtype=np.float32), b
    if not 0.0 < density <= 1.0:
        raise ValueError(f"--density must be in (0, 1], got {density}")
    a = sp.random(m, k, density=density, format="csr", dtype=np.float32, random_state=rng,
                  data_rvs=lambda size: rng.standard_normal(size).astype(np.float32))
    a.sort_indices()
    return a, b


def finish(res, reference, t0: float, mapping=None):
    """Fill a `SimResult`'s value check and wall time (the helper every workload's run uses)."""
    return dataclasses.replace(
        res, values_match_reference=values_match(res.output, reference),
        max_abs_error=max_abs_error(res.output, reference),
        wall_seconds=time.perf_counter() - t0,
        mapping_summary=mapping.summary() if mapping is not None else res.mapping_summary)


def _run_matmul(workload: str):
    def run(spec: ArchSpec, *, engine: str = "fast", seed: int = 0, trace: bool = False,
            m: int = 256, k: int = 256, n: int = 64, density: float = 0.05,
            dataflow: str | None = None):
        from dataflow.mapper import map_program
        from dataflow.pe_array.simulate import simulate_mapping
        from dataflow.ust_frontend.ops import as_tensor, lower_matmul, matmul_reference

        t0 = time.perf_counter()
        a, b = make_operands(workload, m, k, n, density, seed)
        ta, tb = as_tensor(a), as_tensor(b)
        mapping = map_program(lower_matmul(ta, tb), spec, dataflow=dataflow)
        res = simulate_mapping(mapping, engine=engine, trace=trace, workload=workload)
        return finish(res, matmul_reference(ta, tb), t0, mapping)
    return run


_MATMUL_PARAMS = (
    Param("m", int, 256, "rows of A and C"),
    Param("k", int, 256, "columns of A, rows of B"),
    Param("n", int, 64, "columns of B and C (butterfly/fft: transform length)"),
    Param("density", float, 0.05, "density of sparse A (spmm)"),
    Param("dataflow", str, None, "systolic dataflow (systolic architectures only; default os)",
          choices=(None, "os", "ws", "is")),
)
register(Workload("gemm", _run_matmul("gemm"), _MATMUL_PARAMS, "dense C = A @ B"))
register(Workload("spmm", _run_matmul("spmm"), _MATMUL_PARAMS, "CSR A @ dense B"))


def simulate(workload: str, arch: ArchSpec | str | Path | None = None, *, seed: int = 0,
             engine: str = "fast", trace: bool = False, **params):
    """Generate a registered workload, lower, map and simulate it; check values against numpy.

    `params` are the workload's own (`dataflow.workloads.get(name).params`), for example
    `m, k, n, density, dataflow` for gemm/spmm. Returns a `SimResult` whose
    `values_match_reference` and `max_abs_error` compare the engine's output with the numpy
    reference (float64 accumulate).
    """
    from dataflow.workloads import get

    if engine not in ("fast", "reference"):
        raise ValueError(f"engine must be 'fast' or 'reference', got {engine!r}")
    w = get(workload)
    return w.run(resolve_arch(arch), engine=engine, seed=seed, trace=trace, **w.resolve(params))
