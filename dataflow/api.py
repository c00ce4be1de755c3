"""The Python entry points: `load_arch`, `simulate` (and `resolve_arch`, `make_operands`).

`simulate` imports the one workload module it runs (`dataflow.workloads.get`), and
`make_operands` is imported from `dataflow.matmul_workloads` when first used, so importing this
module imports no workload (start-up, issue 14).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np

from dataflow.arch import ArchSpec, load_arch, preset_path, resolve_arch
from dataflow.arch.limits import gib, host_memory_bytes, shown
from dataflow.errors import UserError
from dataflow.pe_array.simulate import ENGINES
from dataflow.workloads import finish, get

__all__ = ["DEFAULT_ARCH", "ROOT", "ArchSpec", "finish", "load_arch",
           "make_operands",  # noqa: F822 (module __getattr__ below)
           "resolve_arch", "simulate"]

ROOT = Path(__file__).resolve().parent.parent  # the repository in a source checkout (benchmarks)
#: The default preset's file, inside the package. `resolve_arch` takes preset names and paths.
DEFAULT_ARCH = preset_path("default")
#: workloads that run timing only (`simulate(timing_only=True)`, `--timing-only`)
TIMING_ONLY = ("gemm",)


def __getattr__(name: str):
    if name == "make_operands":  # the gemm/spmm operands: their workload module holds them
        return importlib.import_module("dataflow.matmul_workloads").make_operands
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def simulate(workload: str, arch: ArchSpec | str | Path | None = None, *, seed: int = 0,
             engine: str = "fast", trace: bool = False, timing_only: bool = False, **params):
    """Generate a registered workload, lower, map and simulate it; check values against numpy.

    `params` are the workload's own (`dataflow.workloads.get(name).params`), for example
    `m, k, n, density, dataflow` for gemm/spmm. Returns a `SimResult` whose
    `values_match_reference` and `max_abs_error` compare the engine's output with the numpy
    reference (float64 accumulate).

    `timing_only=True` (a dense GEMM on a systolic array, whose timing does not depend on the
    values, as SCALE-Sim runs it) skips the values: cycles, stalls, traffic and energy are the
    same; `values_computed` is False and `values_match_reference` None.
    """
    if engine not in ENGINES:
        raise UserError(f"--engine must be 'fast' or 'reference', got {shown(engine)}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UserError(f"--seed must be a non-negative integer, got {shown(seed)}")
    w = get(workload)
    spec = resolve_arch(arch)
    given = w.resolve(params)
    if timing_only:
        if workload not in TIMING_ONLY:
            raise UserError(f"--timing-only applies to {', '.join(TIMING_ONLY)} on a systolic "
                            f"array; {workload!r} computes its values")
        given["timing_only"] = True
    try:
        return w.run(spec, engine=engine, seed=int(seed), trace=trace, **given)
    except MemoryError:
        # the operand checks (`workloads.check_host_memory`) refuse sizes up front; this
        # catches what they cannot foresee (the mapper's and the engine's own arrays)
        raise UserError(f"workload {workload!r} ran out of host memory "
                        f"({gib(host_memory_bytes())} available): use smaller sizes") from None
