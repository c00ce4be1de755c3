"""Plan cache benchmark: cold planning (lower + map) vs a warm plan from memory vs from disk.

For each workload, measured side by side in this run:
- cold: `plan()` with an empty cache (the mapper runs);
- warm (memory): the same `plan()` again on that cache (key computation + dict lookup);
- warm (disk): `plan()` on a fresh cache object over the same directory, as a new process
  would see it (key computation + read + unpickle);
and one `execute("sim")` for scale. Times are the best of `--repeats` (cold: each on a new
empty directory). The table is printed and plotted to benchmarks/out/plan_cache.png.

    python benchmarks/bench_plan_cache.py [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dataflow.api import resolve_arch
from dataflow.ust_frontend.cache import PlanCache
from dataflow.ust_frontend.ops import Elementwise, Matmul, Sddmm

OUT = Path(__file__).resolve().parent / "out"


def machine() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, numpy {np.__version__}")


def workloads(quick: bool):
    rng = np.random.default_rng(0)
    g = 32 if quick else 64
    m, k, n = (128, 128, 16) if quick else (512, 512, 32)

    def csr(rows, cols, density, seed):
        return sp.random(rows, cols, density=density, format="csr", dtype=np.float32,
                         random_state=seed)

    yield (f"GEMM {g}x{g}x{g}", lambda: Matmul(rng.standard_normal((g, g), dtype=np.float32),
                                               rng.standard_normal((g, g), dtype=np.float32)))
    yield (f"SpMM CSR {m}x{k} (5%) x {n}",
           lambda: Matmul(csr(m, k, 0.05, 1), rng.standard_normal((k, n), dtype=np.float32)))
    yield (f"SpMV CSR {m}x{k} (5%)",
           lambda: Matmul(csr(m, k, 0.05, 1), rng.standard_normal(k, dtype=np.float32)))
    s = 16 if quick else 32
    yield (f"SDDMM {s}x{s}x{s} mask 20%",
           lambda: Sddmm(rng.standard_normal((s, s), dtype=np.float32),
                         rng.standard_normal((s, s), dtype=np.float32), csr(s, s, 0.2, 2)))
    q = 32 if quick else 64
    yield (f"SpGEMM {q}x{q} (10%) x (10%)",
           lambda: Matmul(csr(q, q, 0.1, 3), csr(q, q, 0.1, 4)))
    yield (f"add CSR + CSR {m}x{k} (5%)",
           lambda: Elementwise("add", csr(m, k, 0.05, 5), csr(m, k, 0.05, 6)))


def best(f, repeats: int) -> float:
    t = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        t = min(t, time.perf_counter() - t0)
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (CI smoke run)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    arch = resolve_arch(None)
    print(f"machine: {machine()}")
    print(f"arch: {arch.name}")
    head = (f"{'workload':30} {'cold ms':>9} {'mem ms':>8} {'disk ms':>8} {'cold/mem':>9} "
            f"{'cold/disk':>9} {'exec ms':>8}")
    print(head)
    print("-" * len(head))
    warm = Matmul(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32))
    warm.plan(arch=arch, cache=False)
    warm.execute("sim")  # first-call costs (imports, numba) stay out of the table
    rows = []
    for name, make in workloads(args.quick):
        op = make()
        with tempfile.TemporaryDirectory() as tmp:
            colds = []
            for r in range(args.repeats):
                cache = PlanCache(Path(tmp) / f"cold{r}")
                t0 = time.perf_counter()
                op.plan(arch=arch, cache=cache)
                colds.append(time.perf_counter() - t0)
                assert op.plan_source == "built"
            cold = min(colds)
            warm_cache = PlanCache(Path(tmp) / "cold0")
            op.plan(arch=arch, cache=warm_cache)  # disk -> memory
            mem = best(lambda op=op, c=warm_cache: op.plan(arch=arch, cache=c), args.repeats)
            assert op.plan_source == "memory"
            disk = best(lambda op=op, d=Path(tmp) / "cold0": op.plan(arch=arch, cache=PlanCache(d)),
                        args.repeats)
            assert op.plan_source == "disk"
            exe = best(lambda op=op: op.execute("sim"), 1)
        print(f"{name:30} {cold * 1e3:9.2f} {mem * 1e3:8.3f} {disk * 1e3:8.3f} "
              f"{cold / mem:8.0f}x {cold / disk:8.0f}x {exe * 1e3:8.2f}")
        rows.append((name, cold, mem, disk))
    print("cold = lower + map (+ write the cache file); mem/disk = key (hash of pos/crd + arch) "
          "+ lookup; exec = one sim run on the plan, for scale")
    print(f"plot: {plot(rows)}")
    return 0


def plot(rows) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    OUT.mkdir(exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    x = np.arange(len(rows))
    for i, (label, col) in enumerate((("cold (lower + map)", 1), ("warm, memory", 2),
                                      ("warm, disk", 3))):
        ax.bar(x + (i - 1) * 0.27, [r[col] * 1e3 for r in rows], 0.27, label=label)
    ax.set_yscale("log")
    ax.set_ylabel("plan() time, ms (log)")
    ax.set_xticks(x, [r[0] for r in rows], rotation=20, ha="right", fontsize=7)
    ax.set_ylim(top=max(r[1] for r in rows) * 1e3 * 20)  # room for the legend
    ax.legend(fontsize=8, ncol=3, loc="upper center")
    ax.set_title("plan cache: a second identical call skips planning")
    fig.tight_layout()
    path = OUT / "plan_cache.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
