"""Engine and mapper speed (issue 6, "Speed").

1. Simulated MACs per wall second on dense GEMM (reconfigurable and systolic), CSR SpMM and
   butterfly workloads (the fast engine; values checked against numpy on every run).
2. Wall time against SCALE-Sim 3.0.0 on the same dense GEMMs at identical cycles, measured side
   by side in this run (SCALE-Sim runs in its own venv, benchmarks/scalesim/README.md): whole
   processes for 256^3 ws on 32x32 and 1024^3 ws on 128x128, one process for 512^3 (issue 14
   point 3). When SCALE-Sim is not installed, its golden cycles and the wall times recorded on
   the dev box are printed instead, labelled "rec".
3. The mapper over a corpus of kernels: every kernel the registered workloads map at small
   sizes on three architectures, plus seeded random DFGs (tests/programs.py): II against MII
   (target II = MII on >= 90 %), mapping time percentiles (target p90 < 5 s; CGRA-ME's
   ILP-heuristic mapper reports 7.9 s), and what the optional annealing pass changes.

4. Sweep points per second against one worker, up to the cores (benchmarks/bench_dse.py), and
   the start-up of `dataflow --help` and the default job (benchmarks/bench_startup.py).
5. Cold planning (issue 14 point 4): multilayer FFT and FNet on the MLX preset (target < 3 s)
   and FNet seq 256 on default.yaml, each `dataflow.simulate` in a new process on an empty
   plan cache (wall and CPU seconds of the call; docs/planning_speed.md).
6. Large arrays (issue 14 point 7): a 32^3 GEMM mapped onto 64 x 64 (< 2 s) and 256 x 256
   (< 10 s) arrays (benchmarks/bench_mapper_scale.py's measurement).
7. The issue-14 targets these sections measure, one line each: goal, measured, met.

    python benchmarks/bench_engine.py [--quick] [--no-scalesim] [--no-sweep] [--no-startup]
                                      [--sections engine,scalesim,mapper,planning,large,...]

Writes benchmarks/out/bench_engine.png and benchmarks/out/bench_engine.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "scalesim"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from benchcommon import machine, timed
from engine_corpus import mapper_stats
from engine_scalesim import scalesim_comparison

from dataflow.arch import load_arch

OUT = HERE / "out"
SECTIONS = ("engine", "scalesim", "mapper", "planning", "large", "sweep", "startup")




# --- 1. simulated MACs per second ------------------------------------------------------------

def engine_speed(quick: bool):
    default = load_arch(ROOT / "arch_configs" / "default.yaml")
    systolic = load_arch(ROOT / "arch_configs" / "systolic_32x32.yaml")
    g = 128 if quick else 256
    cases = [
        (f"dense GEMM {g}x{g}x64, default 8x8", "gemm", default, {"m": g, "k": g, "n": 64}),
        (f"dense GEMM {2 * g}^3 ws, systolic 32x32", "gemm", systolic,
         {"m": 2 * g, "k": 2 * g, "n": 2 * g, "dataflow": "ws"}),
        (f"CSR SpMM {8 * g}^2 @ 1% x 64, default", "spmm", default,
         {"m": 8 * g, "k": 8 * g, "n": 64, "density": 0.01}),
    ]
    from dataflow.workloads import workloads
    if "butterfly" in workloads():
        n = 256 if quick else 1024
        cases.append((f"butterfly n={n} batch 32, default", "butterfly", default,
                      {"n": n, "batch": 32}))
    else:
        print("note: no butterfly workload registered; skipping it")
    rows = []
    for name, wl, arch, params in cases:
        res, wall = timed(wl, arch, repeats=1 if "SpMM" in name or "butterfly" in name else 2,
                          **params)
        rows.append({"case": name, "cycles": res.cycles, "macs": res.macs, "wall_s": wall,
                     "macs_per_s": res.macs / wall,
                     "values_ok": bool(res.values_match_reference)})
    print(f"\n{'workload':44} {'cycles':>12} {'MACs':>13} {'wall s':>8} {'sim MAC/s':>10} values")
    for r in rows:
        print(f"{r['case']:44} {r['cycles']:>12,} {r['macs']:>13,} {r['wall_s']:>8.3f} "
              f"{r['macs_per_s']:>10.3g} {'ok' if r['values_ok'] else 'WRONG'}")
    return rows


# sections 2 and 3 (SCALE-Sim, the mapper corpus) live in engine_scalesim.py and
# engine_corpus.py


# --- cold planning and large arrays (issue 14 points 4 and 7) ----------------------------------

#: (label, arch file, workload, params, target seconds or None); quick runs skip FNet on default
PLANNING_CASES = (
    ("FFT n=256 b=16 multilayer, MLX", "mlx_4x4.yaml", "fft",
     {"n": 256, "batch": 16, "orchestration": "multilayer"}, 3.0),
    ("FNet seq 256 dim 64, MLX", "mlx_4x4.yaml", "fnet-attention", {"seq": 256, "dim": 64}, 3.0),
    ("FNet seq 256, default", "default.yaml", "fnet-attention", {"seq": 256}, None),
)

_COLD = '''
import json, sys, time
import dataflow
arch, wl, params = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t0, c0 = time.perf_counter(), time.process_time()
res = dataflow.simulate(wl, arch=arch, **params)
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "cycles": res.cycles, "values_ok": bool(res.values_match_reference)}))
'''


def cold_planning(quick: bool) -> list[dict]:
    """Each case's `dataflow.simulate` (plan + run + the numpy check) in a new process on an
    empty plan cache: nothing mapped, laid out or compiled is reused from memory or disk.
    Wall and CPU seconds of the call (start-up not included: point 1 measures it); on a
    loaded machine the CPU seconds are the planning work, the wall seconds include waiting."""
    import subprocess
    import tempfile

    rows = []
    for label, arch, wl, params, target in PLANNING_CASES:
        if quick and target is None:
            continue
        with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
            env = dict(os.environ, PYTHONPATH=str(ROOT), DATAFLOW_CACHE_DIR=tmp)
            out = subprocess.run([sys.executable, "-c", _COLD, str(ROOT / "arch_configs" / arch),
                                  wl, json.dumps(params)], env=env, cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        rows.append({"case": label, "target_s": target, **r})
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    for r in rows:
        r["load_average"] = load
    print(f"\ncold planning: new process, empty cache (load average {load:.2f} on "
          f"{os.cpu_count()} cores; wall beyond CPU is waiting for a core)")
    print(f"{'case':44} {'cycles':>8} {'wall s':>7} {'CPU s':>6} {'target':>7} values")
    for r in rows:
        target = f"< {r['target_s']:g} s" if r["target_s"] else "-"
        print(f"{r['case']:44} {r['cycles']:>8,} {r['wall_s']:>7.2f} {r['cpu_s']:>6.2f} "
              f"{target:>7} {'ok' if r['values_ok'] else 'WRONG'}")
    return rows


def large_arrays(quick: bool) -> list[dict]:
    """benchmarks/bench_mapper_scale.py's measurement: a 32^3 GEMM mapped (legality check
    included) onto default.yaml with rows = cols = side, each side a new architecture."""
    import tempfile

    import bench_mapper_scale as scale

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp, \
            scale.dataflow_cache(Path(tmp) / "plans"):
        for side in (64,) if quick else (64, 256):
            rows.append(scale.measure(side, Path(tmp), False))
    print(f"\n{'large arrays: GEMM 32^3 on side x side':44} {'PEs':>7} {'copies':>6} {'II':>3} "
          f"{'map s':>7} {'target':>8}")
    for r in rows:
        print(f"{r['side']:>3} x {r['side']:<38} {r['pes']:>7} {r['copies']:>6} {r['ii']:>3} "
              f"{r['map_s']:>7.2f} {'< %g s' % r['target_s']:>8}")
    return rows


# --- sweeps and start-up (issue 14 points 6 and 1) --------------------------------------------

def sweep_scaling(quick: bool) -> dict:
    """Sweep points per second against one worker, up to the cores
    (benchmarks/bench_dse.py's measurement, warm plan cache, results checked identical)."""
    import bench_dse

    cores = os.cpu_count() or 1
    counts = sorted({1, *range(2, cores + 1, max(1, cores // 4)), cores})
    result = bench_dse.measure(counts, 24 if quick else 96)
    print(f"\nsweep: {result['points']} points (gemm and spmm on 12 architectures, seeds), "
          f"{cores} cores, load average {result['load_average']:.2f}")
    print(bench_dse.table(result))
    return result


def startup(quick: bool) -> list[dict]:
    """Whole-process wall time of `dataflow --help` and the README's default job, warm
    (benchmarks/bench_startup.py's measurement: as run, and with bytecode)."""
    import bench_startup

    rows = bench_startup.measure(ROOT, 3 if quick else 7)
    print("\nstart-up, whole processes (best of runs; PYTHONDONTWRITEBYTECODE="
          f"{os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r} as run)")
    print(bench_startup.table(rows))
    return rows


def issue14_targets(ss: list[dict], sweep: dict | None, start: list[dict] | None,
                    mapper: dict | None = None, planning: list[dict] | None = None,
                    large: list[dict] | None = None) -> list[dict]:
    """The issue-14 targets these sections measure: (target, goal, measured, met)."""
    out = []
    if mapper:
        p90 = mapper["all"]["p90_s"]
        out.append({"target": f"mapper corpus p90 ({mapper['all']['kernels']} kernels)",
                    "goal": "< 1 s", "measured": f"{p90:.3f} s (max {mapper['all']['max_s']:.2f})",
                    "met": p90 < 1.0})
    for r in planning or []:
        if r["target_s"] is not None:
            out.append({"target": f"cold plan: {r['case']}", "goal": f"< {r['target_s']:g} s",
                        "measured": f"{r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU, "
                                    f"load {r['load_average']:.1f}",
                        "met": r["wall_s"] < r["target_s"] and r["values_ok"]})
    for r in large or []:
        out.append({"target": f"large array: GEMM 32^3 mapped onto {r['side']}x{r['side']}",
                    "goal": f"< {r['target_s']:g} s", "measured": f"{r['map_s']:.2f} s",
                    "met": r["map_s"] < r["target_s"]})
    for r in start or []:
        if r["target_s"] is not None:
            best = r["bytecode"]["best_s"]
            out.append({"target": f"start-up: {r['command']}", "goal": f"< {r['target_s']} s",
                        "measured": f"{best:.3f} s (as run {r['as run']['best_s']:.3f} s)",
                        "met": best < r["target_s"]})
    for r in ss:
        how = "whole process, timing-only" if r["whole_process"] else "in one process"
        out.append({"target": f"SCALE-Sim {r['gemm']} on {r['array']}, {how}",
                    "goal": f">= {r['target']}x, same cycles",
                    "measured": f"{r['speedup']:,.0f}x"
                    + (f" ({r['speedup_values']:,.0f}x with values)" if r["whole_process"]
                       else "")
                    + ("" if r["identical"] else ", CYCLES DIFFER")
                    + ("" if r["scalesim"] == "measured" else " (SCALE-Sim time recorded)"),
                    "met": r["identical"] and r["speedup"] >= r["target"]})
    if sweep:
        top = max(sweep["rows"], key=lambda r: r["workers"])
        ceiling = sweep["ceilings"][top["workers"]]
        out.append({"target": f"sweep: {top['workers']} workers against 1",
                    "goal": f"about the machine's {ceiling:.2f}x for {top['workers']} processes",
                    "measured": f"{top['vs_one_worker']:.2f}x",
                    "met": top["vs_one_worker"] >= 0.8 * ceiling})
    return out


def targets_table(rows: list[dict]) -> str:
    lines = [f"\n{'target':58} {'goal':34} {'measured':34} met"]
    lines += [f"{r['target']:58} {r['goal']:34} {r['measured']:34} {'yes' if r['met'] else 'NO'}"
              for r in rows]
    return "\n".join(lines)


def plot(speed, ss, rows, times):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    ax[0].barh([r["case"] for r in speed], [r["macs_per_s"] for r in speed], color="#4c72b0")
    ax[0].set_xscale("log")
    ax[0].set_xlabel("simulated MACs per wall second")
    ax[0].tick_params(axis="y", labelsize=7)
    labels = [f"{r['gemm']}\n{r['array']} {'process' if r['whole_process'] else 'in process'}"
              for r in ss]
    ax[1].bar(labels, [r["speedup"] for r in ss], color="#55a868")
    ax[1].scatter(labels, [r["target"] for r in ss], marker="_", s=400, c="k", label="target")
    ax[1].set_yscale("log")
    ax[1].set_ylabel("SCALE-Sim wall / dataflow wall")
    ax[1].tick_params(axis="x", labelsize=7)
    ax[1].legend()
    ax[1].set_title("same GEMM, identical cycles")
    ax[2].hist(times, bins=30, color="#c44e52")
    ax[2].axvline(5, color="k", ls="--", lw=0.8, label="target p90 5 s")
    ax[2].axvline(np.percentile(times, 90), color="#c44e52", ls=":", label="p90 here")
    eq = np.mean([r["ii"] is not None and r["ii"] == r["mii"] for r in rows])
    ax[2].set_title(f"mapping time, {len(rows)} kernels (II = MII on {100 * eq:.0f}%)")
    ax[2].set_xlabel("seconds")
    ax[2].legend()
    fig.tight_layout()
    OUT.mkdir(exist_ok=True)
    fig.savefig(OUT / "bench_engine.png", dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes and corpus (CI smoke run)")
    ap.add_argument("--no-scalesim", action="store_true")
    ap.add_argument("--no-sweep", action="store_true", help="skip the sweep-scaling section")
    ap.add_argument("--no-startup", action="store_true", help="skip the start-up section")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help="comma-separated sections to run (default: all of %(default)s)")
    args = ap.parse_args(argv)
    run = set(args.sections.split(","))
    if run - set(SECTIONS):
        ap.error(f"unknown sections {sorted(run - set(SECTIONS))}; choose from {SECTIONS}")
    print(f"machine: {machine()}")
    speed = engine_speed(args.quick) if "engine" in run else []
    ss = scalesim_comparison(args.quick, not args.no_scalesim) if "scalesim" in run else []
    rows, summary, ann, times = mapper_stats(args.quick) if "mapper" in run else ([], {}, [], [])
    planning = cold_planning(args.quick) if "planning" in run else []
    large = large_arrays(args.quick) if "large" in run else []
    sweep = None if args.no_sweep or "sweep" not in run else sweep_scaling(args.quick)
    start = None if args.no_startup or "startup" not in run else startup(args.quick)
    targets = issue14_targets(ss, sweep, start, summary, planning, large)
    print(targets_table(targets))
    if speed and ss and rows:
        plot(speed, ss, rows, times)
    OUT.mkdir(exist_ok=True)
    # a run of some sections writes its own file, never over the full run's
    name = "bench_engine" if run == set(SECTIONS) else "bench_engine_" + "_".join(sorted(run))
    (OUT / f"{name}.json").write_text(json.dumps(
        {"machine": machine(), "engine": speed, "scalesim": ss, "mapper": rows,
         "mapper_summary": summary, "anneal": ann, "planning": planning, "large_arrays": large,
         "sweep": sweep, "startup": start, "targets": targets}, indent=1, default=str))
    print(f"\nwrote {OUT / (name + '.json')}" + (f" and {OUT / 'bench_engine.png'}"
                                                   if speed and ss and rows else ""))
    return 0 if all(r["values_ok"] for r in speed + planning) \
        and all(r["identical"] for r in ss) else 1


if __name__ == "__main__":
    sys.exit(main())
