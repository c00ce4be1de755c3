"""dataflow: simulate workloads on a dataflow accelerator model (`simulate`), draw a saved
result (`report`), check numpy / sim / cuda against each other (`crosscheck`), compare with a
GPU (`compare`), and explore design spaces (`sweep`, `pareto`)."""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import sys
import traceback

from dataflow.api import simulate
from dataflow.arch import preset_names
from dataflow.attention.patterns import PATTERNS
from dataflow.errors import USER_ERRORS, UserError
from dataflow.models import ModelResult
from dataflow.models import simulate as simulate_model
from dataflow.models.topology import read_topology
from dataflow.report import save_result, write_trace
from dataflow.workloads import all_params, workloads

BUG_REPORT = ("dataflow: internal error: this is a bug in dataflow, not in your input. Please "
              "report it with the traceback above and the command line: {command}")

#: Modules adding subcommands: each has `add_parser(subparsers)` that calls
#: `parser.set_defaults(func=handler)`; `handler(args) -> int` is the exit code.
COMMAND_MODULES: tuple[str, ...] = (
    "dataflow.dse.cli",
    "dataflow.cuda.cli",
    "dataflow.report.cli",
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dataflow", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("simulate", help="simulate one workload on an architecture")
    s.add_argument("--arch", default="default", help="architecture: a preset "
                   f"({', '.join(preset_names())}) or a YAML path (default: %(default)s)")
    reg = workloads()
    s.add_argument("--workload", choices=sorted(reg), default="spmm",
                   help="; ".join(f"{w.name}: {w.help}" for w in reg.values()))
    for prm in all_params().values():
        users = [w.name for w in reg.values() if any(q.name == prm.name for q in w.params)]
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
    s.add_argument("--save", metavar="FILE", help="write the result file `dataflow report` draws")
    s.add_argument("--trace", metavar="FILE",
                   help="write the per-cycle trace (cycle, PE, op) as .csv or .jsonl "
                        "(needs --engine reference)")
    s.set_defaults(func=_simulate_command)
    for mod in COMMAND_MODULES:
        importlib.import_module(mod).add_parser(sub)
    return p


def _summary(r) -> str:
    st = r.stall_cycles
    lines = [
        f"dataflow simulate: {r.workload} on {r.arch} ({r.engine} engine)",
        f"  mapping          {r.mapping_summary}",
        f"  cycles           {r.cycles:,}  ({r.time_seconds * 1e6:,.3f} us at {r.clock_ghz:g} GHz)",
        f"  compute cycles   {r.compute_cycles:,}",
        "  stall cycles     " + ", ".join(f"{k} {v:,}" for k, v in st.items()),
        (f"  PE utilisation   {100 * r.pe_utilization:.1f}% busy, "
         f"{100 * r.mac_utilization:.1f}% of peak MACs ({r.macs:,} MACs)"),
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
         f"reference (max abs error {r.max_abs_error:.3g})"),
        f"  wall time        {r.wall_seconds:.3f} s",
    ]
    if len(r.kernels) > 1:
        lines.append("  per kernel       " + ", ".join(
            f"{k.kernel} {k.compute_cycles:,}" for k in r.kernels) + " compute cycles")
    lines += [f"  note             {n}" for n in r.notes]
    return "\n".join(lines)


