"""How close each workload comes to its roofline, per preset (issue 13 point 6).

For every workload x preset (arch_configs/default.yaml, arch_configs/mlx_4x4.yaml): simulated
cycles, the run's roofline bound (`SimResult.roofline_cycles`, the largest of the compute, DRAM
and SPM-port floors, docs/conventions.md#roofline-and-compulsory-bytes), which floor it is
(`bound`), `fraction_of_roofline` = bound / cycles, the issue's target and whether it is met,
and the wall seconds of the row (planning + simulation, cold: the run gets an empty plan and
SPM-layout cache folder unless --warm). Values are checked against numpy in every row.

Where a target is missed, "binds" names what the lost cycles went to, as a share of the run's
cycles: the largest of the stall categories (spm_conflict, dram_bandwidth, reconfiguration)
and "issue slots" -- unstalled cycles beyond the bound, in which the array issued fewer MACs
per cycle than the binding floor allows (for a compute-bound run: fewer than the peak, the
achieved MACs per unstalled cycle are shown).

The SDDMM has no `dataflow.simulate` workload of its own (attention runs one inside it); it
runs through the frontend op (`ust_frontend.sddmm_op.Sddmm`, the `sddmm` kernel of
`dfg.lower_sddmm`) on a random CSR mask. A workload the simulator refuses (a `UserError`, e.g.
an operand that does not fit the SPM) is a row that says "refused: <reason>".

    python benchmarks/bench_roofline.py [--quick] [--only SUBSTRING] [--presets default ...]
        [--warm]

Writes benchmarks/out/bench_roofline.json and .md (bench_roofline_quick.* with --quick).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from benchcommon import machine

import dataflow
from dataflow.arch import resolve_arch
from dataflow.cachefiles import ENV_VAR as CACHE_VAR
from dataflow.errors import UserError
from dataflow.testing import values_match
from dataflow.ust_frontend.sddmm_op import Sddmm

PRESETS = {"default": ROOT / "arch_configs" / "default.yaml",
           "mlx_4x4": ROOT / "arch_configs" / "mlx_4x4.yaml"}
STALLS = ("spm_conflict", "dram_bandwidth", "reconfiguration")
BELOW_BOUND = "BELOW THE BOUND: fewer cycles than the roofline allows (a bug)"
FOOTER = ("binds: where a target is missed, the largest share of the run's cycles lost to one "
          "cause -- a stall category, or issue slots (unstalled cycles beyond the bound; for a "
          "compute-bound run, MACs issued per unstalled cycle against the peak). refused: the "
          "simulator's one-line reason (a UserError). wall s: planning + simulation of the row "
          "(cold unless the header says warm), on a machine shared with other jobs.")


def run_sddmm(arch, *, m: int, n: int, k: int, density: float, seed: int = 0):
    """C = mask ⊙ (A @ B) on a random CSR mask through the frontend op; a `SimResult` with its
    value check filled in."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    mask = sp.random(m, n, density=density, format="csr", dtype=np.float32, random_state=rng)
    t0 = time.perf_counter()
    op = Sddmm(a, b, mask)
    op.plan(arch=arch, backend="sim", cache=False)
    got = op.execute("sim").entries()[1]
    want = op.execute("numpy").entries()[1]
    return dataclasses.replace(op.last_result, values_match_reference=values_match(got, want),
                               wall_seconds=time.perf_counter() - t0)


@dataclass(frozen=True)
class Case:
    """One workload at its benchmark sizes (`params`) and its smoke sizes (`quick`, merged over
    `params`; None: not run with --quick)."""

    name: str
    workload: str  # a `dataflow.simulate` name, or "sddmm" (`run_sddmm`)
    params: dict = field(default_factory=dict)
    quick: dict | None = field(default_factory=dict)
    target: float = 0.5
    target_mlx: float | None = None  # where the MLX preset's target differs

    def target_on(self, preset: str) -> float:
        return self.target_mlx if preset == "mlx_4x4" and self.target_mlx else self.target

    def sizes(self, quick: bool) -> dict:
        return {**self.params, **(self.quick or {})} if quick else dict(self.params)

    def label(self, quick: bool = False) -> str:
        """The name and the sizes it runs at, e.g. "GEMM (m 512, k 512, n 512)"."""
        sizes = ", ".join(f"{k} {v}" for k, v in self.sizes(quick).items() if k != "pattern")
        return f"{self.name} ({sizes or 'default sizes'})"

    def runner(self) -> Callable:
        if self.workload == "sddmm":
            return run_sddmm
        return lambda arch, **p: dataflow.simulate(self.workload, arch=arch, **p)


