"""What every benchmark shares: the machine line printed above its table (the benchmarks'
numbers are only comparable on the machine that measured them), and a warm best-of timing of
one `dataflow.simulate` call."""

from __future__ import annotations

import os
import platform
import time


def machine() -> str:
    """Processor, cores and Python version of this machine, one line."""
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}")


def timed(workload, arch, repeats=2, **params):
    """`dataflow.simulate(workload, arch=arch, **params)`'s result and its best wall time of
    `repeats` runs after one warm-up run (numba compilation, arch load)."""
    import dataflow

    res = dataflow.simulate(workload, arch=arch, **params)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = dataflow.simulate(workload, arch=arch, **params)
        best = min(best, time.perf_counter() - t0)
    return res, best
