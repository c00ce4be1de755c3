"""Builds notebooks/06_gpu_vs_dataflow.ipynb (committed without outputs; CI executes it).

    python notebooks/make_06_gpu_vs_dataflow.py
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    ("md", """# 06 · The same workload on a GPU and on the dataflow array

`dataflow.cuda` runs the dataflow ops as Numba CUDA kernels: tiled GEMM, CSR SpMM, SDDMM,
butterfly stages (one per launch, or fused in shared memory), the FFT, sparse attention (fused,
or SDDMM → softmax → SpMM) and PIT micro-tile gathers. On a machine with a GPU they run there;
without one, in the CUDA simulator — which is where this notebook runs in CI. Every GPU time
below says whether it was **measured** (CUDA events) or **modelled** (roofline of a datasheet)."""),
    ("code", """%matplotlib inline
import numpy as np
import matplotlib.pyplot as plt

from dataflow.cuda import execution_mode, have_gpu
from dataflow.cuda.device import device_name

print("GPU present:", have_gpu(), "| kernels run on:", execution_mode(), "|", device_name())"""),
    ("md", """## Values: every kernel against its numpy definition

Small shapes (the simulator runs each GPU thread as a Python thread)."""),
    ("code", """from dataflow.cuda import ops, reference as ref
rng = np.random.default_rng(0)
a = rng.standard_normal((20, 24), dtype=np.float32)
b = rng.standard_normal((24, 12), dtype=np.float32)
x = rng.standard_normal((2, 16), dtype=np.float32)
q, k, v = (rng.standard_normal((12, 8), dtype=np.float32) for _ in range(3))
pos = np.arange(0, 13 * 3, 3)                       # 3 keys per query: i-1, i, i+1 (wrapped)
crd = ((np.arange(12)[:, None] + np.array([-1, 0, 1])) % 12).ravel()
rows = [
    ("gemm (tile 8)", ops.gemm(a, b, tile=8), ref.gemm(a, b)),
    ("fft n=16", ops.fft(x), np.fft.fft(x)),
    ("attention, fused", ops.sparse_attention(q, k, v, pos, crd), ref.sparse_attention(q, k, v, pos, crd)),
    ("micro-tile 1x64", ops.microtile_matmul(a, b, (1, 64))[0], ref.gemm(a, b)),
]
for name, got, want in rows:
    print(f"{name:<20} max abs error {np.max(np.abs(got - want)):.2e}")"""),
    ("md", """## The real compiler checks what the simulator cannot

The simulator accepts Python the CUDA compiler rejects, so every kernel in the registry is also
compiled to PTX for sm_80 (A100) and sm_90 (H100/H200) — in a separate process, because
numba-cuda compiles PTX only with the simulator off."""),
    ("code", """import json, os, subprocess, sys

env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
proc = subprocess.run([sys.executable, "-m", "dataflow.cuda.registry", "--cc", "90"],
                      capture_output=True, text=True, env=env, cwd="..")
for line in proc.stdout.splitlines():
    r = json.loads(line)
    print(f"{r['kernel']:<28} {r['cc']}  ok={r['ok']}  shared={r.get('shared_bytes', '-'):>6} B"
          f"  f64 instructions={r.get('f64_instructions', '-')}")"""),
    ("md", """## GPUs from their datasheets

`arch_configs/gpus/*.yaml` hold peak FLOP/s per precision, memory bandwidth and power, each with
its source. A kernel's modelled time is its roofline: max(FLOPs / peak, bytes / bandwidth) plus a
launch overhead — a lower bound on what the GPU could do. The launches come from a *dry run* of
the host code (nothing executes), so any size can be costed."""),
    ("code", """from dataflow.cuda.gpu_spec import load_gpu
from dataflow.cuda.runner import dry_run
from dataflow.cuda.roofline import model_cost

gpus = [load_gpu(g) for g in ("jetson_xavier_nx", "a100", "h200")]
for g in gpus:
    print(f"{g.name:<18} fp32 {g.peak() / 1e12:6.2f} TFLOP/s  {g.memory_bandwidth_bytes_per_s / 1e9:7,.0f} GB/s"
          f"  {g.power_w:5.0f} W  ridge {g.ridge_flops_per_byte():5.1f} FLOP/B")

