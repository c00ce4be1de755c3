"""Dataflow butterfly attention vs a Jetson Xavier NX: the shape of the butterfly paper's
comparison (arXiv 2411.00734; REFERENCES.md "Butterfly sparsity": up to 14.34x faster, 9.29x on
average, 11.14x more energy-efficient than a Jetson Xavier NX on attention).

For each sequence length, the same operands (attention with the butterfly pattern: each query
attends keys i xor 2^s and itself) run on the simulated dataflow array (cycle-level engine,
the arch's energy table) and are costed on the GPU: MEASURED with CUDA events when this machine
has the GPU named by --gpu, otherwise MODELLED as a per-kernel roofline of the launches the CUDA
kernels make (peak FLOP/s and bandwidth of arch_configs/gpus/NAME.yaml, plus a launch overhead).
A roofline is a lower bound on the GPU's time, so modelled speedups are lower bounds; the paper
measured a real Jetson. The table also gives the fraction of its roofline the GPU would have to
reach for the paper's mean speedup to hold ("break-even efficiency"). Nothing is fitted.

    python benchmarks/bench_gpu_vs_dataflow.py [--quick] [--seqs 256,512,...] [--dim 64]
        [--arch arch_configs/default.yaml] [--gpu jetson_xavier_nx]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"

#: The paper's reported ratios (REFERENCES.md, "Butterfly sparsity"; arXiv 2411.00734).
PAPER = {"max_speedup": 14.34, "mean_speedup": 9.29, "energy_efficiency": 11.14}


def machine() -> str:
    from dataflow.cuda.device import have_gpu

    gpu = "a CUDA GPU" if have_gpu() else "no GPU"
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, {gpu}")


def scores(pattern: str, seq: int) -> int:
    """Stored entries of the attention pattern (query-key pairs scored)."""
    from dataflow.attention.api import mask_csr
    from dataflow.attention.patterns import resolve

    return len(mask_csr(resolve(pattern, seq), seq)[1])


def run(seqs, dim, arch, gpu, pattern="butterfly"):
    from dataflow.cuda.compare import compare

    rows = []
    for seq in seqs:
        t0 = time.perf_counter()
        r = compare("attention", arch, [gpu], pattern=pattern, seq=seq, dim=dim)
        g = r.gpus[0]
        rows.append({
            "seq": seq, "dim": dim, "scores": scores(pattern, seq),
            "dataflow_cycles": r.dataflow_cycles, "dataflow_us": r.dataflow_seconds * 1e6,
            "dataflow_uj": r.dataflow_energy_joules * 1e6, "gpu": g.gpu,
            "gpu_us": g.seconds * 1e6, "gpu_uj": g.energy_joules * 1e6,
            "gpu_time": g.time_source, "gpu_energy": g.energy_source, "gpu_bound": g.bound,
            "speedup": r.speedup(g), "energy_ratio": r.energy_ratio(g),
            "break_even_eff": r.speedup(g) / PAPER["mean_speedup"],
            "wall_s": time.perf_counter() - t0})
    return rows


def table(rows) -> str:
    head = (f"{'seq':>6}{'scores':>9}{'dataflow us':>13}{'uJ':>9}{'GPU us':>10}{'uJ':>9}"
            f"{'GPU side':>20}{'speedup':>9}{'energy':>8}{'break-even':>11}{'wall s':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['seq']:>6}{r['scores']:>9,}{r['dataflow_us']:>13,.1f}"
                     f"{r['dataflow_uj']:>9,.1f}{r['gpu_us']:>10,.1f}{r['gpu_uj']:>9,.1f}"
                     f"{r['gpu_time'] + ' time':>20}{r['speedup']:>8.2f}x"
                     f"{r['energy_ratio']:>7.2f}x{100 * r['break_even_eff']:>10.1f}%"
                     f"{r['wall_s']:>8.1f}")
    return "\n".join(lines)


def plot(rows, path: Path, gpu_label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seqs = [r["seq"] for r in rows]
    src = rows[0]["gpu_time"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].plot(seqs, [r["speedup"] for r in rows], "o-", label=f"this run ({src} GPU)")
    axes[0].axhline(PAPER["mean_speedup"], color="tab:red", ls="--", label="paper mean 9.29x")
    axes[0].axhline(PAPER["max_speedup"], color="tab:red", ls=":", label="paper max 14.34x")
    axes[0].set_ylabel(f"speedup over {gpu_label} (GPU time / dataflow time)")
    axes[1].plot(seqs, [r["energy_ratio"] for r in rows], "o-", label=f"this run ({src} GPU)")
    axes[1].axhline(PAPER["energy_efficiency"], color="tab:red", ls="--", label="paper 11.14x")
    axes[1].set_ylabel("energy efficiency (GPU energy / dataflow energy)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.legend(fontsize=8)
    fig.suptitle(f"butterfly attention: dataflow (simulated) vs {gpu_label} ({src})", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    from dataflow.api import DEFAULT_ARCH

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="sequences 256 and 512 only")
    ap.add_argument("--seqs", default="256,512,1024,2048,4096")
    ap.add_argument("--dim", type=int, default=64, help="head dimension (default 64)")
    ap.add_argument("--arch", default=str(DEFAULT_ARCH))
    ap.add_argument("--gpu", default="jetson_xavier_nx")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    seqs = [256, 512] if args.quick else [int(s) for s in args.seqs.split(",")]
    print(f"machine: {machine()}")
    print(f"dataflow arch: {args.arch}; GPU: {args.gpu}")
    rows = run(seqs, args.dim, args.arch, args.gpu)
    print(table(rows))
    sp = np.array([r["speedup"] for r in rows])
    en = np.array([r["energy_ratio"] for r in rows])
    src = rows[0]["gpu_time"]
    print(f"\nside by side (GPU side {src}; dataflow side simulated):")
    print(f"  speedup            this run: max {sp.max():.2f}x, mean {sp.mean():.2f}x   "
          f"paper: max {PAPER['max_speedup']}x, mean {PAPER['mean_speedup']}x")
    print(f"  energy efficiency  this run: mean {en.mean():.2f}x                paper: "
          f"{PAPER['energy_efficiency']}x")
    if src == "modelled":
        print("  the GPU side is a roofline (lower bound on its time): the speedups above are "
              "lower bounds. 'break-even' = the fraction of its roofline the GPU would have to "
              "reach for the paper's 9.29x mean speedup to hold on this array.")
    path = OUT / "gpu_vs_dataflow.png"
    plot(rows, path, rows[0]["gpu"])
    print(f"plot: {path}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
