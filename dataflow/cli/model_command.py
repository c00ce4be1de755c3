"""`dataflow simulate --model FILE` and `--topology FILE.csv`: a whole model, layer by layer
(its own module: `dataflow.models` is imported only when a model is simulated)."""

from __future__ import annotations

import csv
import json
import sys

from dataflow.cli.simulate_command import model_sizes
from dataflow.errors import UserError
from dataflow.models import ModelResult
from dataflow.models import simulate as simulate_model
from dataflow.models.topology import read_topology
from dataflow.report import save_result


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


def simulate_model_command(args, params: dict) -> int:
    """`dataflow simulate --model FILE` or `--topology FILE.csv`."""
    if args.trace:
        raise UserError("--trace applies to one workload, not to --model or --topology")
    if args.topology and (args.size or any(v is not None for k, v in params.items()
                                           if k != "dataflow")):
        raise UserError("--topology takes no size flags: its rows give every size")
    r = simulate_model(_model_source(args), arch=args.arch, engine=args.engine,
                       dataflow=params.get("dataflow"), seed=args.seed,
                       attention_pattern=args.attention_pattern, progress=sys.stderr.isatty(),
                       **model_sizes(args, params))
    if args.csv:
        with open(args.csv, "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows(r.csv_rows())
    if args.save:
        save_result(r, args.save)
    print(json.dumps(r.to_dict()) if args.json else _model_summary(r))
    return 0 if r.values_match_reference else 1
