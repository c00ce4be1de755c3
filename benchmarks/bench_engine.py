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
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "scalesim"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import dataflow
import dataflow.mapper.map as map_module
from dataflow.arch import load_arch

OUT = HERE / "out"
SECTIONS = ("engine", "scalesim", "mapper", "planning", "large", "sweep", "startup")


def machine() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}")


def timed(workload, arch, repeats=2, **params):
    """Best wall time of `repeats` runs after one warm-up run (numba compilation, arch load)."""
    res = dataflow.simulate(workload, arch=arch, **params)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = dataflow.simulate(workload, arch=arch, **params)
        best = min(best, time.perf_counter() - t0)
    return res, best


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


# --- 2. against SCALE-Sim ---------------------------------------------------------------------
# Issue 14 point 3. SCALE-Sim 3.0.0 runs in its own venv (benchmarks/scalesim/README.md), in CALC
# bandwidth mode with 65536 kB SRAMs (benchmarks/scalesim/run_scalesim.py): no stalls, so its
# "Total Cycles" are the compute cycles our systolic presets reproduce. Whole processes: the
# `dataflow simulate --timing-only` command (lowering, mapping, timing, SCALE-Sim's memory
# model: what SCALE-Sim computes, which computes no values) and, on a second line, the command
# with values (operands drawn, the fp32 product, the check against numpy), against SCALE-Sim's
# script, each a new process, warm (one untimed run first), with bytecode (ours in a temporary
# PYTHONPYCACHEPREFIX, as an installed wheel has it). The target is judged on the timing-only
# process, SCALE-Sim's own mode. In one
# process: our `dataflow.simulate()` and our cycles alone (lowering, mapping, closed form and
# SCALE-Sim's memory model; no value arithmetic, which SCALE-Sim does not do) against the time
# SCALE-Sim spends inside `run_scale`.

#: (m, n, k, dataflow, array edge, whole process?, speed-up target); quick runs skip 1024^3
SCALESIM_CASES = ((256, 256, 256, "ws", 32, True, 20), (1024, 1024, 1024, "ws", 128, True, 200),
                  (512, 512, 512, "ws", 32, False, 1000))
#: SCALE-Sim wall seconds recorded on the 2-core dev box, for runs without its venv
#: (benchmarks/scalesim/README.md): (m, n, k, df, edge) -> (whole process, inside run_scale)
RECORDED_SCALESIM = {(256, 256, 256, "ws", 32): (6.7, 6.1), (512, 512, 512, "ws", 32): (10.3, 10.2),
                     (1024, 1024, 1024, "ws", 128): (82.0, 81.0)}


def systolic_arch_file(edge: int, folder: Path) -> Path:
    """The systolic preset as an edge x edge array: the 32 x 32 preset's file itself, else a
    YAML written to `folder` with its rows and columns set and SRAMs as large as the SCALE-Sim
    run's (16 Mi words each), so the ofmap never drains mid-run and nothing stalls."""
    preset = ROOT / "arch_configs" / "systolic_32x32.yaml"
    if edge == 32:
        return preset
    import yaml

    from dataflow.arch.load import arch_to_dict

    data = arch_to_dict(load_arch(preset))
    data["name"] = f"systolic-{edge}x{edge}"
    data["pe_array"].update(rows=edge, cols=edge)
    data["spm"]["capacity_words_per_line"] = 1 << 24
    path = folder / f"systolic_{edge}x{edge}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _process_wall(argv: list[str], env: dict, repeats: int) -> tuple[float, str]:
    """Best wall seconds of `repeats` runs of the process `argv` (after one untimed run), and
    its last stdout."""
    import subprocess

    best, out = float("inf"), ""
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        run = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
        if i:
            best = min(best, time.perf_counter() - t0)
        out = run.stdout
    return best, out


def _ours_whole_process(arch_file: Path, m, n, k, df, repeats: int, pyc: str,
                        timing_only: bool):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONPYCACHEPREFIX=pyc)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    wall, out = _process_wall(
        [sys.executable, "-m", "dataflow.cli", "simulate", "--arch", str(arch_file),
         "--workload", "gemm", "--m", str(m), "--n", str(n), "--k", str(k), "--dataflow", df,
         "--json", *(["--timing-only"] if timing_only else [])], env, repeats)
    res = json.loads(out)
    assert res["values_computed"] is not timing_only
    assert timing_only or res["values_match_reference"], "dataflow's values differ from numpy's"
    return wall, res["cycles"], res["compute_cycles"]


