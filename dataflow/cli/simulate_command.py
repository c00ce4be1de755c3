"""`dataflow simulate`: one workload (here), or a whole model file or topology file
(`dataflow.cli.model_command`, imported only for `--model` / `--topology`)."""

from __future__ import annotations

import json
import time

from dataflow.arch import preset_names, resolve_arch
from dataflow.cli import COMMANDS, deferred
from dataflow.errors import USER_ERRORS, UserError
from dataflow.pe_array.systolic_timing import timing_only_result
from dataflow.workloads import (
    Workload,
    all_params,
    workload_help,
    workload_names,
    workload_params,
)

# `dataflow.api` (numpy, the engine) is imported when a run needs it: a timing-only GEMM on a
# systolic array is timed without it (`timing_only_fast`, docs/conventions.md#timing-only)
simulate = deferred("dataflow.api", "simulate")
# `--model` and `--topology` need the models package, `--save` and `--trace` the result files
simulate_model_command = deferred("dataflow.cli.model_command", "simulate_model_command")
save_result = deferred("dataflow.report", "save_result")
write_trace = deferred("dataflow.report", "write_trace")


def _macs_text(r) -> str:
    """The MACs the array issued, and the useful ones (the roofline's) where padding made them
    differ (a padded GEMM block, the nonzero unroll's explicit zeros)."""
    useful = round(r.roofline.compute_cycles * r.peak_macs_per_cycle) if r.roofline else r.macs
    if useful == r.macs:
        return f"{r.macs:,} MACs"
    return f"{r.macs:,} MACs issued, {useful:,} useful"


def add_parser(sub) -> None:
    s = sub.add_parser("simulate", help=COMMANDS["simulate"].help)
    s.add_argument("--arch", default="default", help="architecture: a preset "
                   f"({', '.join(preset_names())}) or a YAML path (default: %(default)s)")
    names = workload_names()
    s.add_argument("--workload", choices=sorted(names), default="spmm",
                   help="; ".join(f"{n}: {workload_help(n)}" for n in names))
    takes = {n: {q.name for q in workload_params(n)} for n in names}
    for prm in all_params().values():
        users = [n for n in names if prm.name in takes[n]]
        kw = {"choices": [c for c in prm.choices if c is not None]} if prm.choices else {}
        # default None: the workload fills its own default, and only flags given are passed
        s.add_argument(prm.flag, dest=prm.name, type=prm.type, default=None,
                       help=f"{prm.help} [{', '.join(users)}]", **kw)
    s.add_argument("--model", metavar="FILE", help="simulate a whole model file (models/*.yaml) "
                   "layer by layer; --seq and the other size flags fill its sizes")
    s.add_argument("--topology", metavar="FILE.csv", help="simulate every layer of a SCALE-Sim "
                   "topology file (conv or GEMM rows, read as they are)")
    add_model_size_flags(s)
    s.add_argument("--csv", metavar="FILE", help="write the per-layer table of --model as CSV")
    s.add_argument("--engine", choices=("fast", "reference"), default="fast")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--timing-only", action="store_true",
                   help="gemm on a systolic array: cycles, stalls, traffic and energy without "
                        "computing the values (their timing does not depend on them)")
    s.add_argument("--save", metavar="FILE", help="write the result file `dataflow report` draws")
    s.add_argument("--trace", metavar="FILE",
                   help="write the per-cycle trace (cycle, PE, op) as .csv or .jsonl "
                        "(needs --engine reference)")
    s.set_defaults(func=simulate_command)


def add_model_size_flags(parser) -> None:
    """`--size NAME=N` and `--attention-pattern` of a command that takes a model file."""
    parser.add_argument("--size", metavar="NAME=N", action="append", default=[],
                        help="a model file's size by name, e.g. --size heads=2 (repeatable)")
    parser.add_argument("--attention-pattern", dest="attention_pattern",
                        choices=all_params()["pattern"].choices,
                        help="the pattern of every attention layer of --model")


def model_sizes(args, params: dict) -> dict[str, int]:
    """--size NAME=N and the size flags given (a flag the file lacks is the loader's error)."""
    sizes = {k: v for k, v in params.items() if k != "dataflow"}
    for item in args.size:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise UserError(f"--size {item}: expected NAME=INTEGER")
        sizes[name.strip()] = int(value)
    return sizes