def _attention(pattern: str) -> Case:
    return Case(f"attention {pattern}", "attention", {"pattern": pattern, "seq": 1024, "dim": 64},
                {"seq": 128, "dim": 32}, 0.5)


# FNet plans slowly when cold (the butterfly SPM layout search runs the engine; over a minute at
# seq 64 on the default preset): one small row with --quick
CASES = (
    Case("GEMM", "gemm", {"m": 512, "k": 512, "n": 512}, {"m": 64, "k": 64, "n": 64}, 0.7),
    Case("GEMM", "gemm", {"m": 384, "k": 640, "n": 256}, {"m": 48, "k": 80, "n": 32}, 0.6),
    Case("CSR SpMM", "spmm", {"m": 4096, "k": 4096, "n": 64, "density": 0.01},
         {"m": 512, "k": 512, "n": 16, "density": 0.02}, 0.6),
    Case("SDDMM", "sddmm", {"m": 4096, "n": 4096, "k": 64, "density": 0.01},
         {"m": 256, "n": 256, "k": 32, "density": 0.05}, 0.5),
    _attention("window"),
    _attention("bigbird"),
    _attention("butterfly"),
    Case("dynamic-spmm", "dynamic-spmm",
         {"m": 1024, "k": 1024, "n": 1024, "sparsity": 0.95, "granularity": "32x1"},
         {"m": 128, "k": 128, "n": 64}, 0.5),
    Case("MoE", "moe", {}, {"tokens": 16}, 0.5),
    Case("FNet", "fnet-attention", {"seq": 256}, {"seq": 64, "dim": 32}, 0.85, 0.9),
    Case("FNet", "fnet-attention", {"seq": 1024}, None, 0.85, 0.9),
    Case("FNet", "fnet-attention", {"seq": 4096}, None, 0.85, 0.9),
)


def binds(res) -> str:
    """What the cycles beyond the bound went to, and how many (see the module docstring)."""
    stalls = res.stall_cycles
    lost = {name: stalls[name] for name in STALLS}
    unstalled = res.cycles - sum(stalls.values())
    lost["issue slots"] = max(0.0, unstalled - res.roofline_cycles)
    name = max(lost, key=lost.get)
    text = f"{name} {lost[name] / res.cycles:.0%} of cycles"
    if name == "issue slots" and str(res.bound) == "compute" and unstalled > 0:
        text += f" ({res.macs / unstalled:.0f} of {res.peak_macs_per_cycle} MACs/cycle)"
    return text


def run_case(case: Case, preset: str, arch, quick: bool = False) -> dict:
    """One row of the table: the case on `arch` (an ArchSpec, preset name or YAML path)."""
    sizes = case.sizes(quick)
    row = {"workload": case.label(quick), "name": case.workload, "params": sizes, "preset": preset,
           "target": case.target_on(preset), "cycles": None, "roofline_cycles": None,
           "bound": None, "fraction_of_roofline": None, "met": None, "binds": "",
           "values_ok": None, "refused": None}
    t0 = time.perf_counter()
    try:
        res = case.runner()(arch, **sizes)
    except UserError as err:
        # the reason's first line, with this checkout's paths relative (the table is quoted)
        row["refused"] = str(err).strip().splitlines()[0].replace(f"{ROOT}{os.sep}", "")
    else:
        fraction = res.fraction_of_roofline
        row.update(cycles=int(res.cycles), roofline_cycles=float(res.roofline_cycles),
                   bound=str(res.bound), fraction_of_roofline=float(fraction),
                   met=bool(fraction >= row["target"]), values_ok=res.values_match_reference,
                   stall_cycles=dict(res.stall_cycles), macs=int(res.macs))
        if fraction > 1 + 1e-9:  # a run can never beat its floors: the bound or the engine errs
            row["binds"] = BELOW_BOUND
        elif not row["met"]:
            row["binds"] = binds(res)
    row["wall_seconds"] = time.perf_counter() - t0
    return row