def _scalesim_run(python, m, n, k, df, edge, repeats: int):
    """SCALE-Sim's (whole-process wall, wall inside run_scale, Total Cycles)."""
    script = HERE / "scalesim" / "run_scalesim.py"
    wall, out = _process_wall([python, str(script), str(m), str(n), str(k), df, "--rows",
                               str(edge), "--cols", str(edge)], dict(os.environ), repeats)
    res = json.loads([ln for ln in out.splitlines() if ln.strip()][-1])
    return wall, res["wall_seconds"], res["total_cycles"]


def _ours_in_process(arch, m, n, k, df, repeats: int = 3):
    """Best wall seconds of `dataflow.simulate()` and of our cycles alone, warm, with both
    cycle counts (`simulate`'s and the timing path's)."""
    from dataflow.dfg.lower import lower_gemm
    from dataflow.mapper import map_program
    from dataflow.pe_array.systolic import closed_form_cycles
    from dataflow.pe_array.systolic_memory import systolic_memory

    res, whole = timed("gemm", arch, repeats=repeats, m=m, k=k, n=n, dataflow=df)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)

    def cycles():
        (sm,) = map_program(lower_gemm(a, b), arch, dataflow=df).kernels
        mem = systolic_memory(sm, arch)
        assert mem.stall_cycles == 0
        return closed_form_cycles(df, m, n, k, sm.rows, sm.cols), mem.total_cycles

    cycles()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        compute, total = cycles()
        best = min(best, time.perf_counter() - t0)
    assert compute == total == res.compute_cycles == res.cycles
    return res.cycles, whole, best


def scalesim_comparison(quick: bool, use_scalesim: bool):
    """Rows of the SCALE-Sim table (see the section comment); SCALE-Sim's side measured when its
    venv is there, else its golden cycles (or the closed form that reproduces them) and the
    wall times in RECORDED_SCALESIM, labelled recorded."""
    import tempfile

    from closed_form import scalesim_compute_cycles

    python = None
    if use_scalesim:
        from run_scalesim import scalesim_python
        python = scalesim_python()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-scalesim-") as tmp:
        for m, n, k, df, edge, whole, target in SCALESIM_CASES:
            if quick and edge > 32:
                continue
            arch_file = systolic_arch_file(edge, Path(tmp))
            row = {"gemm": f"{m}x{n}x{k} {df}", "array": f"{edge}x{edge}", "target": target,
                   "whole_process": whole, "scalesim": "measured" if python else "recorded"}
            key = (m, n, k, df, edge)
            if python:
                reps = 1 if m * n * k > 2**28 else 2
                ss_proc, ss_inside, ss_cycles = _scalesim_run(python, m, n, k, df, edge, reps)
            else:
                (ss_proc, ss_inside), ss_cycles = RECORDED_SCALESIM[key], \
                    scalesim_compute_cycles(m, n, k, df, edge, edge)
            if whole:
                ours, cycles, compute = _ours_whole_process(arch_file, m, n, k, df, 3, tmp,
                                                            timing_only=True)
                with_values, cycles_v, _ = _ours_whole_process(arch_file, m, n, k, df, 2, tmp,
                                                               timing_only=False)
                assert cycles_v == cycles, "timing-only cycles differ from the full run's"
                row.update(ours_s=ours, scalesim_s=ss_proc, values_s=with_values,
                           speedup_values=ss_proc / with_values)
            else:
                cycles, sim_s, ours = _ours_in_process(load_arch(arch_file), m, n, k, df)
                compute = cycles
                row.update(ours_s=ours, simulate_s=sim_s, scalesim_s=ss_inside)
            row.update(cycles=cycles, scalesim_cycles=ss_cycles,
                       identical=cycles == compute == ss_cycles, speedup=row["scalesim_s"] /
                       row["ours_s"])
            if not whole:
                row["speedup_simulate"] = ss_inside / row["simulate_s"]
            rows.append(row)
    print(scalesim_table(rows))
    return rows


