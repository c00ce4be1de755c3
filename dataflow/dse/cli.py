"""`dataflow sweep` and `dataflow pareto`."""

from __future__ import annotations

import argparse
import math
import signal
import sqlite3
import sys
import threading

from dataflow.cli import COMMANDS
from dataflow.dse import pareto
from dataflow.dse.points import grid_points
from dataflow.dse.runners import make_runner, run_sweep
from dataflow.dse.search import run_search
from dataflow.dse.store import ResultsStore
from dataflow.dse.sweep import load_sweep
from dataflow.errors import USER_ERRORS, UserError


def add_parser(sub) -> None:
    s = sub.add_parser(
        "sweep", help=COMMANDS["sweep"].help,
        description="Run every point of SWEEP.yaml not yet stored in --out (a SQLite file, one "
                    "transaction per point): killing a sweep and running it again resumes it.")
    s.add_argument("sweep_file", metavar="SWEEP.yaml")
    s.add_argument("--out", required=True, metavar="RESULTS.db", help="SQLite results file")
    s.add_argument("--workers", type=int, default=None,
                   help="local worker processes (default: one per core)")
    s.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                   help="run the points on this existing Dask cluster instead")
    s.add_argument("--scheduler-timeout", type=float, default=30, metavar="S",
                   help="seconds to wait for the Dask scheduler (default: %(default)s)")
    s.add_argument("--serial", action="store_true", help="evaluate in this process, one by one")
    s.add_argument("--search", choices=("optuna",),
                   help="guided multi-objective search (NSGA-II) instead of the whole grid")
    s.add_argument("--trials", type=int, default=None,
                   help="with --search: finished trials per workload instance")
    s.add_argument("--retry-failed", action="store_true",
                   help="evaluate again the points stored as failed")
    s.add_argument("--dry-run", action="store_true", help="validate and count points; run none")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(func=sweep_command)

    p = sub.add_parser("pareto", help=COMMANDS["pareto"].help)
    p.add_argument("results", metavar="RESULTS.db")
    p.add_argument("--x", default=None, help="metric on the plot's x axis (default cycles)")
    p.add_argument("--y", default=None, help="metric on the plot's y axis (default energy_pj)")
    p.add_argument("--objectives", default=None,
                   help="comma-separated metrics of the front (default: --x,--y if given, "
                        "else cycles,energy_pj,area_mm2)")
    p.add_argument("--group-by", default="group",
                   help="column whose values are compared separately (default: the workload "
                        "instance); 'none' compares all points")
    p.add_argument("--sweep", default=None, help="only points stored by this sweep name")
    p.add_argument("--front-only", action="store_true", help="export only front points")
    p.add_argument("--csv", metavar="FILE")
    p.add_argument("--parquet", metavar="FILE")
    p.add_argument("--plot", metavar="FILE.png")
    p.set_defaults(func=pareto_command)


def _check_flags(args: argparse.Namespace) -> None:
    """Values argparse's types let through, refused before anything starts."""
    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    if not (math.isfinite(args.scheduler_timeout) and args.scheduler_timeout > 0):
        raise UserError(f"--scheduler-timeout must be a positive number of seconds, got "
                        f"{args.scheduler_timeout:g}")
    if args.trials is not None and args.trials < 1:
        raise UserError(f"--trials must be >= 1, got {args.trials}")
    if args.search and not args.trials:
        raise UserError("--search optuna needs --trials N")
    if args.trials and not args.search:
        raise UserError("--trials goes with --search optuna")


def _sqlite_damage(exc: sqlite3.DatabaseError, path: str) -> str:
    return f"{path}: the results database is damaged or unreadable ({exc})"


