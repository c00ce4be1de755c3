"""`dataflow crosscheck` and `dataflow compare` (the CUDA path's subcommands)."""

from __future__ import annotations

import argparse
import json
import sys

from dataflow.arch import preset_names
from dataflow.cli import COMMANDS
from dataflow.cli.simulate_command import add_model_size_flags, model_sizes
from dataflow.cuda.compare import compare, compare_model, crosscheck, plot_comparison
from dataflow.cuda.device import GpuUnavailableError
from dataflow.cuda.gpu_spec import available_gpus
from dataflow.cuda.workloads import gpu_workloads
from dataflow.errors import USER_ERRORS, UserError
from dataflow.workloads import all_params


def _workload_flags(p: argparse.ArgumentParser, required: bool = True) -> None:
    """--workload and every workload parameter flag, as `dataflow simulate` has them."""

    p.add_argument("--workload", required=required, choices=sorted(gpu_workloads()),
                   help="a workload the CUDA path covers")
    p.add_argument("--arch", default="default", help="dataflow architecture: a preset "
                   f"({', '.join(preset_names())}) or a YAML path (default: %(default)s)")
    for prm in all_params().values():
        kw = {"choices": [c for c in prm.choices if c is not None]} if prm.choices else {}
        p.add_argument(prm.flag, dest=prm.name, type=prm.type, default=None, help=prm.help, **kw)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _params(args) -> dict:
    return {n: getattr(args, n) for n in all_params() if getattr(args, n, None) is not None}


def add_parser(sub) -> None:
    c = sub.add_parser("crosscheck", help=COMMANDS["crosscheck"].help,
                       description="Run one workload's operands through the numpy reference, "
                       "the simulated dataflow array and the CUDA kernels (in the CUDA simulator "
                       "when there is no GPU) and report the largest error of each pair. Exit "
                       "code 1 when a pair differs beyond the fp32 tolerances.")
    _workload_flags(c)
    c.set_defaults(func=crosscheck_command)

    m = sub.add_parser("compare", help=COMMANDS["compare"].help,
                       description="Simulated time and energy of a workload on a dataflow "
                       "architecture next to each GPU's: measured with CUDA events when this "
                       "machine has that GPU, else modelled from the preset gpus/NAME "
                       "(per-kernel roofline); every number says which. With --model FILE: per "
                       "layer of a whole model.")
    _workload_flags(m, required=False)
    m.add_argument("--model", metavar="FILE", help="compare a whole model file layer by layer "
                   "(instead of --workload); --seq and the other size flags fill its sizes")
    add_model_size_flags(m)
    m.add_argument("--gpu", action="append", default=None, metavar="NAME|FILE.yaml",
                   help="GPU spec: a preset (" + ", ".join(available_gpus()) + ", also written "
                   "gpus/NAME) or a YAML path (repeatable; default jetson_xavier_nx)")
    m.add_argument("--model-only", action="store_true",
                   help="model every GPU even when one is present")
    m.add_argument("--plot", default=None, metavar="FILE.png",
                   help="bar chart of time and energy (default out/compare_WORKLOAD.png)")
    m.add_argument("--no-plot", action="store_true")
    m.set_defaults(func=compare_command)


#: besides bad input: no GPU where one was asked for, and a case that has no CUDA kernel
CUDA_USER_ERRORS = (*USER_ERRORS, GpuUnavailableError, NotImplementedError)


def crosscheck_command(args) -> int:
    try:
        r = crosscheck(args.workload, args.arch, seed=args.seed, **_params(args))
    except CUDA_USER_ERRORS as exc:
        print(f"dataflow crosscheck: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(r.to_dict()) if args.json else r.summary())
    return 0 if r.ok else 1


def compare_model_command(args) -> int:
    try:
        if args.workload:
            raise UserError("give --model FILE or --workload NAME, not both")
        r = compare_model(args.model, args.arch, args.gpu or ["jetson_xavier_nx"],
                          seed=args.seed, measure_if_present=not args.model_only,
                          attention_pattern=args.attention_pattern,
                          **model_sizes(args, _params(args)))
    except CUDA_USER_ERRORS as exc:
        print(f"dataflow compare: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(r.to_dict()) if args.json else r.summary())
    return 0


def compare_command(args) -> int:
    if args.model:
        return compare_model_command(args)
    if not args.workload or args.size or args.attention_pattern:
        print("dataflow compare: error: give --workload NAME (or --model FILE; --size and "
              "--attention-pattern apply to --model)", file=sys.stderr)
        return 2
    try:
        r = compare(args.workload, args.arch, args.gpu or ["jetson_xavier_nx"], seed=args.seed,
                    measure_if_present=not args.model_only, **_params(args))
    except CUDA_USER_ERRORS as exc:
        print(f"dataflow compare: error: {exc}", file=sys.stderr)
        return 2
    plot = None
    if not args.no_plot:
        plot = plot_comparison(r, args.plot or f"out/compare_{args.workload}.png")
    if args.json:
        print(json.dumps(dict(r.to_dict(), plot=plot)))
    else:
        print(r.summary() + (f"\n  plot: {plot}" if plot else ""))
    return 0