big = np.zeros((1024, 1024), np.float32)
points = {
    "gemm 1024^3": dry_run(ops.gemm, big, big),
    "fft 1024 x 1024": dry_run(ops.fft, big),
    "butterfly fused": dry_run(ops.butterfly, big, np.zeros((10, 512, 2, 2), np.float32)),
}
ai = np.logspace(-2, 3, 100)
fig, ax = plt.subplots(figsize=(7, 4))
for g in gpus:
    ax.loglog(ai, np.minimum(g.peak(), ai * g.memory_bandwidth_bytes_per_s) / 1e9, label=g.name)
for name, launches in points.items():
    f, by = sum(l.flops for l in launches), sum(l.bytes for l in launches)
    ax.axvline(f / by, color="grey", ls=":")
    ax.text(f / by, 2, name, rotation=90, fontsize=8)
ax.set_xlabel("arithmetic intensity (FLOP / compulsory byte)")
ax.set_ylabel("attainable GFLOP/s (fp32)")
ax.legend(fontsize=8)
plt.show()"""),
    ("md", """## Same inputs, three backends

`crosscheck` builds a registered workload's operands once and runs them through numpy, the
simulated array and the CUDA kernels (`dataflow crosscheck --workload ...` on the command line)."""),
    ("code", """from dataflow.cuda.compare import compare, crosscheck, plot_comparison

print(crosscheck("attention", pattern="window", window=2, seq=16, dim=8).summary())"""),
    ("md", """## Cost side by side

The dataflow array's time and energy come from the cycle-level engine; each GPU's from its spec
(modelled here, measured with CUDA events on a machine that has that GPU)."""),
    ("code", """cmp = compare("attention", pattern="butterfly", seq=256, dim=64,
              gpus=["jetson_xavier_nx", "a100", "h200"])
print(cmp.summary())
import tempfile
from IPython.display import Image
Image(plot_comparison(cmp, f"{tempfile.mkdtemp()}/06_compare.png"))"""),
    ("md", """## The butterfly paper's comparison, in miniature

The multi-layer dataflow butterfly paper (arXiv 2411.00734) reports up to 14.34× (9.29× on
average) speedup and 11.14× energy efficiency over a *measured* Jetson Xavier NX on attention.
Two forms of butterfly attention run here: FNet/FABNet token mixing (a 2-D FFT, the form the
butterfly networks use) and softmax attention on the butterfly pattern. The Jetson is a
roofline — the fastest it could possibly be — so the ratios are lower bounds;
`benchmarks/bench_gpu_vs_dataflow.py` runs sequence lengths 256 to 4096 at hidden 512."""),
    ("code", """forms = {"fnet": ("fnet-attention", [64, 128], lambda s: {"seq": s, "dim": 64}),
         "pattern": ("attention", [128, 256],
                     lambda s: {"pattern": "butterfly", "seq": s, "dim": 64})}
fig, ax = plt.subplots(figsize=(6, 3.5))
for form, (workload, seqs, params) in forms.items():
    runs = [compare(workload, gpus=["jetson_xavier_nx"], **params(s)) for s in seqs]
    for s, r in zip(seqs, runs):
        g = r.gpus[0]
        print(f"{form:<8} seq {s:4}: speedup {r.speedup(g):5.2f}x, energy efficiency "
              f"{r.energy_ratio(g):6.2f}x  (GPU {g.label})")
    ax.plot(seqs, [r.speedup(r.gpus[0]) for r in runs], "o-", label=f"{form}: speedup")
    ax.plot(seqs, [r.energy_ratio(r.gpus[0]) for r in runs], "s--", label=f"{form}: energy")
ax.axhline(9.29, color="tab:red", ls="--", label="paper: mean speedup 9.29x")
ax.axhline(11.14, color="tab:purple", ls=":", label="paper: energy efficiency 11.14x")
ax.set_xscale("log", base=2); ax.set_yscale("log"); ax.set_xlabel("sequence length")
ax.set_title("dataflow (simulated) vs Jetson Xavier NX (modelled)", fontsize=9)
ax.legend(fontsize=7)
plt.show()"""),
]


def build() -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.cells = [new_markdown_cell(src) if kind == "md" else new_code_cell(src)
                for kind, src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


if __name__ == "__main__":
    out = Path(__file__).resolve().parent / "06_gpu_vs_dataflow.ipynb"
    nbformat.write(build(), out)
    print(f"wrote {out}")
