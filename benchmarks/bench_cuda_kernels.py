"""Throughput of every CUDA kernel family: achieved FLOP/s and bandwidth, against the roofline.

On a GPU, each op is timed with CUDA events (median of --repeats after a warm-up) and shown next
to the roofline of the GPU's spec (arch_configs/gpus/*.yaml matching the device): "of roofline"
= modelled time / measured time. Without a GPU nothing is measured: each op's launches are
costed by the roofline of --gpu (a dry run, no kernel executes) and every row says "modelled".
Fused vs unfused variants (butterfly stages in shared memory vs one launch per stage; attention
in one kernel vs SDDMM -> softmax -> SpMM) and PIT micro-tiles vs dense GEMM run side by side.

    python benchmarks/bench_cuda_kernels.py [--quick] [--gpu h200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"


def cases(quick: bool, rng):
    """(label, op function, args, kwargs) at GPU-sized shapes (smaller with --quick)."""
    import scipy.sparse as sp

    from dataflow.cuda import ops

    g = 1024 if quick else 2048
    s = 2048 if quick else 8192
    seq = 1024 if quick else 4096
    mt = 1024 if quick else 4096
    a = rng.standard_normal((g, g), dtype=np.float32)
    csr = sp.random(s, s, density=0.01, format="csr", dtype=np.float32, random_state=1)
    dense64 = rng.standard_normal((s, 64), dtype=np.float32)
    x = rng.standard_normal((1024, 1024), dtype=np.float32)
    f = (rng.standard_normal((10, 512, 2, 2)) / np.sqrt(2)).astype(np.float32)
    q = rng.standard_normal((seq, 64), dtype=np.float32)
    win = 32  # keys i - 32 .. i + 31 (wrapped): 64 per query
    pos = np.arange(0, (seq + 1) * 2 * win, 2 * win)
    crd = ((np.arange(seq)[:, None] + np.arange(-win, win)[None, :]) % seq).ravel()
    dyn = rng.standard_normal((mt, mt), dtype=np.float32)
    dyn[:, rng.random(mt) < 0.9] = 0  # 90 % of A's columns zero: 32x1 tiles skip them
    w = rng.standard_normal((mt, mt), dtype=np.float32)
    return [
        (f"gemm {g}^3", ops.gemm, (a, a), {}),
        (f"spmm {s}^2 1% x 64", ops.spmm, (csr.indptr, csr.indices, csr.data, csr.shape,
                                           dense64), {}),
        (f"sddmm {s}^2 1%, k 64", ops.sddmm, (dense64, dense64.T.copy(), csr.indptr,
                                              csr.indices, csr.data), {}),
        ("butterfly 1024 x n1024, fused", ops.butterfly, (x, f), {"fused": True}),
        ("butterfly 1024 x n1024, per stage", ops.butterfly, (x, f), {"fused": False}),
        ("fft 1024 x n1024", ops.fft, (x,), {}),
        (f"attention seq {seq} d64 w64, fused", ops.sparse_attention, (q, q, q, pos, crd),
         {"fused": True}),
        (f"attention seq {seq} d64 w64, unfused", ops.sparse_attention, (q, q, q, pos, crd),
         {"fused": False}),
        (f"attention seq {seq} d64 win32, affine", ops.sparse_attention, (q, q, q),
         {"window": 32}),
        (f"dense gemm {mt}^3 (A 90% zero)", ops.gemm, (dyn, w), {}),
        (f"micro-tile 32x1 {mt}^3", ops.microtile_matmul, (dyn, w), {"granularity": (32, 1)}),
        (f"micro-tile 32x64 {mt}^3", ops.microtile_matmul, (dyn, w), {"granularity": (32, 64)}),
    ]


def main(argv=None) -> int:
    from dataflow.cuda.device import device_name, have_gpu
    from dataflow.cuda.gpu_spec import available_gpus, load_gpu
    from dataflow.cuda.roofline import model_cost
    from dataflow.cuda.runner import dry_run, measure

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--gpu", default="h200", help="spec to model when no GPU matches")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    gpu = have_gpu()
    dev = device_name() if gpu else "none"
    spec = load_gpu(args.gpu)
    if gpu:
        match = [g for g in available_gpus() if load_gpu(g).matches_device(dev)]
        spec = load_gpu(match[0]) if match else spec
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, GPU: {dev}")
    print(f"roofline spec: {spec.name} ({spec.peak() / 1e12:.1f} TFLOP/s fp32, "
          f"{spec.memory_bandwidth_bytes_per_s / 1e9:,.0f} GB/s)")
    rng = np.random.default_rng(0)
    rows = []
    head = (f"{'op':<36}{'time us':>11}{'GFLOP/s':>10}{'GB/s':>9}{'launches':>9}"
            f"{'roofline us':>13}{'of roofline':>12}  source")
    print(head + "\n" + "-" * len(head))
    for label, fn, fargs, kw in cases(args.quick, rng):
        model = model_cost(spec, dry_run(fn, *fargs, **kw))
        if gpu:
            _, t = measure(label, fn, *fargs, repeats=args.repeats, **kw)
            sec, src = t.seconds, "measured"
        else:
            sec, src = model.seconds, "modelled"
        row = {"op": label, "seconds": sec, "source": src, "flops": model.flops,
               "bytes": model.bytes, "launches": model.launches,
               "roofline_seconds": model.seconds, "of_roofline": model.seconds / sec}
        rows.append(row)
        frac = f"{100 * row['of_roofline']:>11.1f}%" if gpu else f"{'-':>12}"
        print(f"{label:<36}{sec * 1e6:>11,.1f}{model.flops / sec / 1e9:>10,.1f}"
              f"{model.bytes / sec / 1e9:>9,.1f}{model.launches:>9}"
              f"{model.seconds * 1e6:>13,.1f}{frac}  {src}")
    print("\nside by side (same run):")
    for a, b in (("fused", "per stage"), ("fused", "unfused")):
        for r in rows:
            if r["op"].endswith(", " + a):
                base = r["op"][: -len(a)] + b
                other = next((x for x in rows if x["op"] == base), None)
                if other:
                    print(f"  {r['op']}: {other['seconds'] / r['seconds']:.2f}x faster than "
                          f"{b}, which moves {other['bytes'] / r['bytes']:.2f}x the bytes "
                          f"({r['source']})")
    dense = next(r for r in rows if r["op"].startswith("dense gemm"))
    for r in rows:
        if r["op"].startswith("micro-tile"):
            print(f"  {r['op']}: {dense['seconds'] / r['seconds']:.2f}x faster than the dense "
                  f"GEMM on the same A ({r['source']})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    OUT.mkdir(parents=True, exist_ok=True)
    _plot(rows, OUT / "cuda_kernels.png", spec.name)
    print(f"plot: {OUT / 'cuda_kernels.png'}")
    return 0


def _plot(rows, path, gpu):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    ys = range(len(rows))
    ax.barh(ys, [r["seconds"] * 1e6 for r in rows],
            color=["tab:green" if r["source"] == "measured" else "tab:orange" for r in rows],
            label="time (green measured, orange modelled)")
    ax.scatter([r["roofline_seconds"] * 1e6 for r in rows], ys, color="k", marker="|", s=200,
               label="roofline")
    ax.set_yticks(list(ys), [r["op"] for r in rows], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("microseconds")
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    ax.set_title(f"CUDA kernels on {gpu}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
