"""Spine benchmark: dense GEMM on the systolic preset and CSR SpMM on the default array.

Prints simulated cycles, wall time, simulated MACs per wall second, and — when SCALE-Sim 3.0.0
is installed in its own environment (benchmarks/scalesim/README.md) — SCALE-Sim's wall time on
the same GEMM and the ratio, measured side by side in this run.

    python benchmarks/bench_spine.py [--quick] [--no-scalesim]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "scalesim"))
sys.path.insert(0, str(HERE))

from benchcommon import machine

import dataflow
from dataflow.api import DEFAULT_ARCH, ROOT


def run_dataflow(workload, arch, repeats=3, **params):
    """Best wall time of `repeats` warm runs (the first run, which compiles numba kernels and
    loads the arch, is excluded and reported separately)."""
    t0 = time.perf_counter()
    res = dataflow.simulate(workload, arch=arch, **params)
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = dataflow.simulate(workload, arch=arch, **params)
        best = min(best, time.perf_counter() - t0)
    return res, best, first


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (CI smoke run)")
    ap.add_argument("--no-scalesim", action="store_true")
    args = ap.parse_args(argv)
    g = 128 if args.quick else 512
    sm, sk, sn, dens = (1024, 1024, 64, 0.01) if args.quick else (4096, 4096, 64, 0.01)
    print(f"machine: {machine()}")
    rows = []

    systolic = dataflow.load_arch(ROOT / "arch_configs" / "systolic_32x32.yaml")
    res, wall, first = run_dataflow("gemm", systolic, m=g, k=g, n=g, dataflow="ws")
    rows.append((f"GEMM {g}^3 ws, systolic 32x32", res, wall, first))
    gemm_res, gemm_wall = res, wall

    default = dataflow.load_arch(DEFAULT_ARCH)
    res, wall, first = run_dataflow("spmm", default, repeats=1, m=sm, k=sk, n=sn, density=dens)
    rows.append((f"CSR SpMM {sm}x{sk} @ {dens:.0%} x {sn}, default", res, wall, first))

    print(f"\n{'workload':44} {'cycles':>12} {'compute':>12} {'wall s':>8} {'1st s':>7} "
          f"{'sim MAC/s':>11} {'values':>7}")
    for name, r, w, f in rows:
        print(f"{name:44} {r.cycles:>12,} {r.compute_cycles:>12,} {w:>8.3f} {f:>7.2f} "
              f"{r.macs / w:>11.3g} {'ok' if r.values_match_reference else 'WRONG':>7}")

    if args.no_scalesim:
        return 0
    try:
        from run_scalesim import run_scalesim_subprocess, scalesim_python
    except ImportError:
        print("\nSCALE-Sim runner not found; skipping the comparison")
        return 0
    if scalesim_python() is None:
        print("\nSCALE-Sim 3.0.0 is not installed (see benchmarks/scalesim/README.md); "
              "skipping the side-by-side comparison")
        return 0
    ss = run_scalesim_subprocess(g, g, g, "ws", 32, 32)
    same = ss["total_cycles"] == gemm_res.compute_cycles
    print(f"\nSCALE-Sim 3.0.0 on GEMM {g}^3 ws, 32x32: {ss['total_cycles']:,} cycles "
          f"({'identical' if same else 'DIFFERENT'}: dataflow {gemm_res.compute_cycles:,}), "
          f"wall {ss['wall_seconds']:.2f} s")
    print(f"dataflow is {ss['wall_seconds'] / gemm_wall:,.0f}x faster than SCALE-Sim "
          f"(target >= 100x at identical cycles)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
