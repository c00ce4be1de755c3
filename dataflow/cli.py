"""dataflow: simulate workloads on a dataflow accelerator model (`simulate`), draw a saved
result (`report`), check numpy / sim / cuda against each other (`crosscheck`), compare with a
GPU (`compare`), and explore design spaces (`sweep`, `pareto`)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback

from dataflow.api import simulate
from dataflow.arch import preset_names
from dataflow.errors import USER_ERRORS, UserError
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
        (f"  PE utilisation   {100 * r.pe_utilization:.1f}% busy, {100 * r.mac_utilization:.1f}% of peak MACs"
         f" ({r.macs:,} MACs)"),
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


def _simulate_command(args) -> int:
    params = {name: getattr(args, name) for name in all_params()
              if getattr(args, name, None) is not None}
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