def summary(r) -> str:
    st = r.stall_cycles
    lines = [
        f"dataflow simulate: {r.workload} on {r.arch} ({r.engine} engine)",
        f"  mapping          {r.mapping_summary}",
        f"  cycles           {r.cycles:,}  ({r.time_seconds * 1e6:,.3f} us at {r.clock_ghz:g} GHz)",
        f"  compute cycles   {r.compute_cycles:,}",
        "  stall cycles     " + ", ".join(f"{k} {v:,}" for k, v in st.items()),
        (f"  PE utilisation   {100 * r.pe_utilization:.1f}% busy, "
         f"{100 * r.mac_utilization:.1f}% of peak MACs ({_macs_text(r)})"),
        *([f"  roofline         {r.roofline_cycles:,.0f} cycles ({r.bound} bound: compute "
           f"{r.roofline.compute_cycles:,.0f}, DRAM {r.roofline.dram_cycles:,.0f}, SPM ports "
           f"{r.roofline.spm_port_cycles:,.0f}); achieved {r.fraction_of_roofline:.3f} of it"]
          if r.roofline else []),
        (f"  SPM              {r.spm_reads:,} row reads, {r.spm_writes:,} row writes, "
         f"{r.spm_conflict_cycles:,} conflict cycles"),
        f"  DRAM             {r.dram_bytes_read:,} B read, {r.dram_bytes_written:,} B written",
        f"  energy           {r.energy_total_pj / 1e6:,.3f} uJ ("
        + ", ".join(f"{k} {v / 1e6:.3f}" for k, v in r.energy_pj) + ")",
        *([f"  area             {r.area_total_mm2:,.2f} mm2 ("
           + ", ".join(f"{k} {v:.2f}" for k, v in r.area_mm2) + ")"] if r.area_mm2 else []),
        (f"  values           {'match' if r.values_match_reference else 'DO NOT MATCH'} the numpy "
         f"reference (max abs error {r.max_abs_error:.3g})" if r.values_computed else
         "  values           not computed (--timing-only: the timing does not depend on them)"),
        f"  wall time        {r.wall_seconds:.3f} s",
    ]
    if len(r.kernels) > 1:
        lines.append("  per kernel       " + ", ".join(
            f"{k.kernel} {k.compute_cycles:,}" for k in r.kernels) + " compute cycles")
    lines += [f"  note             {n}" for n in r.notes]
    return "\n".join(lines)


def timing_only_fast(args, params: dict):
    """`--timing-only` of a dense GEMM on a systolic array in closed form, numpy not imported
    (`dataflow.pe_array.systolic_timing`): the `SimResult` `simulate` would return, or None
    where `simulate` must run -- another workload or array, `--save` or `--trace`, an SRAM that
    refetches or drains mid-run, or any input `simulate` refuses (it raises the error)."""
    if args.workload != "gemm" or args.save or args.trace or args.seed < 0:
        return None
    try:
        given = Workload("gemm", None, workload_params("gemm")).resolve(params)
        spec = resolve_arch(args.arch)
    except USER_ERRORS:
        return None
    return timing_only_result(spec, given["m"], given["n"], given["k"], given["dataflow"],
                              engine=args.engine, t0=time.perf_counter())


def simulate_command(args) -> int:
    params = {name: getattr(args, name) for name in all_params()
              if getattr(args, name, None) is not None}
    if args.model or args.topology:
        return simulate_model_command(args, params)
    if args.csv or args.attention_pattern or args.size:
        raise UserError("--csv, --attention-pattern and --size apply to --model or --topology")
    if args.trace and args.engine != "reference":
        raise UserError("--trace needs --engine reference (the fast engine keeps no "
                        "per-cycle trace)")
    if args.trace and not args.trace.endswith((".csv", ".jsonl")):
        raise UserError(f"--trace {args.trace}: trace files end in .csv or .jsonl")
    r = timing_only_fast(args, params) if args.timing_only else None
    if r is None:
        r = simulate(args.workload, arch=args.arch, seed=args.seed, engine=args.engine,
                     trace=bool(args.trace), timing_only=args.timing_only, **params)
    if args.save:
        save_result(r, args.save)
    if args.trace:
        write_trace(r.trace, args.trace)
    if args.json:
        print(json.dumps(r.to_dict()))
    else:
        print(summary(r))
    return 0 if r.values_match_reference or not r.values_computed else 1