def add_model_size_flags(parser) -> None:
    """`--size NAME=N` and `--attention-pattern` of a command that takes a model file."""
    parser.add_argument("--size", metavar="NAME=N", action="append", default=[],
                        help="a model file's size by name, e.g. --size heads=2 (repeatable)")
    parser.add_argument("--attention-pattern", dest="attention_pattern", choices=PATTERNS,
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


def _model_source(args):
    """What `dataflow.models.simulate` takes, from the flags: a model file or a SCALE-Sim
    topology file (read into a `Model`)."""
    if args.model and args.topology:
        raise UserError("give --model or --topology, not both")
    if args.topology:
        return read_topology(args.topology)
    if args.model:
        return args.model
    raise UserError("no model given: use --model FILE or --topology FILE.csv")


def _model_table(r: ModelResult) -> list[str]:
    head = (f"  {'layer':<22} {'kind':<11} {'cycles':>11} {'compute':>10} {'stalls':>10} "
            f"{'MACs':>12} {'DRAM B':>11} {'roofline':>8} {'values':>6} {'act':>6}")
    rows = [head]
    for lr in r.layers:
        d = lr.row()
        frac = d["fraction_of_roofline"]
        match = {True: "ok", False: "DIFF", None: "-"}[d["values_match_reference"]]
        rows.append(f"  {d['name'][:22]:<22} {d['kind']:<11} {d['cycles']:>11,} "
                    f"{d['compute_cycles']:>10,} {sum(d['stall_cycles'].values()):>10,} "
                    f"{d['macs']:>12,} {d['dram_bytes']:>11,} "
                    f"{'-' if frac is None else f'{frac:.3f}':>8} {match:>6} {d['activation']:>6}")
    return rows


def _model_summary(r: ModelResult) -> str:
    err = f" (max abs error {r.max_abs_error:.3g})" if r.max_abs_error is not None else ""
    frac = r.fraction_of_roofline
    lines = [f"dataflow simulate: model {r.model.name} ({len(r.layers)} layers) on {r.arch}",
             f"  cycles           {r.cycles:,}", f"  compute cycles   {r.compute_cycles:,}",
             "  stall cycles     " + ", ".join(f"{k} {v:,}" for k, v in r.stall_cycles.items()),
             f"  MACs             {r.macs:,}", f"  DRAM             {r.dram_bytes:,} B",
             f"  energy           {r.energy_total_pj / 1e6:,.3f} uJ",
             *([f"  roofline         achieved {frac:.3f} of it"] if frac is not None else []),
             f"  values           {'match' if r.values_match_reference else 'DO NOT MATCH'} "
             f"the reference{err}", "  per layer", *_model_table(r)]
    lines += [f"  note             {n}" for n in r.notes]
    return "\n".join(lines)


def _simulate_model_command(args, params: dict) -> int:
    if args.trace:
        raise UserError("--trace applies to one workload, not to --model or --topology")
    if args.topology and (args.size or any(v is not None for k, v in params.items()
                                           if k != "dataflow")):
        raise UserError("--topology takes no size flags: its rows give every size")
    r = simulate_model(_model_source(args), arch=args.arch, engine=args.engine,
                       dataflow=params.get("dataflow"), seed=args.seed,
                       attention_pattern=args.attention_pattern, **model_sizes(args, params))
    if args.csv:
        with open(args.csv, "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows(r.csv_rows())
    if args.save:
        save_result(r, args.save)
    print(json.dumps(r.to_dict()) if args.json else _model_summary(r))
    return 0 if r.values_match_reference else 1


def _simulate_command(args) -> int:
    params = {name: getattr(args, name) for name in all_params()
              if getattr(args, name, None) is not None}
    if args.model or args.topology:
        return _simulate_model_command(args, params)
    if args.csv or args.attention_pattern or args.size:
        raise UserError("--csv, --attention-pattern and --size apply to --model or --topology")
    if args.trace and args.engine != "reference":
        raise UserError("--trace needs --engine reference (the fast engine keeps no "
                        "per-cycle trace)")
    if args.trace and not args.trace.endswith((".csv", ".jsonl")):
        raise UserError(f"--trace {args.trace}: trace files end in .csv or .jsonl")
    r = simulate(args.workload, arch=args.arch, seed=args.seed, engine=args.engine,
                 trace=bool(args.trace), **params)
    if args.save:
        save_result(r, args.save)
    if args.trace:
        write_trace(r.trace, args.trace)
    if args.json:
        print(json.dumps(r.to_dict()))
    else:
        print(_summary(r))
    return 0 if r.values_match_reference else 1


def main(argv: list[str] | None = None) -> int:
    """Run one command. Exit codes: 0 done, 1 values differ from the reference, 2 bad input
    (one line on stderr), 3 an internal error (its traceback and a request to report it)."""
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        print(f"dataflow: error: {exc}", file=sys.stderr)
        return 2
    except Exception:
        # not bad input: a bug in dataflow, so keep the traceback instead of one polite line
        traceback.print_exc()
        print(BUG_REPORT.format(command=" ".join(["dataflow", *(argv if argv is not None else
                                                              sys.argv[1:])])), file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