def scalesim_table(rows) -> str:
    lines = [f"\n{'GEMM':16} {'array':>7} {'how':>13} {'cycles':>9} {'SCALE-Sim':>9} {'same':>4} "
             f"{'dataflow s':>10} {'SCALE-Sim s':>11} {'speed-up':>9} {'target':>7}"]
    for r in rows:
        how = "timing-only" if r["whole_process"] else "in process"
        ss = f"{r['scalesim_s']:.2f}" + ("" if r["scalesim"] == "measured" else " rec")
        lines.append(f"{r['gemm']:16} {r['array']:>7} {how:>13} {r['cycles']:>9,} "
                     f"{r['scalesim_cycles']:>9,} {'yes' if r['identical'] else 'NO':>4} "
                     f"{r['ours_s']:>10.4f} {ss:>11} {r['speedup']:>8,.0f}x {r['target']:>6}x "
                     f"{'ok' if r['speedup'] >= r['target'] else '!!'}")
        if r["whole_process"]:
            lines.append(f"{'':16} {'':>7} {'with values':>13} {'':>9} {'':>9} {'':>4} "
                         f"{r['values_s']:>10.4f} {'':>11} {r['speedup_values']:>8,.0f}x "
                         "(operands, fp32 product, the numpy check)")
        else:
            lines.append(f"{'':16} {'':>7} {'simulate()':>13} {'':>9} {'':>9} {'':>4} "
                         f"{r['simulate_s']:>10.4f} {'':>11} {r['speedup_simulate']:>8,.0f}x "
                         "(with values and the numpy check)")
    lines.append("timing-only: `dataflow simulate ... --timing-only --json` (SCALE-Sim's mode: "
                 "no values) against SCALE-Sim's script, new processes, warm, with bytecode; with "
                 "values: the same without --timing-only; in process: our cycles (lowering, "
                 "mapping, "
                 "closed form, SCALE-Sim's memory model) against the time inside SCALE-Sim's "
                 "run_scale; 'rec': SCALE-Sim's time recorded on the dev box, not measured now")
    return "\n".join(lines)


# --- 3. mapper corpus -------------------------------------------------------------------------

def corpus(quick: bool):
    """(label, kernel, arch) for every kernel the workloads map, plus random DFGs."""
    from tests.archs import variant
    from tests.programs import random_program

    archs = {"default-8x8": variant(), "4x4": variant(**{"pe_array.rows": 4, "pe_array.cols": 4}),
             "torus-skip": variant(**{"interconnect.topology": "torus",
                                      "interconnect.skip_hop_strides": [2]})}
    runs = [("gemm", {"m": 32, "k": 16, "n": 16}),
            ("spmm", {"m": 64, "k": 64, "n": 16, "density": 0.1}),
            ("attention", {"seq": 32, "dim": 16}),
            ("moe", {"tokens": 16, "dim": 16, "hidden": 16, "experts": 4}),
            ("dynamic-spmm", {"m": 64, "k": 64, "n": 16}),
            ("relu-ffn", {"tokens": 32, "dim": 32, "hidden": 64}),
            ("butterfly", {"n": 32, "batch": 4}), ("fft", {"n": 16, "batch": 4})]
    from dataflow.workloads import workloads
    known = workloads()
    captured = []
    orig = map_module.map_kernel

    def grab(kernel, arch, *a, **kw):
        captured.append((kernel, arch, a, kw))
        return orig(kernel, arch, *a, **kw)

    # every module that calls map_kernel by its own name (the schedule search in plan/compile
    # and the stage mapper), patched for the capture; an empty plan cache, so a warm one on
    # this machine does not hide kernels (the corpus held 58 kernels instead of 111 when
    # plan/compile's calls went uncaptured)
    import tempfile

    import dataflow.plan.compile as compile_module
    import dataflow.plan.stage_mapping as orch_module
    patched = [(m, m.map_kernel) for m in (map_module, orch_module, compile_module)]
    for m, _ in patched:
        m.map_kernel = grab
    saved_cache = os.environ.get("DATAFLOW_CACHE_DIR")
    tmp = tempfile.TemporaryDirectory(prefix="bench-corpus-")
    os.environ["DATAFLOW_CACHE_DIR"] = tmp.name
    try:
        for aname, arch in (list(archs.items())[:1] if quick else archs.items()):
            for wl, params in runs:
                if wl not in known:
                    continue
                before = len(captured)
                try:
                    dataflow.simulate(wl, arch=arch, **params)
                except Exception as exc:  # noqa: BLE001 - a workload that does not fit this arch is reported, not fatal
                    print(f"  corpus: {wl} on {aname} skipped ({type(exc).__name__}: {exc})")
                for i in range(before, len(captured)):
                    captured[i] = (f"{wl}/{captured[i][0].name}@{aname}",) + captured[i]
    finally:
        for m, f in patched:
            m.map_kernel = f
        if saved_cache is None:
            os.environ.pop("DATAFLOW_CACHE_DIR", None)
        else:
            os.environ["DATAFLOW_CACHE_DIR"] = saved_cache
        tmp.cleanup()
    last = {}  # the last call per kernel wins: orchestration retries a failed one with more slack
    for label, kernel, arch, _a, kw in captured:
        if kw.get("max_ii_slack", 8) < 8:
            # an extra-copies probe capped at the IIs that could win (`stage_mapping`):
            # replayed with map_kernel's default slack, the problem the corpus always held
            kw = {k: v for k, v in kw.items() if k != "max_ii_slack"}
        last[(label, len(kernel.nodes))] = ("workload", label, kernel, arch, kw)
    items = list(last.values())
    for s in range(10 if quick else 30):
        prog = random_program(s)
        for kern in prog.kernels:
            items.append(("random", f"random{s}/{kern.name}", kern, archs["default-8x8"], {}))
    return items


