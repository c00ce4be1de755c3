"""Design-space sweep throughput: points per second, serial against local worker processes.

    python benchmarks/bench_dse.py [--workers 1 2 4] [--points 48]

One run measures every configuration side by side on the same grid (each into a fresh results
file): the serial runner in this process, then the local process pool with each worker count.
Pool start-up (forkserver + imports) is timed apart from the steady state, which is what a long
sweep sees. The target is near-linear scaling in cores; on a shared machine other load lowers it,
so the load average and the cores the evaluations actually got (their CPU seconds over the wall
seconds) are printed next to the numbers. Results of every run are checked to be
identical to the serial run's. Writes a table and benchmarks/out/bench_dse.png.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from dataflow.dse.points import grid_points
from dataflow.dse.runners import PoolRunner, SerialRunner, run_points
from dataflow.dse.store import ResultsStore
from dataflow.dse.sweep import sweep_from_dict

SWEEP = {
    "name": "bench",
    "arch": {"zip": [{"pe_array.rows": [4, 8], "pe_array.cols": [4, 8]}],
             "sweep": {"spm.lines": [4, 8, 16], "dram.bytes_per_cycle": [25.6, 51.2]}},
    "workloads": [{"name": "gemm", "params": {"m": 64, "k": 64, "n": [32, 64]}},
                  {"name": "spmm", "params": {"m": 128, "k": 128, "n": 32,
                                              "density": [0.05, 0.2]}}],
}


def timed_run(points, runner, folder: Path, label: str) -> tuple[float, dict]:
    with ResultsStore(folder / f"{label}.db") as store:
        run_id = store.start_run("bench", "bench", label, len(points), 0)
        t0 = time.perf_counter()
        evaluated, failed, _ = run_points(points, store, runner, run_id)
        wall = time.perf_counter() - t0
        assert evaluated == len(points) and failed == 0, (evaluated, failed)
        rows = store.rows()
        values = {r["point_id"]: (r["cycles"], r["energy_pj"], r["values_match"]) for r in rows}
        cpu = sum(r["result"]["evaluation_cpu_s"] for r in rows)
    return wall, cpu, values


def _burn(n: int) -> int:
    x = 0
    for i in range(n):
        x += i
    return x


def machine_ceiling(workers: int, n: int = 2_000_000, jobs: int = 8) -> float:
    """Speed-up `workers` processes get on pure CPU work with no sharing at all: the most a
    sweep can reach here (virtual cores that are hyperthreads of one physical core give far
    less than `workers`)."""
    import multiprocessing as mp

    t0 = time.perf_counter()
    for _ in range(jobs):
        _burn(n)
    serial = time.perf_counter() - t0
    with mp.get_context("forkserver").Pool(workers) as pool:
        pool.map(_burn, [1000] * workers)  # start the workers first
        t0 = time.perf_counter()
        pool.map(_burn, [n] * jobs, chunksize=1)
        par = time.perf_counter() - t0
    return serial / par


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=None,
                    help="worker counts to measure (default: 1, 2, ... up to the cores)")
    ap.add_argument("--points", type=int, default=48, help="points per run (default 48)")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    counts = args.workers or sorted({1, *range(2, cores + 1, max(1, cores // 4))} | {cores})
    points = list(grid_points(sweep_from_dict(SWEEP, source="bench_dse.py")).points)
    while len(points) < args.points:  # more seeds of the same grid for longer runs
        SWEEP["mapping"] = {"seed": list(range(len(points) // 24 + 2))}
        points = list(grid_points(sweep_from_dict(SWEEP, source="bench_dse.py")).points)
    points = points[:args.points]
    print(f"machine: {platform.node()} {platform.machine()}, {cores} cores, python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.2f} (1 min)")
    print(f"{len(points)} points: gemm 64x64x{{32,64}} and spmm 128x128x32 on 12 architectures\n")

    from dataflow.dse.evaluate import evaluate_point

    evaluate_point(points[0].payload())  # warm this process (imports, first-call compiles)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        wall, cpu, ref = timed_run(points, SerialRunner(), folder, "serial")
        rows.append(("serial", 1, 0.0, wall, len(points) / wall, cpu))
        for w in counts:
            t0 = time.perf_counter()
            runner = PoolRunner(w)
            # start every worker and warm it on one point (not stored): start-up timed apart
            list(runner.imap_unordered([points[i % len(points)].payload() for i in range(w)]))
            startup = time.perf_counter() - t0
            try:
                wall, cpu, got = timed_run(points, runner, folder, f"pool{w}")
            finally:
                runner.close()
            assert got == ref, f"pool with {w} workers gave other results than serial"
            rows.append((f"pool {w}", w, startup, wall, len(points) / wall, cpu))
    serial_rate = rows[0][4]
    ceilings = {w: machine_ceiling(w) for w in counts}
    # cores busy = CPU seconds the evaluations got / wall seconds: below the worker count when
    # other processes share the cores, which is what caps the speed-up on a loaded machine
    print(f"{'runner':>8} {'workers':>7} {'startup s':>9} {'sweep s':>8} {'points/s':>9} "
          f"{'vs serial':>9} {'per worker':>10} {'cpu ms/pt':>9} {'cores busy':>10}")
    for name, w, startup, wall, rate, cpu in rows:
        print(f"{name:>8} {w:>7} {startup:>9.2f} {wall:>8.2f} {rate:>9.2f} "
              f"{rate / serial_rate:>8.2f}x {rate / serial_rate / w:>9.0%} "
              f"{1e3 * cpu / len(points):>9.1f} {cpu / wall:>10.2f}"
              + (f"   machine ceiling {ceilings[w]:.2f}x -> {rate / serial_rate / ceilings[w]:.0%}"
                 " of it" if name != "serial" else ""))
    print("machine ceiling = speed-up of the same number of processes on pure CPU work (no I/O, "
          "no sharing);\nthe sweep's scaling is judged against it, since virtual cores may share "
          "one physical core")
    print("\nall runs stored identical cycles, energy and value checks")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = HERE / "out"
    out.mkdir(exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ws = [r[1] for r in rows[1:]]
    ax.plot(ws, [r[4] / serial_rate for r in rows[1:]], "o-", label="measured")
    ax.plot(ws, ws, "--", c="0.5", label="linear")
    ax.plot(ws, [ceilings[w] for w in ws], ":", c="k", label="machine ceiling (pure CPU)")
    ax.set_xlabel("local worker processes")
    ax.set_ylabel("points/s relative to serial")
    ax.set_title(f"dataflow sweep throughput ({cores} cores)", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "bench_dse.png", dpi=120)
    print(f"plot: {out / 'bench_dse.png'}")


if __name__ == "__main__":
    main()
