#!/usr/bin/env python3
"""One command for a GPU machine: GPU tests, cross-checks and GPU benchmarks -> one report.

    python scripts/gpu_report.py [--out out/gpu_report.md] [--quick]

Steps (each a subprocess; its output, exit code and wall time go into the report):
  1. the device (nvidia-smi, and what numba-cuda sees);
  2. the GPU tests: `DATAFLOW_HAVE_GPU=1 pytest -m gpu`, plus the kernel-vs-numpy tests, which
     run on the GPU when there is one;
  3. `dataflow crosscheck` (numpy vs sim vs cuda) for every workload the CUDA path covers;
  4. benchmarks/bench_cuda_kernels.py (CUDA-event timings against the roofline) and
     benchmarks/bench_gpu_vs_dataflow.py (butterfly attention vs the Jetson Xavier NX spec,
     and vs this machine's GPU, measured).
Exit code 0 only if every step passed. Without a GPU it stops, unless --allow-no-gpu (a smoke
run of the script itself: kernels then run in the CUDA simulator and nothing is measured).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CROSSCHECKS = {  # workload -> flags; sizes a GPU does in no time (the sim side dominates)
    "gemm": "--m 128 --k 128 --n 64",
    "spmm": "--m 512 --k 512 --n 64 --density 0.02",
    "attention": "--pattern butterfly --seq 256 --dim 64",
    "dynamic-spmm": "--m 256 --k 256 --n 64 --sparsity 0.9 --granularity 32x1",
    "relu-ffn": "--tokens 64 --dim 64 --hidden 256 --sparsity 0.9 --granularity 32x1",
    "butterfly": "--n 256 --batch 32 --complex 1",
    "fft": "--n 1024 --batch 16",
    "fnet-attention": "--seq 128 --dim 64",
    "moe": "--experts 8 --top-k 2 --tokens 64 --dim 64 --hidden 64 --skew 0.5",
}
QUICK_CROSSCHECKS = {  # small enough for the CUDA simulator (--allow-no-gpu smoke runs)
    "gemm": "--m 16 --k 16 --n 16",
    "spmm": "--m 16 --k 16 --n 8 --density 0.2",
    "attention": "--pattern window --window 2 --seq 16 --dim 8",
    "dynamic-spmm": "--m 64 --k 64 --n 32 --sparsity 0.5 --granularity 1x64",
    "relu-ffn": "--tokens 32 --dim 16 --hidden 64 --sparsity 0.75 --granularity 32x1",
    "butterfly": "--n 16 --batch 4 --complex 1",
    "fft": "--n 32 --batch 4",
    "fnet-attention": "--seq 16 --dim 8",
    "moe": "--experts 4 --top-k 2 --tokens 16 --dim 8 --hidden 8",
}


def step(title: str, cmd: list[str], env=None, timeout: int = 1800) -> dict:
    t0 = time.perf_counter()
    print(f"== {title}: {shlex.join(cmd)}", flush=True)
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=timeout, check=False)
        rc, out = p.returncode, (p.stdout + p.stderr)
    except subprocess.TimeoutExpired as exc:
        rc, out = 124, f"timed out after {timeout} s\n{exc.stdout or ''}"
    except FileNotFoundError as exc:
        rc, out = 127, str(exc)
    wall = time.perf_counter() - t0
    print(f"   rc {rc} in {wall:.1f} s", flush=True)
    return {"title": title, "cmd": shlex.join(cmd), "rc": rc, "wall": wall, "out": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "out" / "gpu_report.md"))
    ap.add_argument("--quick", action="store_true", help="smaller benchmarks")
    ap.add_argument("--allow-no-gpu", action="store_true",
                    help="run anyway without a GPU (simulator; a smoke test of this script)")
    args = ap.parse_args(argv)

    from dataflow.cuda.device import have_gpu

    gpu = have_gpu()
    if not gpu and not args.allow_no_gpu:
        print("gpu_report: no CUDA device found (the CUDA driver reports none); run this on a "
              "GPU machine, or pass --allow-no-gpu for a simulator smoke run", file=sys.stderr)
        return 2
    py = sys.executable
    env = dict(os.environ, DATAFLOW_HAVE_GPU="1" if gpu else "0", MPLBACKEND="Agg")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    steps = [
        step("device", ["nvidia-smi"] if gpu else ["true"], env=env),
        step("numba-cuda device", [py, "-c", ("from dataflow.cuda.device import device_name, "
                                              "execution_mode; print(execution_mode(), "
                                              "device_name())")], env=env),
        step("GPU tests (pytest -m gpu)", [py, "-m", "pytest", "-q", "-m", "gpu", "tests/"],
             env=env),
        step("kernel tests (on the GPU when present)",
             [py, "-m", "pytest", "-q", "tests/test_cuda_kernels.py", "tests/test_cuda_ptx.py"],
             env=env),
    ]
    if not gpu:  # pytest -m gpu selects only skipped tests: rc 5 (nothing ran) is expected
        steps[2]["rc"] = 0 if steps[2]["rc"] in (0, 5) else steps[2]["rc"]
    checks = QUICK_CROSSCHECKS if (args.quick or not gpu) else CROSSCHECKS
    for w, flags in checks.items():
        steps.append(step(f"crosscheck {w}", [py, "-m", "dataflow.cli", "crosscheck",
                                              "--workload", w, *flags.split()], env=env))
    quick = ["--quick"] if args.quick or not gpu else []
    steps.append(step("bench_cuda_kernels", [py, "benchmarks/bench_cuda_kernels.py", *quick],
                      env=env))
    steps.append(step("bench_gpu_vs_dataflow (Jetson Xavier NX spec)",
                      [py, "benchmarks/bench_gpu_vs_dataflow.py", *quick], env=env))
    if gpu:
        from dataflow.cuda.device import device_name
        from dataflow.cuda.gpu_spec import available_gpus, load_gpu

        dev = device_name()
        here = [g for g in available_gpus() if load_gpu(g).matches_device(dev)]
        if here:
            steps.append(step(f"bench_gpu_vs_dataflow ({here[0]}, measured)",
                              [py, "benchmarks/bench_gpu_vs_dataflow.py", "--gpu", here[0],
                               *quick], env=env))
    ok = all(s["rc"] == 0 for s in steps)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    present = "yes" if gpu else ("NO (kernels ran in the CUDA simulator; nothing below is a "
                                 "GPU measurement)")
    lines = [f"# dataflow GPU report ({dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC)", "",
             f"GPU present: {present}",
             f"overall: {'PASS' if ok else 'FAIL'}", "",
             "| step | rc | wall s |", "|---|---|---|"]
    lines += [f"| {s['title']} | {s['rc']} | {s['wall']:.1f} |" for s in steps]
    for s in steps:
        lines += ["", f"## {s['title']}", "", f"`{s['cmd']}` -> rc {s['rc']}", "", "```",
                  s["out"].rstrip()[-20000:], "```"]
    out.write_text("\n".join(lines) + "\n")
    print(f"report: {out} ({'PASS' if ok else 'FAIL'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