def mapper_stats(quick: bool):
    items = corpus(quick)
    rows = []
    for group, label, kernel, arch, kw in items:
        kw = {k: v for k, v in kw.items() if k in ("max_tile_rows", "copies", "max_ii_slack")}
        map_module.SCHEDULES.clear()  # each kernel cold: no attempt of an earlier one reused
        t0 = time.perf_counter()
        try:
            km = map_module.map_kernel(kernel, arch, **kw)
        except map_module.MappingError as exc:
            print(f"  unmapped: {label}: {exc}")
            rows.append({"group": group, "kernel": label, "nodes": len(kernel.nodes), "copies": 0,
                             "ii": None, "mii": None, "seconds": time.perf_counter() - t0})
            continue
        dt = time.perf_counter() - t0
        rows.append({"group": group, "kernel": label, "nodes": len(kernel.nodes),
                     "copies": km.copies, "ii": km.ii, "mii": km.mii, "res_mii": km.res_mii,
                     "rec_mii": km.rec_mii, "seconds": dt, "length": km.schedule_length,
                     "hops": sum(len(r.links) for r in km.routes)})
    times = np.array([r["seconds"] for r in rows])
    print(f"\nmapper corpus: {len(rows)} kernels")
    print(f"{'kernel':44} {'nodes':>5} {'copies':>6} {'II':>3} {'MII':>4} {'seconds':>8}")
    for r in rows:
        print(f"{r['kernel'][:44]:44} {r['nodes']:>5} {r['copies']:>6} {r['ii']!s:>3} "
              f"{r['mii']!s:>4} {r['seconds']:>8.3f}")
    summary = {}
    for group in ("workload", "random", "all"):
        sel = [r for r in rows if group == "all" or r["group"] == group]
        if not sel:
            continue
        t = np.array([r["seconds"] for r in sel])
        summary[group] = {"kernels": len(sel),
                              "ii_eq_mii": sum(r["ii"] is not None and r["ii"] == r["mii"]
                                            for r in sel) / len(sel),
                              "unmapped": sum(r["ii"] is None for r in sel),
                              "mean_ii_over_mii": float(np.mean([r["ii"] / r["mii"] for r in sel
                                                              if r["ii"] is not None])),
                              "p50_s": float(np.percentile(t, 50)),
                              "p90_s": float(np.percentile(t, 90)),
                              "max_s": float(t.max())}
    print(f"\n{'group':10} {'kernels':>7} {'unmapped':>8} {'II=MII':>7} {'mean II/MII':>12} "
          f"{'p50 s':>7} {'p90 s':>7} {'max s':>7}")
    for g, s in summary.items():
        print(f"{g:10} {s['kernels']:>7} {s['unmapped']:>8} {100 * s['ii_eq_mii']:>6.0f}% "
              f"{s['mean_ii_over_mii']:>12.2f} "
              f"{s['p50_s']:>7.3f} {s['p90_s']:>7.3f} {s['max_s']:>7.3f}")
    print("targets: II = MII on >= 90 % of kernels; p90 mapping time < 5 s (CGRA-ME: 7.9 s; "
          "issue 14: < 1 s)")
    # the annealing pass on the random kernels: schedule length and link hops before/after
    ann = []
    randoms = [i for i in items if i[0] == "random"]
    for _group, label, kernel, arch, _ in randoms[: 6 if quick else 12]:
        base = map_module.map_kernel(kernel, arch)
        t0 = time.perf_counter()
        imp = map_module.map_kernel(kernel, arch, improve="anneal")
        ann.append({"kernel": label, "length": (base.schedule_length, imp.schedule_length),
                        "hops": (sum(len(r.links) for r in base.routes),
                              sum(len(r.links) for r in imp.routes)),
                        "seconds": time.perf_counter() - t0})
    if ann:
        lb = sum(a["length"][0] for a in ann)
        la = sum(a["length"][1] for a in ann)
        hb = sum(a["hops"][0] for a in ann)
        ha = sum(a["hops"][1] for a in ann)
        print(f"\nimprove='anneal' on {len(ann)} random kernels: "
              f"total schedule length {lb} -> {la}, link hops {hb} -> {ha}, "
              f"mean {np.mean([a['seconds'] for a in ann]):.2f} s per kernel")
    return rows, summary, ann, times


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
    result = bench_dse.measure(counts, 24 if quick else 48)
    print(f"\nsweep: {result['points']} points (gemm and spmm on 12 architectures), "
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
