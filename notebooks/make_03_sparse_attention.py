"""Builds notebooks/03_sparse_attention.ipynb (committed without outputs; CI executes it).

    python notebooks/make_03_sparse_attention.py
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

cells = []


def md(text: str) -> None:
    cells.append(new_markdown_cell(text.strip()))


def code(text: str) -> None:
    cells.append(new_code_cell(text.strip()))


md("""
# Structured-sparse attention on the dataflow array

Attention is `softmax(Q K^T / sqrt(d)) V`. Long-sequence models keep only some (query, key)
pairs: a sliding window (Longformer), a dilated window, BigBird's global + window + random
blocks, a butterfly pattern (log2 N strides), or N:M structured sparsity. In `dataflow` each
pattern is a **mask tensor in a UST format** that says what the structure is, and attention is
lowered to a program of kernels that touch only the mask's stored entries:

```
SDDMM  S = mask . (Q K^T)                        (sddmm)
softmax over each row's stored entries           (softmax_max, softmax_exp)
SpMM   O = P V, P = E / rowsum divided in it     (spmm)
```

The CSR program has four kernels: the softmax's normalisation is folded into the SpMM, which
divides each entry's exponential by its row's sum as it loads it (the row's sum is held in a
PE register, read once per row), so no kernel writes the probabilities and reads them back.
Where it maps at no lower throughput (on `default.yaml`, the row-blocked scores kernel) the
compiler also folds the row maximum into the SDDMM, and the program runs three kernels:
`sddmm`, `softmax_exp`, `spmm` (docs/conventions.md#attention-fold).

This notebook draws every pattern, checks the simulated values against dense masked attention
in numpy, and shows where the cycles go, pattern by pattern, against dense attention.
""")
code("""
%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

import dataflow
from dataflow.attention import (PATTERNS, compute_bound_cycles, pattern_mask, phase_cycles,
                                sparse_attention)
from dataflow.testing import values_match

arch = dataflow.load_arch("../arch_configs/default.yaml")
print(arch.name, f"{arch.pe_array.rows}x{arch.pe_array.cols} PEs x {arch.pe_array.simd_lanes} lanes")
""")
md("""
## The patterns, and the UST format each one is stored in

Parameters: a window of half-width 4 (window, dilated: dilation 2), BigBird with 8-token
blocks (1 global block, a 3-block band, 1 random block per block row, seeded), butterfly with
strides 1, 2, 4, ..., seq/2, and 2:4 sparsity (2 keys kept of every 4, seeded).
The window patterns are diagonals, so they live in DIA; BigBird is made of blocks, so BSR;
N:M uses the `structured[n, m]` level.
""")
code("""
SEQ = 64
params = {"dense": {}, "window": {"window": 4}, "dilated": {"window": 4, "dilation": 2},
          "bigbird": {"block": 8}, "butterfly": {}, "nm": {"nm": "2:4"}}
masks = {name: pattern_mask(name, SEQ, **params[name]) for name in PATTERNS}

fig, axes = plt.subplots(1, len(PATTERNS), figsize=(3.1 * len(PATTERNS), 3.4))
for ax, (name, m) in zip(axes, masks.items()):
    dense = m.to_dense() != 0
    ax.imshow(dense, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    ax.set_title(f"{name}\\n{dense.sum()} of {SEQ * SEQ} ({100 * dense.mean():.0f}%)", fontsize=9)
    ax.set_xticks([]); ax.set_yticks([])
fig.suptitle("attention patterns (rows: queries, columns: keys)")
plt.show()

for name, m in masks.items():
    print(f"{name:9s} {str(m.tensor_format):80s} stored {m.nse:5d}")
""")
md("""
The stored count can exceed the pattern's entries: DIA stores a whole diagonal (zeros
where it runs off the matrix). The lowering converts any format to the CSR arrays the kernels
stream, dropping those filler zeros. Here is the window mask's storage on a small case:
""")
code("""
small = pattern_mask("window", 8, window=1)
small.draw(max_items=16)
""")
md("""
## Values: the simulator against dense masked attention in numpy

`sparse_attention(q, k, v, pattern=..., backend="sim")` lowers, maps and runs the cycle-level
engine; `backend="numpy"` is the reference (float64, masked scores at -inf). Sequence 128,
head dimension 32.
""")
code("""
SEQ, DIM = 128, 32
params["bigbird"] = {"block": 16}
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((SEQ, DIM), dtype=np.float32) for _ in range(3))

