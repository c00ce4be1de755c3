"""dataflow: simulate workloads on a dataflow accelerator model (`simulate`), draw a saved
result (`report`), check numpy / sim / cuda against each other (`crosscheck`), compare with a
GPU (`compare`), and explore design spaces (`sweep`, `pareto`)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NamedTuple

from dataflow.errors import USER_ERRORS

BUG_REPORT = ("dataflow: internal error: this is a bug in dataflow, not in your input. Please "
              "report it with the traceback above and the command line: {command}")


class Command(NamedTuple):
    module: str  # its `add_parser(subparsers)` adds the command and sets `func`, its handler
    help: str  # the command's line in `dataflow --help`


#: Every subcommand, in the order `dataflow --help` lists them. A command's module is imported
#: only when that command runs (its handler: `handler(args) -> int`, the exit code), so
#: `dataflow --help` imports none of them (start-up, issue 14).
COMMANDS: dict[str, Command] = {
    "simulate": Command("dataflow.cli.simulate_command",
                        "simulate one workload on an architecture"),
    "sweep": Command("dataflow.dse.cli",
                     "run a design-space sweep (grid or guided search) into a results file"),
    "pareto": Command("dataflow.dse.cli",
                      "Pareto fronts of a results file: table, plot, CSV, Parquet"),
    "crosscheck": Command("dataflow.cuda.cli", "numpy vs sim vs cuda on the same inputs"),
    "compare": Command("dataflow.cuda.cli",
                       "dataflow simulated vs GPU measured-or-modelled cost"),
    "report": Command("dataflow.report.cli",
                      "draw a saved result: Gantt chart, PE and SPM heatmaps, roofline; for a "
                      "model, cycles, roofline and share of time per layer"),
}


def deferred(module: str, function: str):
    """`function` of `module`, imported when first called: for the flags of a command that need
    modules its plain run does not (`simulate --model`, `--save`)."""
    def run(*args, **kwargs):
        return getattr(importlib.import_module(module), function)(*args, **kwargs)
    run.__qualname__ = f"{module}.{function}"
    return run


def _parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser for `argv`: every command is listed, and the one `argv` names gets its
    arguments from its module (only that module is imported)."""
    p = argparse.ArgumentParser(prog="dataflow", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    # the top-level parser takes no option but -h, so the first other word names the command
    named = next((a for a in argv if not a.startswith("-")), None)
    chosen = COMMANDS[named].module if named in COMMANDS else None
    for name, cmd in COMMANDS.items():
        if cmd.module != chosen:
            sub.add_parser(name, help=cmd.help)
        elif name not in sub.choices:  # its module adds it along with its siblings
            importlib.import_module(chosen).add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command. Exit codes: 0 done, 1 values differ from the reference, 2 bad input
    (one line on stderr), 3 an internal error (its traceback and a request to report it)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser(argv).parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        print(f"dataflow: error: {exc}", file=sys.stderr)
        return 2
    except Exception:
        # not bad input: a bug in dataflow, so keep the traceback instead of one polite line
        import traceback  # (here: 5 ms a start-up otherwise, docs/conventions.md#timing-only)

        traceback.print_exc()
        print(BUG_REPORT.format(command=" ".join(["dataflow", *argv])), file=sys.stderr)
        return 3
