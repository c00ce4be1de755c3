"""PIT's micro-benchmark in miniature, and structured sparse attention against dense.

Part 1 -- dynamic sparsity (docs/references.md#pit: 4096^3 fp32 at sparsity 0.5 / 0.9 / 0.95 /
0.99 with 32x1, 1x64 and 32x64 granularity): C = A @ B with M = K = N = --size (default 1024),
A's zeros laid out element-wise or in 32x1 / 1x64 micro-tiles, each matrix run through the
three kernels (PIT micro-tiles 32x1 and 1x64, block-sparse 32x64) and dense GEMM (the fastest
of three dense mappings, see `dense_variants`), all in this run. Reported per point: simulated
cycles, MACs wasted on zeros (from the engine's operation counts on the real data), DRAM bytes
read, and speedup over dense. With --compare (default "matched") the 1x64 kernel and each
kernel on zeros at its own granularity also run in the old model (1x64 as packed rows with an
overwriting SWrite; gathered operands DMA'd whole) in the same run, so the effect of
SCATTER_ACC (PIT's scatter-add per k-block) and of the gather DMA (only the selected tiles
leave DRAM) is a ratio measured side by side.

How N = 1024 is simulated: the B operand does not fit the SPM whole, so the program runs B in
column blocks of --col-block (64) columns one after another. The run-time index is built once
(index_scan + index_compact); every column block then runs the same compute kernels over the
same index and addresses -- only B's values differ, and values never move an address or a
cycle (tests/test_dynamic.py::test_column_blocks_have_identical_timing). So the table's cycles
are  index cycles + (N / col_block) x (one simulated column block's compute cycles), and MACs
scale the same way; each block's values are checked against numpy (the first block's are).

Part 2 -- sparse attention (dataflow.simulate("attention", ...)) at seq 1024, 2048, 4096,
d = 64: cycles of every pattern against dense. The sparse patterns are simulated whole. Dense
and N:M (the same number of keys in every row) above --exact-nnz mask entries run as seq / r
blocks of r query rows against all keys, one block after another (FlashAttention-style query
blocking): the first block is simulated exactly and, the blocks being alike, counted seq / r
times. That schedule is checked against a whole simulation at the smallest sequence in this run
(difference printed; about 1-3% at seq 256 and 512).

    python benchmarks/bench_dynamic_sparsity.py [--quick] [--skip-attention]

Tables (Markdown and CSV) and plots go to benchmarks/out/.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from benchcommon import machine

from dataflow.arch import resolve_arch
from dataflow.dynamic import make_dynamic_operands, simulate_dynamic_matmul

KERNELS = ("32x1", "1x64", "32x64")



def log(msg: str) -> None:
    print(msg, flush=True)


# --- part 1 -------------------------------------------------------------------------------------

def dram_read(res, index: bool) -> int:
    """DRAM bytes read by the index kernels (`index`) or by the rest, from the tiles' DMA."""
    return sum(t.dram_bytes_read for kr in res.kernels for t in kr.tiles
               if kr.kernel.startswith("index_") == index)


def scaled(res, stats, blocks: int) -> dict:
    """Whole-N figures from one column block: the index once, the compute `blocks` times."""
    return {"cycles": stats.index_cycles + blocks * stats.compute_cycles,
            "dram_read_bytes": dram_read(res, True) + blocks * dram_read(res, False),
            "index_cycles": stats.index_cycles,
            "computed_macs": blocks * stats.computed_macs,
            "useful_macs": blocks * stats.useful_macs,
            "wasted_macs": blocks * stats.wasted_macs, "tile_density": stats.tile_density,
            "values_ok": bool(res.values_match_reference)}


def dense_variants(a, b, arch):
    """(name, cycles of one column block, values ok) of dense GEMM mappings: A unpadded with the
    mapper's choice of copies (`dataflow.simulate("gemm")`'s program), A padded as the sparse
    kernels store it, and padded with 8 copies. The baseline is the fastest, so no speedup
    comes from a poorly mapped dense kernel."""
    from dataflow.dfg.lower import lower_gemm
    from dataflow.dynamic.lower import lower_dense_reference
    from dataflow.mapper.legality import check_mapping
    from dataflow.mapper.map import map_kernel
    from dataflow.mapper.mapping import Mapping
    from dataflow.pe_array.simulate import simulate_mapping
    from dataflow.workloads import finish

    ref = (a.astype(np.float64) @ b).astype(np.float32)
    for name, prog, copies in (("A unpadded", lower_gemm(a, b), None),
                               ("A padded", lower_dense_reference(a, b), None),
                               ("A padded, 8 copies", lower_dense_reference(a, b), 8)):
        t0 = time.perf_counter()
        mapping = Mapping(program=prog, arch=arch,
                          kernels=tuple(map_kernel(k, arch, copies=copies) for k in prog.kernels))
        check_mapping(mapping)
        res = finish(simulate_mapping(mapping), ref, t0, mapping)
        yield name, res.cycles, bool(res.values_match_reference)