results = {}
print(f"{'pattern':10s} {'nnz':>6s} {'density':>8s} {'cycles':>9s} {'MAC bound':>9s} "
      f"{'max |err|':>10s}  match")
for name in PATTERNS:
    out, res = sparse_attention(q, k, v, pattern=name, backend="sim", arch=arch,
                                return_result=True, **params[name])
    ref = sparse_attention(q, k, v, pattern=name, backend="numpy", **params[name])
    nnz = int((pattern_mask(name, SEQ, **params[name]).to_dense() != 0).sum())
    results[name] = (res, nnz)
    bound = compute_bound_cycles(nnz, DIM, DIM, arch)
    assert values_match(out, ref) and res.cycles >= bound
    print(f"{name:10s} {nnz:6d} {nnz / SEQ**2:8.1%} {res.cycles:9,d} {bound:9,d} "
          f"{np.abs(out - ref).max():10.2e}  {values_match(out, ref)}")
""")
md("""
## Where the cycles go

Compute cycles by phase (SDDMM including its lane reduction, the two softmax kernels, SpMM
with the normalisation),
per pattern, next to dense attention. Every kernel iterates over stored entries only, so the
bars shrink with the pattern's nnz; the system total on top adds DRAM and reconfiguration
stalls.
""")
code("""
names = list(results)
phases = ["sddmm", "softmax", "spmm"]
by_phase = {ph: [phase_cycles(results[n][0])[ph] for n in names] for ph in phases}
fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4))
bottom = np.zeros(len(names))
for ph in phases:
    ax.bar(names, by_phase[ph], bottom=bottom, label=ph)
    bottom += by_phase[ph]
ax.plot(names, [results[n][0].cycles for n in names], "k_", markersize=30, label="total cycles")
ax.set_ylabel("cycles"); ax.set_title(f"attention, seq {SEQ}, d {DIM}: cycles by phase")
ax.legend()
dense_cycles = results["dense"][0].cycles
ratio = [dense_cycles / results[n][0].cycles for n in names]
dens = [results[n][1] / results["dense"][1] for n in names]
ax2.bar(names, ratio, color="tab:green")
for x, (r, d) in enumerate(zip(ratio, dens)):
    ax2.text(x, r, f"{r:.1f}x\\n(nnz {d:.0%})", ha="center", va="bottom", fontsize=8)
ax2.set_ylabel("speedup over dense (cycles)"); ax2.set_title("cycles of dense / cycles of pattern")
ax2.set_ylim(0, max(ratio) * 1.3)
plt.tight_layout(); plt.show()

for n in names:
    res, nnz = results[n]
    print(f"{n:10s} " + "  ".join(f"{k.kernel} {k.compute_cycles:6,d} (II {k.ii}, {k.copies} copies)"
                                   for k in res.kernels))
""")
md("""
Inside each kernel, the compute cycles split into cycles the modulo schedule needs (iterations
/ copies x II, plus fill) and cycles the whole array waits because one SPM line got more
accesses in a cycle than it has ports. Below, per kernel of dense and window attention, the two
parts next to the issue bound (every body node issues once per iteration, one op per PE per
cycle). Copies run contiguous chunks of iterations, so with power-of-two sizes many copies
touch the same line in the same cycle; that, not arithmetic, is where most cycles go here.
""")
code("""
from dataflow.attention.api import issue_bound_cycles

fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
for ax, name in zip(axes, ["dense", "window"]):
    res, nnz = results[name]
    kernels = [kr.kernel for kr in res.kernels]
    stall = [sum(t.stall_cycles_spm_conflict for t in kr.tiles) for kr in res.kernels]
    sched = [kr.compute_cycles - s for kr, s in zip(res.kernels, stall)]
    bound = issue_bound_cycles(nnz, DIM, DIM, arch)
    ax.bar(kernels, sched, label="schedule (II x waves + fill)")
    ax.bar(kernels, stall, bottom=sched, label="SPM port-conflict stalls")
    ax.plot(kernels, [bound[k] for k in kernels], "kv", label="issue bound")
    ax.set_title(f"{name}: compute cycles per kernel"); ax.set_ylabel("cycles")
    ax.tick_params(axis="x", labelrotation=20); ax.legend(fontsize=8)
plt.tight_layout(); plt.show()
""")
md("""
## The format chooses the program: DIA for banded patterns

A window or dilated mask is whole diagonals, which its DIA format stores row by row. With
`lowering="dia"` the kernels walk (row, diagonal) positions with affine addresses: no column
indices to load and no gathers, and K and V stream through the SPM in row windows. The
positions where a diagonal runs off the matrix are DIA's filler zeros; a -inf bias keeps them
out of the softmax. `lowering="auto"` picks DIA when the fillers are few. The DIA program
spends fewer array cycles (fewer nodes per iteration, contiguous SPM rows), while its DMA
traffic is a little higher (fillers, overlapping K/V windows), so at short sequences, where
every kernel's DMA dominates, the totals move less than the compute cycles.
""")
code("""
SEQ2 = 512  # longer, so the array work is not hidden behind each kernel's DMA
band = {"window": {"window": 4}, "dilated": {"window": 4, "dilation": 2}}
q2, k2, v2 = (rng.standard_normal((SEQ2, DIM), dtype=np.float32) for _ in range(3))
fig, ax = plt.subplots(figsize=(7, 3.4))
rows = []
for name in ["window", "dilated"]:
    for low in ["csr", "dia"]:
        out, res = sparse_attention(q2, k2, v2, pattern=name, backend="sim", arch=arch,
                                    lowering=low, return_result=True, **band[name])
        assert values_match(out, sparse_attention(q2, k2, v2, pattern=name, **band[name]))
        rows.append((f"{name}\\n{low}", res.compute_cycles, res.cycles))
        print(f"{name:8s} {low}: {res.cycles:7,d} cycles ({res.compute_cycles:7,d} compute, "
              f"{res.stall_cycles['dram_bandwidth']:6,d} DRAM stall, "
              f"{res.dram_bytes:8,d} DRAM bytes)")
labels, comp, total = zip(*rows)
ax.bar(labels, total, color="lightgray", label="total cycles")
ax.bar(labels, comp, color="tab:blue", label="compute cycles")
ax.set_ylabel("cycles"); ax.set_title(f"CSR vs DIA lowering, seq {SEQ2}, d {DIM}"); ax.legend()
plt.tight_layout(); plt.show()
""")
md("""
## The program

The kernels of one lowered program, as the mapper sees them (loop nest and body DFG).
`accmax` keeps the row maximum in a register and writes it back once per row; its buffer
starts at -inf, so rows whose scores are all negative still normalise correctly.
""")
code("""
from dataflow.attention.api import mask_csr
from dataflow.attention.lower import lower_attention

pos, crd, _ = mask_csr("window", 16, window=2)
prog = lower_attention(q[:16], k[:16], v[:16], pos, crd, lanes=arch.pe_array.simd_lanes)
for kern in prog.kernels:
    print(kern, end="\\n\\n")
""")
md("""
The same workload from the command line:

```
dataflow simulate --workload attention --pattern window --seq 128 --dim 32 --window 8
dataflow simulate --workload attention --pattern bigbird --seq 256 --block 16 --random-blocks 2
dataflow simulate --workload attention --pattern nm --nm 2:4
```
""")

if __name__ == "__main__":
    nb = new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    path = Path(__file__).resolve().parent / "03_sparse_attention.ipynb"
    nbformat.write(nb, path)
    print(f"wrote {path}")
