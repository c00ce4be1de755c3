"""Design-space sweep throughput: points per second, serial against local worker processes.

    python benchmarks/bench_dse.py [--workers 1 2 4] [--points 48]

One run measures every configuration side by side on the same grid (each into a fresh results
file), after one untimed pass that warms the on-disk plan cache for all of them alike: the
serial runner in this process, then the local process pool with each worker count (always
including one worker, the reference of the speed-up column). Pool start-up (forkserver +
imports) is timed apart from the steady state, which is what a long sweep sees. Points per
second should grow about linearly with workers up to the cores; on a shared machine other load
lowers that, so each worker count's speed-up is printed next to the machine's own ceiling for
that many processes (pure CPU work measured in the same run), with the per-point evaluation
time and the per-point overhead outside it (IPC, the results store). Results of every run are
checked to be identical to the serial run's. `measure` and `table` are what
benchmarks/bench_engine.py's sweep section runs. Writes benchmarks/out/bench_dse.png.
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


def timed_run(points, runner, folder: Path, label: str) -> tuple[float, float, float, dict]:
    """(wall s, CPU s of the evaluations, wall s of the evaluations, stored values by point)
    of one run of `points` on `runner` into a fresh results file."""
    with ResultsStore(folder / f"{label}.db") as store:
        run_id = store.start_run("bench", "bench", label, len(points), 0)
        t0 = time.perf_counter()
        evaluated, failed, _ = run_points(points, store, runner, run_id)
        wall = time.perf_counter() - t0
        assert evaluated == len(points) and failed == 0, (evaluated, failed)
        rows = store.rows()
        values = {r["point_id"]: (r["cycles"], r["energy_pj"], r["values_match"]) for r in rows}
        cpu = sum(r["result"]["evaluation_cpu_s"] for r in rows)
        busy = sum(r["wall_s"] for r in rows)
    return wall, cpu, busy, values


def _burn(n: int) -> int:
    x = 0
    for i in range(n):
        x += i
    return x


def machine_ceiling(workers: int, n: int = 2_000_000, jobs: int = 8, repeats: int = 3) -> float:
    """Speed-up `workers` processes get on pure CPU work with no sharing at all: the most a
    sweep can reach here (virtual cores that are hyperthreads of one physical core give far
    less than `workers`)."""
    import multiprocessing as mp

    def serial_s():
        t0 = time.perf_counter()
        for _ in range(jobs):
            _burn(n)
        return time.perf_counter() - t0

    serial = min(serial_s() for _ in range(repeats))
    with mp.get_context("forkserver").Pool(workers) as pool:
        pool.map(_burn, [1000] * workers)  # start the workers first
        par = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            pool.map(_burn, [n] * jobs, chunksize=1)
            par = min(par, time.perf_counter() - t0)
    # best of `repeats` each side (a neighbour's burst slows one timing, never speeds it up);
    # more than `workers` times is a disturbed serial timing, not the machine
    return min(float(workers), serial / par)


def bench_points(n: int):
    """The first `n` points of the benchmark grid (more seeds of it when `n` asks for more)."""
    points = list(grid_points(sweep_from_dict(SWEEP, source="bench_dse.py")).points)
    sweep = dict(SWEEP)
    while len(points) < n:
        sweep["mapping"] = {"seed": list(range(len(points) // 24 + 2))}
        points = list(grid_points(sweep_from_dict(sweep, source="bench_dse.py")).points)
    return points[:n]


def measure(counts: list[int], n_points: int) -> dict:
    """Points per second of the serial runner and of local pools of `counts` workers on the
    same points, side by side. Every point is evaluated once first (untimed) so the on-disk
    plan cache is warm for every runner alike; each pool's start (forkserver, imports, one
    point per worker) is timed apart from its sweep. Per point: the CPU and wall seconds of
    the evaluation itself, and the overhead -- a worker's wall time per point outside it
    (scheduling, pickling, the results store)."""
    from dataflow.dse.evaluate import evaluate_point

    points = bench_points(n_points)
    for p in points:  # warm: the plan cache, this process's imports and first calls
        evaluate_point(p.payload())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        wall, cpu, busy, ref = timed_run(points, SerialRunner(), folder, "serial")
        rows.append({"runner": "serial", "workers": 1, "startup_s": 0.0, "wall_s": wall,
                     "cpu_s": cpu, "busy_s": busy})
        for w in counts:
            t0 = time.perf_counter()
            runner = PoolRunner(w)
            list(runner.imap_unordered([points[i % len(points)].payload() for i in range(w)]))
            startup = time.perf_counter() - t0
            try:
                wall, cpu, busy, got = timed_run(points, runner, folder, f"pool{w}")
            finally:
                runner.close()
            assert got == ref, f"pool with {w} workers gave other results than serial"
            rows.append({"runner": f"pool {w}", "workers": w, "startup_s": startup,
                         "wall_s": wall, "cpu_s": cpu, "busy_s": busy})
    n = len(points)
    base = n / next(r for r in rows if r["workers"] == 1 and r["runner"] != "serial")["wall_s"]
    for r in rows:
        r["points_per_s"] = n / r["wall_s"]
        r["vs_one_worker"] = r["points_per_s"] / base
        r["eval_ms_per_point"] = 1e3 * r["busy_s"] / n
        r["overhead_ms_per_point"] = 1e3 * (r["wall_s"] * r["workers"] - r["busy_s"]) / n
    return {"points": n, "load_average": os.getloadavg()[0], "cores": os.cpu_count() or 1,
            "rows": rows, "ceilings": {w: machine_ceiling(w) for w in counts}}


def table(result: dict) -> str:
    """The measurement as a table: points/s against one worker next to the machine's own
    ceiling for that many processes."""
    lines = [f"{'runner':>8} {'workers':>7} {'start s':>7} {'sweep s':>7} {'points/s':>8} "
             f"{'vs 1 worker':>11} {'ceiling':>7} {'eval ms/pt':>10} {'overhead ms/pt':>14}"]
    for r in result["rows"]:
        ceiling = result["ceilings"].get(r["workers"]) if r["runner"] != "serial" else None
        lines.append(f"{r['runner']:>8} {r['workers']:>7} {r['startup_s']:>7.2f} "
                     f"{r['wall_s']:>7.2f} {r['points_per_s']:>8.2f} "
                     f"{r['vs_one_worker']:>10.2f}x {f'{ceiling:.2f}x' if ceiling else '':>7} "
                     f"{r['eval_ms_per_point']:>10.1f} {r['overhead_ms_per_point']:>14.1f}")
    lines.append("ceiling = speed-up of that many processes on pure CPU work, measured now (other "
                 "load and\nhyperthreads lower it); overhead = a worker's wall time per point "
                 "outside the evaluation")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=None,
                    help="worker counts to measure (default: 1, 2, ... up to the cores)")
    ap.add_argument("--points", type=int, default=48, help="points per run (default 48)")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    counts = args.workers or sorted({1, *range(2, cores + 1, max(1, cores // 4))} | {cores})
    counts = sorted(set(counts) | {1})
    print(f"machine: {platform.node()} {platform.machine()}, {cores} cores, python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.2f} (1 min)")
    print(f"{args.points} points: gemm 64x64x{{32,64}} and spmm 128x128x32 on 12 architectures\n")
    result = measure(counts, args.points)
    print(table(result))
    print("\nall runs stored identical cycles, energy and value checks")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = HERE / "out"
    out.mkdir(exist_ok=True)
    pools = [r for r in result["rows"] if r["runner"] != "serial"]
    ws = [r["workers"] for r in pools]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(ws, [r["vs_one_worker"] for r in pools], "o-", label="measured")
    ax.plot(ws, ws, "--", c="0.5", label="linear")
    ax.plot(ws, [result["ceilings"][w] for w in ws], ":", c="k",
            label="machine ceiling (pure CPU)")
    ax.set_xlabel("local worker processes")
    ax.set_ylabel("points/s relative to one worker")
    ax.set_title(f"dataflow sweep throughput ({cores} cores)", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "bench_dse.png", dpi=120)
    print(f"plot: {out / 'bench_dse.png'}")


if __name__ == "__main__":
    main()
