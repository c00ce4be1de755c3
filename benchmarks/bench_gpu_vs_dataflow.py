"""Dataflow butterfly attention vs a Jetson Xavier NX: the shape of the butterfly paper's
comparison (arXiv 2411.00734, docs/references.md#multilayer-dataflow: up to 14.34x faster, 9.29x on
average, 11.14x more energy-efficient than a Jetson Xavier NX on attention).

Two forms of butterfly attention, at each sequence length:
  fnet      FNet/FABNet token mixing Re(FFT2) over (seq, hidden): the attention replacement of
            the butterfly networks the paper accelerates (hidden 512 by default);
  pattern   softmax attention restricted to the butterfly pattern (query i attends i and
            i xor 2^s), head dimension 64.
The same operands run on the simulated dataflow array (cycle-level engine and its energy table)
and are costed on the GPU: MEASURED with CUDA events when this machine has the GPU named by
--gpu, otherwise MODELLED as a per-kernel roofline of the launches the CUDA kernels make (peak
FLOP/s and bandwidth of arch_configs/gpus/NAME.yaml, plus a launch overhead). A roofline is a
lower bound on GPU time, so modelled speedups are lower bounds; the paper measured a real Jetson.
"break-even" is the fraction of its roofline the GPU would have to reach for the paper's mean
speedup (9.29x) to hold here. Nothing is fitted.

    python benchmarks/bench_gpu_vs_dataflow.py [--quick] [--seqs 256,512,...] [--forms fnet,pattern]
        [--hidden 512] [--dim 64] [--arch arch_configs/default.yaml] [--gpu jetson_xavier_nx]
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

#: The paper's reported ratios (docs/references.md#multilayer-dataflow; arXiv 2411.00734).
PAPER = {"max_speedup": 14.34, "mean_speedup": 9.29, "energy_efficiency": 11.14}


def machine() -> str:
    from dataflow.cuda.device import device_name, have_gpu

    gpu = device_name() if have_gpu() else "no GPU"
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, {gpu}")


def instance(form: str, seq: int, hidden: int, dim: int) -> tuple[str, dict]:
    """(workload, params) of one butterfly-attention form."""
    if form == "fnet":
        return "fnet-attention", {"seq": seq, "dim": hidden}
    if form == "pattern":
        return "attention", {"pattern": "butterfly", "seq": seq, "dim": dim}
    raise ValueError(f"--forms takes fnet and/or pattern, got {form!r}")


def run(forms, seqs, hidden, dim, arch, gpu):
    from dataflow.cuda.compare import compare

    rows = []
    for form in forms:
        for seq in seqs:
            t0 = time.perf_counter()
            workload, params = instance(form, seq, hidden, dim)
            r = compare(workload, arch, [gpu], **params)
            g = r.gpus[0]
            rows.append({
                "form": form, "workload": workload, "seq": seq, **params,
                "dataflow_cycles": r.dataflow_cycles, "dataflow_us": r.dataflow_seconds * 1e6,
                "dataflow_uj": r.dataflow_energy_joules * 1e6, "gpu": g.gpu,
                "gpu_us": g.seconds * 1e6, "gpu_uj": g.energy_joules * 1e6,
                "gpu_time": g.time_source, "gpu_energy": g.energy_source, "gpu_bound": g.bound,
                "speedup": r.speedup(g), "energy_ratio": r.energy_ratio(g),
                "break_even_eff": r.speedup(g) / PAPER["mean_speedup"],
                "wall_s": time.perf_counter() - t0})
            print(f"  {form} seq {seq}: done in {rows[-1]['wall_s']:.1f} s", flush=True)
    return rows


def table(rows) -> str:
    head = (f"{'form':<8}{'seq':>6}{'dataflow us':>13}{'uJ':>10}{'GPU us':>11}{'uJ':>11}"
            f"{'GPU side':>15}{'speedup':>9}{'energy':>9}{'break-even':>11}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['form']:<8}{r['seq']:>6}{r['dataflow_us']:>13,.1f}"
                     f"{r['dataflow_uj']:>10,.1f}{r['gpu_us']:>11,.1f}{r['gpu_uj']:>11,.1f}"
                     f"{r['gpu_time']:>15}{r['speedup']:>8.2f}x{r['energy_ratio']:>8.2f}x"
                     f"{100 * r['break_even_eff']:>10.1f}%")
    return "\n".join(lines)


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for form in dict.fromkeys(r["form"] for r in rows):
        rs = [r for r in rows if r["form"] == form]
        seqs = [r["seq"] for r in rs]
        lab = f"{form} ({rs[0]['gpu_time']} GPU)"
        axes[0].plot(seqs, [r["speedup"] for r in rs], "o-", label=lab)
        axes[1].plot(seqs, [r["energy_ratio"] for r in rs], "o-", label=lab)
    axes[0].axhline(PAPER["mean_speedup"], color="tab:red", ls="--", label="paper mean 9.29x")
    axes[0].axhline(PAPER["max_speedup"], color="tab:red", ls=":", label="paper max 14.34x")
    axes[0].set_ylabel("speedup (GPU time / dataflow time)")
    axes[1].axhline(PAPER["energy_efficiency"], color="tab:red", ls="--", label="paper 11.14x")
    axes[1].set_ylabel("energy ratio (GPU / dataflow)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.legend(fontsize=8)
    fig.suptitle(f"butterfly attention: dataflow (simulated) vs {rows[0]['gpu']}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    from dataflow.api import DEFAULT_ARCH

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="sequence 256, hidden 64 (a smoke run)")
    ap.add_argument("--seqs", default="256,512,1024,2048,4096")
    ap.add_argument("--forms", default="fnet,pattern")
    ap.add_argument("--hidden", type=int, default=512, help="fnet: model width (default 512)")
    ap.add_argument("--dim", type=int, default=64, help="pattern: head dimension (default 64)")
    ap.add_argument("--arch", default=str(DEFAULT_ARCH))
    ap.add_argument("--gpu", default="jetson_xavier_nx")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    seqs = [256] if args.quick else [int(s) for s in args.seqs.split(",")]
    hidden = 64 if args.quick else args.hidden
    forms = args.forms.split(",")
    print(f"machine: {machine()}")
    print(f"dataflow arch: {args.arch}; GPU: {args.gpu}")
    rows = run(forms, seqs, hidden, args.dim, args.arch, args.gpu)
    print(table(rows))
    print("\nside by side (dataflow side simulated; GPU side as labelled per row):")
    print(f"  {'paper (measured Jetson)':<28} speedup max {PAPER['max_speedup']:.2f}x, mean "
          f"{PAPER['mean_speedup']:.2f}x; energy efficiency {PAPER['energy_efficiency']:.2f}x")
    for form in forms:
        rs = [r for r in rows if r["form"] == form]
        sp = np.array([r["speedup"] for r in rs])
        en = np.array([r["energy_ratio"] for r in rs])
        print(f"  {'this run, ' + form:<28} speedup max {sp.max():.2f}x, mean {sp.mean():.2f}x; "
              f"energy efficiency mean {en.mean():.2f}x ({rs[0]['gpu_time']} GPU)")
    if any(r["gpu_time"] == "modelled" for r in rows):
        print("  modelled GPU = its roofline: the fastest it could be, so these speedups are "
              "lower bounds; 'break-even' = the fraction of roofline the GPU would need to run "
              "at for the paper's 9.29x mean to hold on this array.")
    path = OUT / "gpu_vs_dataflow.png"
    plot(rows, path)
    print(f"plot: {path}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
