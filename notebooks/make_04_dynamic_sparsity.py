"""Builds notebooks/04_dynamic_sparsity.ipynb (committed without outputs; CI executes it).

    python notebooks/make_04_dynamic_sparsity.py
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    ("md", """# Dynamic sparsity and mixture of experts on the dataflow array

Some sparsity is known only at run time: ReLU activations, dynamic masks, the experts a router
picks per token. PIT (SOSP 2023, *Permutation Invariant Transformation*; see
[references](../docs/references.md#pit)) handles it by covering the nonzeros with small **micro-tiles** —
32×1 along the reduction axis k, or 1×64 along a row — **gathering** them into dense compute
tiles (*SRead*), computing densely, and **writing** results back to their places (*SWrite*).
Block-sparse kernels (OpenAI's 32×64 blocks) must compute a whole block as soon as it holds
one nonzero. The index of nonzero tiles is built at run time, and that cost counts.

In `dataflow` a dynamic sparse matmul `C = A @ B` is one program of kernels on the array:
`index_scan` (reads all of A, sums a·a per micro-tile), `index_compact` (scatters each nonzero
tile to its slot of the index), then the compute kernels whose GATHER nodes are the SRead. For
1×64 tiles the compute kernel works PIT's way: per k-block it gathers the rows holding a nonzero
tile, multiplies them by that block of B (shared by all of them) and **scatter-adds** the partial
rows into C (`SCATTER_ACC`, SWrite with accumulate). The gathered operands leave DRAM by an
indirect DMA of only the rows the index selects."""),
    ("code", """%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

import dataflow
from dataflow.dynamic import (GRANULARITIES, build_index, make_dynamic_operands, make_ffn_operands,
                              simulate_dynamic_matmul, simulate_relu_ffn)
from dataflow.moe import draw_timeline, make_moe_operands, simulate_moe

arch = dataflow.load_arch("../arch_configs/default.yaml")
print(arch.name, f"{arch.pe_array.rows}x{arch.pe_array.cols} PEs x {arch.pe_array.simd_lanes} lanes,",
      f"{arch.spm.lines} SPM lines")"""),
    ("md", """## Micro-tiles cover random zeros better than blocks

The same 64×128 matrix with 95% of its entries zero at random, covered by each tile shape. A
tile is computed if it holds any nonzero; everything else it holds is a wasted MAC."""),
    ("code", """a, b = make_dynamic_operands(64, 128, 16, 0.95, "element", seed=0)
fig, axes = plt.subplots(1, 4, figsize=(14, 2.6))
axes[0].imshow(a != 0, cmap="Greys", aspect="auto")
axes[0].set_title(f"A: {np.count_nonzero(a)} nonzeros")
for ax, (g, (bh, bw)) in zip(axes[1:], GRANULARITIES.items()):
    idx = build_index(a, (bh, bw))
    cover = np.repeat(np.repeat(idx.tile_nonzero, bh, axis=0), bw, axis=1)
    ax.imshow(cover, cmap="Blues", aspect="auto", vmin=0, vmax=1.5)
    ax.set_title(f"{g}: {100 * idx.tile_density:.0f}% of tiles computed")
for ax in axes:
    ax.set_xticks([]); ax.set_yticks([])
plt.tight_layout()"""),
    ("md", """## Simulated: cycles, wasted MACs and speedup

Each kernel runs on the engine, values are checked against numpy (the dense product of the
masked matrix), and the wasted MACs come from the engine's operation counts on the real data.
Two layouts of the zeros: element-wise at random, and whole 32×1 micro-tiles (PIT's
micro-benchmark draws its patterns at the granularity it measures)."""),
    ("code", """rows = []
for layout in ("element", "32x1"):
    a, b = make_dynamic_operands(128, 256, 32, 0.95, layout, seed=1)
    dense, _ = simulate_dynamic_matmul(a, b, "dense", arch)
    for g in ("32x1", "1x64", "32x64", "dense"):
        res, st = simulate_dynamic_matmul(a, b, g, arch)
        rows.append((layout, g, res.cycles, st.index_cycles, st.wasted_fraction,
                     dense.cycles / res.cycles, res.values_match_reference))
print(f"{'zeros':8} {'kernel':6} {'cycles':>9} {'index':>7} {'wasted':>7} {'speedup':>8}  values")
for layout, g, cyc, idx, w, sp, ok in rows:
    print(f"{layout:8} {g:6} {cyc:>9,} {idx:>7,} {100 * w:>6.1f}% {sp:>7.2f}x  {'ok' if ok else 'WRONG'}")"""),
    ("md", """On 32×1-tiled zeros the 32×1 kernel computes only nonzeros; 32×64 blocks almost never
find an empty block. The index build (`index`) is a fixed cost: it reads all of A whatever
the sparsity. Where the cycles go, kernel by kernel, for the 1×64 scheme (per k-block: gather
rows, scatter-add into C):"""),
    ("code", """a, b = make_dynamic_operands(128, 256, 32, 0.9, "1x64", seed=2)
res, st = simulate_dynamic_matmul(a, b, "1x64", arch)
draw_timeline(res, title=f"1x64 micro-tiles at 90% sparsity: {res.cycles:,} cycles")
plt.tight_layout()"""),
    ("md", """PIT's scheme against the one the engines had before `SCATTER_ACC` (`scheme="packed"`:
each gathered row reduced over all its k-blocks into a packed block, then an overwriting
SWrite), and the gather DMA against DMA of the whole panel of A (`fetch="whole"`): same
values, fewer cycles, fewer DRAM bytes."""),
    ("code", """a, b = make_dynamic_operands(64, 512, 16, 0.95, "1x64", seed=4)
for scheme, fetch in (("pit", "gather"), ("pit", "whole"), ("packed", "whole")):
    res, st = simulate_dynamic_matmul(a, b, "1x64", arch, scheme=scheme, fetch=fetch)
    print(f"{scheme:6} {fetch:6} {res.cycles:>8,} cycles  DRAM read {res.dram_bytes_read:>8,} B  "
          f"values {'ok' if res.values_match_reference else 'WRONG'}")"""),
    ("md", """## Speedup grows with sparsity

32×1 micro-tiles on 32×1-tiled zeros, against dense GEMM on the same matrix (small shapes;
`benchmarks/bench_dynamic_sparsity.py` runs M = K = N = 1024)."""),
    ("code", """sparsities = [0.5, 0.75, 0.9, 0.95, 0.99]
speedups = {g: [] for g in ("32x1", "32x64")}
for s in sparsities:
    a, b = make_dynamic_operands(128, 256, 16, s, "32x1", seed=3)
    dense, _ = simulate_dynamic_matmul(a, b, "dense", arch)
    for g in speedups:
        res, _ = simulate_dynamic_matmul(a, b, g, arch)
        speedups[g].append(dense.cycles / res.cycles)
for g, sp in speedups.items():
    plt.plot(sparsities, sp, marker="o", label=f"{g} kernel")
plt.axhline(1, color="gray", linestyle="--", linewidth=0.8)
plt.xlabel("sparsity (32x1 micro-tiles of zeros)"); plt.ylabel("speedup over dense"); plt.legend()
plt.title("128x256 @ 256x16, simulated");"""),
    ("md", """## ReLU activation sparsity in an FFN

`Y = ReLU(X W1 + b) W2`: the hidden activations are known only after the first layer runs.
With 90% of the neurons inactive (as in OPT's FFNs, which PIT exploits), whole columns of the
activations are zero, so 32×1 micro-tiles (32 tokens × 1 neuron) along the second layer's
reduction axis skip them. The whole FFN — GEMM, bias + ReLU, index build, sparse second
layer — runs on the array."""),
    ("code", """ops = make_ffn_operands(tokens=64, dim=64, hidden=512, sparsity=0.9, seed=0)
for g in ("dense", "32x1", "32x64"):
    res, st = simulate_relu_ffn(*ops, g, arch)
    print(f"{g:6} {res.cycles:>9,} cycles, activation sparsity {st.sparsity:.3f}, "
          f"second layer wastes {100 * st.wasted_fraction:5.1f}% of its MACs, values "
          f"{'match' if res.values_match_reference else 'DO NOT MATCH'} numpy")"""),
    ("md", """## Mixture of experts: load imbalance in the timeline

Top-2 gating over 8 experts, token dispatch (a gather of rows), one GEMM kernel per expert,
and a weighted combine. With `placement="parallel"` each expert gets its own 1/8 of the array
(as experts get their own devices in expert-parallel serving), so the layer waits for the
busiest expert. A gate bias (`skew`) sends most tokens to the first experts."""),
    ("code", """fig, axes = plt.subplots(2, 1, figsize=(10, 7))
for ax, skew in zip(axes, (0.0, 2.0)):
    ops = make_moe_operands(experts=8, tokens=128, dim=32, hidden=32, skew=skew, seed=0)
    res, routing = simulate_moe(*ops, 2, arch, placement="parallel")
    draw_timeline(res, ax=ax, title=f"skew {skew}: tokens per expert {routing.tokens_per_expert.tolist()}"
                  f" -> {res.cycles:,} cycles")
    print(f"skew {skew}: {res.cycles:,} cycles, values "
          f"{'match' if res.values_match_reference else 'DO NOT MATCH'} numpy")
plt.tight_layout()"""),
    ("md", """With the same total work, the skewed router makes one region do most of it while the
others idle. Run one after another on the whole array instead (`placement="sequential"`), the
experts' kernels simply add up, and a skewed router is no longer penalised the same way:"""),
    ("code", """for skew in (0.0, 2.0):
    ops = make_moe_operands(experts=8, tokens=128, dim=32, hidden=32, skew=skew, seed=0)
    totals = {p: simulate_moe(*ops, 2, arch, placement=p)[0].cycles for p in ("parallel", "sequential")}
    print(f"skew {skew}: " + ", ".join(f"{p} {c:,} cycles" for p, c in totals.items()))"""),
]


def build() -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.cells = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


if __name__ == "__main__":
    path = Path(__file__).resolve().parent / "04_dynamic_sparsity.ipynb"
    nbformat.write(build(), path)
    print(f"wrote {path}")
