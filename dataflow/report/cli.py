"""`dataflow report RESULT --out DIR`: the pictures of a saved simulation result."""

from __future__ import annotations

import sys

from dataflow.cli import COMMANDS
from dataflow.errors import USER_ERRORS
from dataflow.report import load_result, write_report


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help=COMMANDS["report"].help,
        description="RESULT is a file written by `dataflow simulate --save FILE` or `dataflow "
                    "simulate --model M --save FILE` (or the JSON that `--json` prints; it "
                    "holds less, so fewer pictures).")
    p.add_argument("result", help="result file (JSON)")
    p.add_argument("--out", default="report", help="output folder (default: %(default)s)")
    p.set_defaults(func=handle)


def handle(args) -> int:
    try:
        data = load_result(args.result)
        written, skipped = write_report(data, args.out)
    except USER_ERRORS as exc:
        print(f"dataflow: error: {exc}", file=sys.stderr)
        return 2
    for p in written:
        print(f"wrote {p}")
    for s in skipped:
        print(f"skipped {s}")
    return 0
