"""Any problem size (issue 13 point 4; docs/conventions.md#tiling-any-problem-size): the
runs that were refused before the split, each in a process of its own so its peak memory is
its own.

1. dynamic-spmm 1024 x 1024 x 1024, sparsity 0.95, 32 x 1 micro-tiles (B did not fit beside a
   panel of A): N blocks as kernels of one program (docs/conventions.md#dynamic-panel-gemm;
   K panels of whole dynamic programs where K is too long for that);
2. spmm 100000 x 100000 x 64, density 0.001 (B resident was 6.4M words): K panels with the
   partial sums read back, N blocks memoised over the same rows of A;
3. gemm 10,000,000 x 64 x 64 (the operands did not fit the host's memory): M tiles generated
   from the seed one at a time, timing memoised per tile shape, every tile's values checked;
4. attention, window pattern, --seq 65536 (K and V did not fit the SPM): query-row blocks over
   their packed keys, timing memoised per local mask (docs/conventions.md#attention-of-any-size);
5. relu-ffn --tokens 65536 and moe --tokens 100000 (the tokens' activations / gathered X did
   not fit the SPM): token blocks, each a whole program (#relu-ffn-and-moe-of-any-size);
6. fft --n 1024 --batch 1000000 (61 GiB of operands): batch blocks streamed from the seed,
   timing memoised per block size (#butterfly-and-fft-over-any-batch).

Printed per run: simulated cycles, the roofline bound and the fraction reached, wall time and
peak resident memory (ru_maxrss of the run's process), and the split. `--quick` runs smaller
sizes of the same three shapes (seconds, for a smoke test).

    python benchmarks/bench_any_size.py [--quick] [--only NAME]

Writes benchmarks/out/bench_any_size.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from benchcommon import machine

import dataflow

OUT = HERE / "out"

RUNS = {
    "dynamic-spmm": {"m": 1024, "k": 1024, "n": 1024, "sparsity": 0.95, "granularity": "32x1"},
    "spmm": {"m": 100000, "k": 100000, "n": 64, "density": 0.001},
    "gemm": {"m": 10_000_000, "k": 64, "n": 64},
    "attention": {"pattern": "window", "seq": 65536},
    "relu-ffn": {"tokens": 65536},
    "moe": {"tokens": 100_000},
    "fft": {"n": 1024, "batch": 1_000_000},
}
QUICK = {
    "dynamic-spmm": {"m": 512, "k": 1024, "n": 1024, "sparsity": 0.95, "granularity": "32x1"},
    "spmm": {"m": 20000, "k": 50000, "n": 64, "density": 0.001},
    "gemm": {"m": 2_000_000, "k": 64, "n": 64},
    "attention": {"pattern": "window", "seq": 32768},
    "relu-ffn": {"tokens": 8192},
    "moe": {"tokens": 20_000},
    "fft": {"n": 1024, "batch": 1_000_000},
}



def one(name: str, params: dict) -> dict:
    """Run one workload here and return its figures (peak memory of this process)."""
    t0 = time.perf_counter()
    r = dataflow.simulate(name, **params)
    wall = time.perf_counter() - t0
    split = next((n for n in r.notes if n.startswith("split")), "not split")
    return {"workload": name, "params": params, "cycles": r.cycles,
            "roofline_cycles": r.roofline_cycles, "bound": str(r.bound),
            "fraction_of_roofline": r.fraction_of_roofline,
            "values_match_reference": r.values_match_reference,
            "max_abs_error": r.max_abs_error, "wall_seconds": wall,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "split": split}


def child(name: str, params: dict) -> dict:
    """`one` in a fresh process (its own peak memory), its JSON line read back."""
    cmd = [sys.executable, __file__, "--child", name, json.dumps(params)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes of the same shapes")
    ap.add_argument("--only", choices=sorted(RUNS), help="run just this one")
    ap.add_argument("--child", nargs=2, metavar=("NAME", "PARAMS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one(args.child[0], json.loads(args.child[1]))))
        return
    runs = QUICK if args.quick else RUNS
    print(f"machine: {machine()}")
    print(f"{'workload':<14} {'cycles':>15} {'roofline':>13} {'bound':>6} {'fraction':>8} "
          f"{'wall s':>8} {'peak MiB':>9}  values")
    rows = []
    for name, params in runs.items():
        if args.only and name != args.only:
            continue
        row = child(name, params)
        rows.append(row)
        print(f"{name:<14} {row['cycles']:>15,} {row['roofline_cycles']:>13,.0f} "
              f"{row['bound']:>6} {row['fraction_of_roofline']:>8.3f} "
              f"{row['wall_seconds']:>8.1f} {row['peak_rss_mib']:>9,.0f}  "
              f"{'match' if row['values_match_reference'] else 'DIFFER'} "
              f"(max abs error {row['max_abs_error']:.3g})", flush=True)
        print(f"  {row['split']}", flush=True)
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_any_size.json").write_text(json.dumps(
        {"machine": machine(), "quick": args.quick, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