def row_text(row: dict) -> str:
    """The row as one progress line."""
    head = f"{row['preset']:8} {row['workload']:50}"
    if row["refused"]:
        return f"{head} refused: {row['refused']} ({row['wall_seconds']:.1f} s)"
    met = ("met" if row["met"] else "MISSED") + (f", {row['binds']}" if row["binds"] else "")
    values = "" if row["values_ok"] else ", VALUES WRONG"
    return (f"{head} {row['cycles']:>11,} cycles, bound {row['roofline_cycles']:>11,.0f} "
            f"({row['bound']}), fraction {row['fraction_of_roofline']:.3f} vs "
            f"{row['target']:.2f} {met}{values} ({row['wall_seconds']:.1f} s)")


def markdown(rows: list[dict], header: str) -> str:
    out = [header, "",
           "| workload | preset | cycles | roofline cycles | bound | fraction | target | met? | "
           "binds | values | wall s |",
           "|---|---|---:|---:|---|---:|---:|---|---|---|---:|"]
    for r in rows:
        wall = f"{r['wall_seconds']:.1f}"
        if r["refused"]:
            out.append(f"| {r['workload']} | {r['preset']} | refused: {r['refused']} | | | | "
                       f"{r['target']:.2f} | no | | | {wall} |")
            continue
        out.append(f"| {r['workload']} | {r['preset']} | {r['cycles']:,} | "
                   f"{r['roofline_cycles']:,.0f} | {r['bound']} | "
                   f"{r['fraction_of_roofline']:.3f} | {r['target']:.2f} | "
                   f"{'yes' if r['met'] else 'no'} | {r['binds']} | "
                   f"{'ok' if r['values_ok'] else 'WRONG'} | {wall} |")
    return "\n".join([*out, "", FOOTER]) + "\n"



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--only", default="", metavar="SUBSTRING",
                    help="only workloads whose label contains SUBSTRING (case-insensitive)")
    ap.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    ap.add_argument("--out", default=str(HERE / "out"), help="folder for the .json and .md")
    ap.add_argument("--warm", action="store_true",
                    help="use the plan and layout caches on disk ($DATAFLOW_CACHE_DIR); by "
                         "default the run gets an empty cache folder, so wall s are cold")
    args = ap.parse_args(argv)
    if args.warm:
        return run(args)
    before = os.environ.get(CACHE_VAR)
    with tempfile.TemporaryDirectory() as scratch:
        os.environ[CACHE_VAR] = scratch  # read at each look-up, not at import
        try:
            return run(args)
        finally:
            os.environ.pop(CACHE_VAR)
            if before is not None:
                os.environ[CACHE_VAR] = before


def run(args) -> int:
    cases = [c for c in CASES if args.only.lower() in c.label(args.quick).lower()
             and not (args.quick and c.quick is None)]
    if not cases:
        print(f"no workload label contains {args.only!r}", file=sys.stderr)
        return 1
    todo = [(c, p) for c in cases for p in args.presets]
    archs = {p: resolve_arch(PRESETS[p]) for p in args.presets}
    print(f"machine: {machine()}; {len(todo)} rows{' (quick sizes)' if args.quick else ''}",
          flush=True)
    rows, t0 = [], time.perf_counter()
    for i, (case, preset) in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {preset} {case.label(args.quick)} ...", flush=True)
        rows.append(run_case(case, preset, archs[preset], args.quick))
        print(f"[{i}/{len(todo)}] {row_text(rows[-1])}", flush=True)
    total = time.perf_counter() - t0
    sizes = "quick sizes" if args.quick else "issue 13 sizes"
    caches = "warm plan caches" if args.warm else "cold plan caches"
    header = (f"Roofline fraction per workload and preset ({sizes}; {caches}; {machine()}; "
              f"{total:.0f} s in all)")
    text = markdown(rows, header)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "bench_roofline_quick" if args.quick else "bench_roofline"
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps(
        {"machine": machine(), "quick": args.quick, "only": args.only,
         "warm": args.warm, "total_seconds": total, "rows": rows}, indent=1) + "\n")
    print("\n" + text)
    print(f"wrote {out / (stem + '.md')} and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