def old_model(pattern: str, kernel: str, compare: str) -> bool:
    """Whether a point is also run in the model before SCATTER_ACC and gather DMA."""
    return compare == "all" or (compare == "matched" and (pattern == kernel or kernel == "1x64"))


def run_dynamic(size: int, col_block: int, sparsities, patterns, arch, seed: int = 0,
                compare: str = "matched"):
    if size % col_block or size % 64:
        raise SystemExit(f"--size must be a multiple of 64 and of --col-block ({col_block})")
    blocks = size // col_block
    rows = []
    t0 = time.perf_counter()
    a, b = make_dynamic_operands(size, size, col_block, 0.0, "element", seed)
    dense = None
    for name, cycles, ok in dense_variants(a, b, arch):
        log(f"  dense GEMM {size}^3, {name}: {blocks * cycles:,} cycles")
        if dense is None or blocks * cycles < dense["cycles"]:
            dense = {"cycles": blocks * cycles, "variant": name, "values_ok": ok}
    log(f"  dense baseline: the fastest, {dense['variant']} ({time.perf_counter() - t0:.1f} s)")
    for pattern in patterns:
        for s in sparsities:
            a, b = make_dynamic_operands(size, size, col_block, s, pattern, seed)
            for g in KERNELS:
                t1 = time.perf_counter()
                res, st = simulate_dynamic_matmul(a, b, g, arch)
                row = {"pattern": pattern, "sparsity": s, "kernel": g, **scaled(res, st, blocks)}
                row["dense_cycles"] = dense["cycles"]
                row["speedup"] = dense["cycles"] / row["cycles"]
                row["wasted_fraction"] = row["wasted_macs"] / max(1, row["computed_macs"])
                row["old_speedup"] = row["old_dram_read_bytes"] = None
                if old_model(pattern, g, compare):
                    # the same point in the model before this change: 1x64 as packed rows + an
                    # overwriting SWrite, and every gathered operand DMA'd whole
                    ores, ost = simulate_dynamic_matmul(a, b, g, arch, scheme="packed",
                                                        fetch="whole")
                    old = scaled(ores, ost, blocks)
                    row["old_speedup"] = dense["cycles"] / old["cycles"]
                    row["old_dram_read_bytes"] = old["dram_read_bytes"]
                    row["values_ok"] = row["values_ok"] and old["values_ok"]
                rows.append(row)
                was = f" (old model {row['old_speedup']:.2f}x)" if row["old_speedup"] else ""
                log(f"  zeros {pattern:7} s={s:<5} kernel {g:5}: {row['cycles']:>12,} cycles, "
                    f"speedup {row['speedup']:6.2f}x{was}, "
                    f"wasted {100 * row['wasted_fraction']:5.1f}%, "
                    f"DRAM read {row['dram_read_bytes'] / 1e6:.1f} MB "
                    f"({time.perf_counter() - t1:.1f} s)")
    return dense, rows


