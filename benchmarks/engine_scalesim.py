"""bench_engine.py section 2: wall time against SCALE-Sim 3.0.0 on the same dense GEMMs at
identical cycles (issue 14 point 3), whole processes and in one process."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from benchcommon import timed

from dataflow.arch import load_arch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# Issue 14 point 3. SCALE-Sim 3.0.0 runs in its own venv (benchmarks/scalesim/README.md), in CALC
# bandwidth mode with 65536 kB SRAMs (benchmarks/scalesim/run_scalesim.py): no stalls, so its
# "Total Cycles" are the compute cycles our systolic presets reproduce. Whole processes: the
# `dataflow simulate --timing-only` command (timing and SCALE-Sim's memory model in closed form,
# numpy not imported: dataflow/pe_array/systolic_timing.py, docs/conventions.md#timing-only;
# what SCALE-Sim computes, which computes no values) and, on a second line, the command
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


