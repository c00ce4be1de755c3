"""The Python entry points: `load_arch`, `simulate`, `matmul`."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from dataflow.arch import ArchSpec, load_arch
from dataflow.testing import max_abs_error, values_match

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ARCH = ROOT / "arch_configs" / "default.yaml"
WORKLOADS = ("gemm", "spmm")


def resolve_arch(arch: ArchSpec | str | Path | None) -> ArchSpec:
    if arch is None:
        return load_arch(DEFAULT_ARCH)
    if isinstance(arch, ArchSpec):
        return arch
    return load_arch(arch)


def make_operands(workload: str, m: int, k: int, n: int, density: float = 0.1, seed: int = 0):
    """Seeded random operands: dense A (gemm) or CSR A at `density` (spmm), dense B; fp32."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose one of {WORKLOADS}")
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


def simulate(workload: str, arch: ArchSpec | str | Path | None = None, m: int = 64, k: int = 64,
             n: int = 64, density: float = 0.1, dataflow: str | None = None, seed: int = 0,
             engine: str = "fast", trace: bool = False):
    """Generate a workload, lower, map and simulate it; check values against numpy.

    Returns a `SimResult` whose `values_match_reference` and `max_abs_error` compare the
    engine's output with the numpy reference (float64 accumulate).
    """
    from dataflow.mapper import map_program
    from dataflow.pe_array.simulate import simulate_mapping
    from dataflow.ust_frontend.ops import as_tensor, lower_matmul, matmul_reference

    t0 = time.perf_counter()
    spec = resolve_arch(arch)
    a, b = make_operands(workload, m, k, n, density, seed)
    ta, tb = as_tensor(a), as_tensor(b)
    prog = lower_matmul(ta, tb)
    mapping = map_program(prog, spec, dataflow=dataflow)
    res = simulate_mapping(mapping, engine=engine, trace=trace, workload=workload)
    ref = matmul_reference(ta, tb)
    return dataclasses.replace(
        res, values_match_reference=values_match(res.output, ref),
        max_abs_error=max_abs_error(res.output, ref),
        wall_seconds=time.perf_counter() - t0,
        mapping_summary=mapping.summary())