def table_dynamic(rows, size, col_block) -> str:
    out = [(f"Dynamic sparse matmul, M = K = N = {size} (column blocks of {col_block}), "
            "cycles at the array clock"),
           "",
           ("| zeros laid out | sparsity | kernel | tiles nonzero | cycles | index build | "
            "MACs computed | wasted on zeros | DRAM read MB (old) | speedup vs dense | "
            "old model | values |"),
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        old = f"{r['old_speedup']:.2f}x" if r["old_speedup"] else "-"
        odram = f" ({r['old_dram_read_bytes'] / 1e6:.1f})" if r["old_dram_read_bytes"] else ""
        out.append(f"| {r['pattern']} | {r['sparsity']} | {r['kernel']} | "
                   f"{100 * r['tile_density']:.1f}% | {r['cycles']:,} | {r['index_cycles']:,} | "
                   f"{r['computed_macs']:,} | "
                   f"{r['wasted_macs']:,} ({100 * r['wasted_fraction']:.1f}%) | "
                   f"{r['dram_read_bytes'] / 1e6:.1f}{odram} | {r['speedup']:.2f}x | {old} | "
                   f"{'ok' if r['values_ok'] else 'WRONG'} |")
    out += ["", ("old model: the same point before SCATTER_ACC and gather DMA (1x64 as packed "
                 "rows + an overwriting SWrite; gathered operands DMA'd whole), run side by side")]
    return "\n".join(out)


def plot_dynamic(rows, patterns, path: Path, size: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(patterns), figsize=(4.2 * len(patterns), 7), squeeze=False)
    for col, pattern in enumerate(patterns):
        for g, marker in zip(KERNELS, "osd"):
            pts = [r for r in rows if r["pattern"] == pattern and r["kernel"] == g]
            xs = [r["sparsity"] for r in pts]
            line, = axes[0, col].plot(xs, [r["speedup"] for r in pts], marker=marker, label=g)
            old = [(r["sparsity"], r["old_speedup"]) for r in pts if r["old_speedup"]]
            if old:
                axes[0, col].plot(*zip(*old), marker=marker, linestyle=":", color=line.get_color(),
                                  alpha=0.6, label=f"{g} (old model)")
            axes[1, col].plot(xs, [100 * r["wasted_fraction"] for r in pts], marker=marker, label=g)
        axes[0, col].axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
        axes[0, col].set_yscale("log")
        axes[0, col].set_title(f"zeros: {pattern}")
        axes[0, col].set_ylabel("speedup over dense")
        axes[1, col].set_ylabel("MACs wasted on zeros (%)")
        axes[1, col].set_xlabel("sparsity")
        axes[0, col].legend(title="kernel")
    fig.suptitle(f"PIT micro-benchmark in miniature: {size}^3 on the default array (simulated)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- part 2 -------------------------------------------------------------------------------------

def attention_mask(pattern: str, seq: int, seed: int = 0):
    from dataflow.attention.api import mask_csr
    from dataflow.attention.patterns import resolve

    p = resolve(pattern, seq, seed=seed) if pattern in ("bigbird", "nm") else resolve(pattern, seq)
    pos, crd, _ = mask_csr(p, seq)
    return pos, crd


def attention_rows(pattern: str, seq: int, dim: int, rows: int, arch, seed: int = 0) -> int:
    """Exact cycles of the first `rows` query rows of `pattern` against all `seq` keys (same
    operands as the workload: q, k, v drawn in that order from the seed)."""
    from dataflow.attention.api import _simulate

    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((seq, dim), dtype=np.float32) for _ in range(3))
    pos, crd = attention_mask(pattern, seq, seed)
    res = _simulate(q[:rows], k, v, pos[:rows + 1], crd[:pos[rows]], arch, "fast",
                    workload=f"attention/{pattern}/rows", cache=False)
    if not res.values_match_reference:
        raise RuntimeError(f"attention {pattern} seq {seq} rows {rows}: values do not match")
    return res.cycles


def row_blocked(pattern: str, seq: int, dim: int, r: int, arch) -> int:
    """Cycles of `pattern` run as seq / r blocks of r query rows (see the module docstring)."""
    if seq % r:
        raise SystemExit(f"--rows ({r}) must divide every sequence length ({seq})")
    return attention_rows(pattern, seq, dim, r, arch) * (seq // r)


def run_attention(seqs, dim: int, exact_nnz: int, rows: int, arch):
    import dataflow
    from dataflow.attention.patterns import PATTERNS

    out = []
    checks = []
    for seq in seqs:
        for pattern in PATTERNS:
            t1 = time.perf_counter()
            nnz = len(attention_mask(pattern, seq)[1])
            row_uniform = pattern in ("dense", "nm")
            if nnz <= exact_nnz or not row_uniform:
                res = dataflow.simulate("attention", arch=arch, pattern=pattern, seq=seq, dim=dim)
                cycles, method, ok = res.cycles, "simulated", bool(res.values_match_reference)
            else:
                cycles, method, ok = row_blocked(pattern, seq, dim, rows, arch), \
                    f"{seq // rows} row blocks of {rows}", True
            out.append({"seq": seq, "pattern": pattern, "nnz": nnz, "density": nnz / seq ** 2,
                        "cycles": cycles, "method": method, "values_ok": ok})
            log(f"  attention seq {seq} {pattern:9}: {cycles:>14,} cycles ({method}, "
                f"{time.perf_counter() - t1:.1f} s)")
    # check the row-blocked schedule against whole simulations at the smallest sequence
    seq = min(seqs)
    for pattern in ("nm", "dense"):
        exact = next((r for r in out if r["seq"] == seq and r["pattern"] == pattern
                      and r["method"] == "simulated"), None)
        t1 = time.perf_counter()
        if exact is None:
            res = dataflow.simulate("attention", arch=arch, pattern=pattern, seq=seq, dim=dim)
            exact_cycles = res.cycles
        else:
            exact_cycles = exact["cycles"]
        est = row_blocked(pattern, seq, dim, rows, arch)
        checks.append((pattern, seq, exact_cycles, est, est / exact_cycles - 1, rows))
        log(f"  check {pattern} seq {seq}: whole {exact_cycles:,}, in row blocks {est:,} "
            f"({100 * (est / exact_cycles - 1):+.2f}%) ({time.perf_counter() - t1:.1f} s)")
    for r in out:
        dense = next(d for d in out if d["seq"] == r["seq"] and d["pattern"] == "dense")
        r["speedup"] = dense["cycles"] / r["cycles"]
    return out, checks


def table_attention(rows, checks, dim) -> str:
    out = [f"Sparse attention, d = {dim}, cycles at the array clock", "",
           "| seq | pattern | mask entries | density | cycles | speedup vs dense | how |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['seq']} | {r['pattern']} | {r['nnz']:,} | {100 * r['density']:.2f}% | "
                   f"{r['cycles']:,} | {r['speedup']:.2f}x | {r['method']}"
                   f"{'' if r['values_ok'] else ' VALUES WRONG'} |")
    out += ["", "Row-blocked schedule vs whole simulation:", ""]
    out += [f"- {p} seq {s}: whole {e:,}, {s // r_} row blocks {x:,} ({100 * err:+.2f}%)"
            for p, s, e, x, err, r_ in checks]
    return "\n".join(out)


def plot_attention(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for pattern in dict.fromkeys(r["pattern"] for r in rows):
        pts = [r for r in rows if r["pattern"] == pattern]
        ax.plot([r["seq"] for r in pts], [r["cycles"] for r in pts], marker="o", label=pattern)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length")
    ax.set_ylabel("simulated cycles")
    ax.set_title("Sparse attention vs dense (default array, simulated)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_csv(rows, path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="256^3 and seq 256, 512 (a smoke run)")
    ap.add_argument("--size", type=int, default=1024, help="M = K = N (default 1024)")
    ap.add_argument("--col-block", type=int, default=64)
    ap.add_argument("--sparsities", type=float, nargs="+", default=[0.5, 0.9, 0.95, 0.99])
    ap.add_argument("--patterns", nargs="+", default=["element", "32x1", "1x64"],
                    help="how A's zeros are laid out (element, 32x1, 1x64, 32x64)")
    ap.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--exact-nnz", type=int, default=600_000,
                    help="simulate attention whole up to this many mask entries")
    ap.add_argument("--rows", type=int, default=256,
                    help="query rows per block of row-blocked dense / N:M")
    ap.add_argument("--compare", choices=("matched", "all", "none"), default="matched",
                    help="also run points in the old model (packed 1x64, whole-panel DMA): the "
                         "1x64 kernel and each kernel on zeros at its own granularity (matched)")
    ap.add_argument("--skip-attention", action="store_true")
    ap.add_argument("--skip-dynamic", action="store_true")
    ap.add_argument("--arch", default=None)
    ap.add_argument("--out", default=str(HERE / "out"))
    args = ap.parse_args(argv)
    if args.quick:
        args.size, args.seqs, args.exact_nnz, args.rows = 256, [256, 512], 100_000, 64
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arch = resolve_arch(args.arch)
    log(f"machine: {machine()}; arch {arch.name}")
    t0 = time.perf_counter()
    if not args.skip_dynamic:
        log(f"part 1: dynamic sparse matmul {args.size}^3")
        _, rows = run_dynamic(args.size, args.col_block, args.sparsities, args.patterns, arch,
                              compare=args.compare)
        text = table_dynamic(rows, args.size, args.col_block)
        print("\n" + text + "\n")
        (out / "dynamic_sparsity.md").write_text(text + "\n")
        write_csv(rows, out / "dynamic_sparsity.csv")
        plot_dynamic(rows, args.patterns, out / "dynamic_sparsity.png", args.size)
        log(f"  wrote {out / 'dynamic_sparsity.md'}, .csv, .png")
    if not args.skip_attention:
        log(f"part 2: sparse attention, seq {args.seqs}, d = {args.dim}")
        rows, checks = run_attention(args.seqs, args.dim, args.exact_nnz, args.rows, arch)
        text = table_attention(rows, checks, args.dim)
        print("\n" + text + "\n")
        (out / "attention_patterns.md").write_text(text + "\n")
        write_csv(rows, out / "attention_patterns.csv")
        plot_attention(rows, out / "attention_patterns.png")
        log(f"  wrote {out / 'attention_patterns.md'}, .csv, .png")
    log(f"total wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