def sweep_command(args: argparse.Namespace) -> int:
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C stops a sweep even when started with SIGINT ignored (a shell's `cmd &`)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _check_flags(args)
        sweep = load_sweep(args.sweep_file)
        if args.dry_run:
            if args.search:
                print(f"{sweep.name}: search over a grid of {sweep.grid_size} points")
            else:
                g = grid_points(sweep)
                print(f"{sweep.name}: {len(g.points)} points ({g.impossible_archs} impossible "
                      f"architectures skipped, {g.duplicates} duplicates merged)")
            return 0
        # a bar on a terminal only: a log file or a pipe gets the one summary line
        progress = not args.no_progress and sys.stderr.isatty()
        # a bad --out, or one another sweep is writing to, is refused before workers start
        with ResultsStore(args.out) as store, store.exclusive():
            runner = make_runner(args.workers, args.scheduler, args.serial,
                                 args.scheduler_timeout)
            try:
                if args.search:
                    summary = run_search(sweep, store, runner, args.trials, progress=progress)
                else:
                    summary = run_sweep(sweep, store, runner, progress=progress,
                                        retry_failed=args.retry_failed)
            except BaseException:
                runner.abort()  # Ctrl-C or an error: workers stop now, none is left behind
                raise
            runner.close()
    except USER_ERRORS as exc:
        print(f"dataflow: error: {exc}", file=sys.stderr)
        return 2
    except sqlite3.DatabaseError as exc:
        if type(exc) is not sqlite3.DatabaseError:  # locked, bad SQL...: not the file's fault
            raise
        print(f"dataflow: error: {_sqlite_damage(exc, args.out)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dataflow: interrupted; every finished point is stored in {args.out}: run the "
              "same command again to resume", file=sys.stderr)
        return 130
    print(f"{sweep.name}: {summary.text()}; results in {args.out}")
    for error, n in _failures(args.out, summary.run_id):
        print(f"  {n} failed: {error}")
    return 1 if getattr(summary, "values_mismatch", 0) else 0


def _failures(db: str, run_id: str, limit: int = 5) -> list[tuple[str, int]]:
    """The commonest error messages of a run's failed points."""

    with ResultsStore(db) as store:
        return store.conn.execute(
            "SELECT error, COUNT(*) AS n FROM dse_points WHERE run_id = ? AND status = 'failed' "
            "GROUP BY error ORDER BY n DESC LIMIT ?", (run_id, limit)).fetchall()


def pareto_command(args: argparse.Namespace) -> int:
    try:
        x = pareto.metric_name(args.x or "cycles")
        y = pareto.metric_name(args.y or "energy_pj")
        if args.objectives:
            objectives = [pareto.metric_name(o.strip()) for o in args.objectives.split(",")]
        elif args.x or args.y:
            objectives = [x, y]
        else:
            objectives = ["cycles", "energy_pj", "area_mm2"]
        rows = pareto.load_rows(args.results, args.sweep)
        if rows and args.group_by != "none" and args.group_by not in pareto.columns(rows):
            raise UserError(f"--group-by {args.group_by!r} is no column; columns: "
                             + ", ".join(pareto.columns(rows)))
        print(pareto.front_report(rows, objectives, args.group_by))
        ranked = pareto.rank_rows(rows, objectives, args.group_by)
        export = [r for r in ranked if r["pareto_rank"] == 0] if args.front_only else ranked
        if args.csv:
            pareto.write_csv(export, args.csv)
            print(f"wrote {len(export)} rows to {args.csv}")
        if args.parquet:
            pareto.write_parquet(export, args.parquet)
            print(f"wrote {len(export)} rows to {args.parquet}")
        if args.plot:
            pareto.plot_front(rows, x, y, args.plot, args.group_by,
                              objectives if set(objectives) != {x, y} else None)
            print(f"wrote {args.plot}")
    except USER_ERRORS as exc:
        print(f"dataflow: error: {exc}", file=sys.stderr)
        return 2
    except sqlite3.DatabaseError as exc:
        if type(exc) is not sqlite3.DatabaseError:
            raise
        print(f"dataflow: error: {_sqlite_damage(exc, args.results)}", file=sys.stderr)
        return 2
    return 0
