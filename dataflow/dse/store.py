"""The results store: one SQLite file, one row per point, one transaction per point.

The file is in WAL mode, so a reader (`dataflow pareto`, a notebook) never blocks the sweep
writing, and a killed writer loses at most the point it had not yet committed: every committed
point survives, and a restarted sweep skips the ids it finds here. Only the sweep's main process
writes; workers return plain records. Optuna's tables (guided search) live in the same file
under their own names; ours all start with `dse_`.

A file is checked before anything is written to it: a folder, an SQLite file of someone else's
(tables, none of them ours) or a damaged one is refused with a `StoreError`, and a foreign file
is left byte for byte as it was. One sweep at a time writes to a file (`ResultsStore.exclusive`):
a second one started on it refuses up front instead of simulating every point again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dataflow.dse.points import Point
from dataflow.errors import UserError

METRIC_COLUMNS = ("cycles", "time_s", "energy_pj", "area_mm2", "edp_pj_s", "pe_utilization",
                  "mac_utilization", "dram_bytes", "values_match", "max_abs_error", "wall_s")

INTEGER_COLUMNS = ("cycles", "dram_bytes", "values_match")

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS dse_runs (
    run_id TEXT PRIMARY KEY, sweep TEXT, sweep_file TEXT, mode TEXT, started_at REAL,
    finished_at REAL, planned INTEGER, skipped INTEGER, evaluated INTEGER DEFAULT 0,
    failed INTEGER DEFAULT 0, duplicates INTEGER DEFAULT 0);
CREATE TABLE IF NOT EXISTS dse_points (
    point_id TEXT PRIMARY KEY, run_id TEXT, sweep TEXT, workload TEXT, grp TEXT, status TEXT,
    error TEXT, {", ".join(f"{c} {'INTEGER' if c in INTEGER_COLUMNS else 'REAL'}"
                          for c in METRIC_COLUMNS)},
    worker TEXT, stored_at REAL, point_json TEXT, result_json TEXT);
CREATE INDEX IF NOT EXISTS dse_points_sweep ON dse_points (sweep);
"""


OUR_TABLES = frozenset({"dse_runs", "dse_points"})


class StoreError(UserError):
    """A results file that cannot be used: a folder, someone else's database, a damaged one,
    or one another sweep is writing to."""


class ResultsStore:
    """Open (or create) `path`. Use as a context manager, or call `close()`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock_depth = 0
        if self.path.is_dir():
            raise StoreError(f"{self.path}: is a folder; give a results file, e.g. "
                             f"{self.path / 'results.db'}")
        if self.path.parent and not self.path.parent.exists():
            raise FileNotFoundError(f"{self.path}: folder {self.path.parent} does not exist")
        existing = self.path.exists() and self.path.stat().st_size > 0
        self.conn = sqlite3.connect(str(self.path), timeout=60, isolation_level=None)
        try:
            if existing:  # read-only checks first: nothing is written to a file we refuse
                self._check_existing()
            self.conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL is durable against a killed process (WAL); only an OS crash may lose the tail
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.executescript(SCHEMA)
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise StoreError(f"{self.path}: not a results database, or a damaged one ({exc})") \
                from None
        except UserError:
            self.conn.close()
            raise

    def _check_existing(self) -> None:
        tables = {r[0] for r in self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and not OUR_TABLES <= tables:
            raise StoreError(f"{self.path}: an SQLite database of something else (tables: "
                             f"{', '.join(sorted(tables)[:5])}), not a results file; left "
                             "unchanged: give a new file")
        # a damaged page in the middle would otherwise surface hours later, from a query
        problems = [r[0] for r in self.conn.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise StoreError(f"{self.path}: the results database is damaged ({problems[0]}); "
                             "restore it from a copy or start a new file")

    @contextlib.contextmanager
    def exclusive(self):
        """Hold the file's one writer lock for a whole sweep; `StoreError` at once if another
        sweep holds it. An flock on the database file itself: it is independent of SQLite's
        POSIX locks on a local file system, and WAL mode already rules out network ones. The
        kernel drops it when the holder dies, so a killed sweep never leaves a stale lock."""
        if self._lock_depth:  # already ours (the CLI takes it before starting workers)
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreError(f"{self.path}: another sweep is writing to this results file; "
                                 "wait for it to end (then run this one to add what it lacks) "
                                 "or give another file") from None
            self._lock_depth = 1
            yield
        finally:
            self._lock_depth = 0
            os.close(fd)

    def __enter__(self) -> ResultsStore:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------- runs
    def start_run(self, sweep: str, sweep_file: str, mode: str, planned: int, skipped: int) -> str:
        run_id = uuid.uuid4().hex[:12]
        with self._tx():
            self.conn.execute(
                "INSERT INTO dse_runs (run_id, sweep, sweep_file, mode, started_at, planned, "
                "skipped) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, sweep, sweep_file, mode, time.time(), planned, skipped))
        return run_id

    def finish_run(self, run_id: str) -> None:
        with self._tx():
            self.conn.execute("UPDATE dse_runs SET finished_at = ? WHERE run_id = ?",
                              (time.time(), run_id))

    def run(self, run_id: str) -> dict:
        cur = self.conn.execute("SELECT * FROM dse_runs WHERE run_id = ?", (run_id,))
        row = cur.fetchone()
        return dict(zip([d[0] for d in cur.description], row)) if row else {}

    def runs(self) -> list[dict]:
        cur = self.conn.execute("SELECT * FROM dse_runs ORDER BY started_at")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]

    # ------------------------------------------------------------- points
    def stored_ids(self, include_failed: bool = True) -> set[str]:
        q = "SELECT point_id FROM dse_points" + ("" if include_failed else " WHERE status = 'ok'")
        return {r[0] for r in self.conn.execute(q)}

    def put(self, point: Point, record: dict[str, Any], run_id: str,
            replace_failed: bool = False) -> bool:
        """Store one evaluated point in its own transaction; False if it was already stored
        (a successful point is never overwritten; a failed one only with `replace_failed`)."""
        if record["point_id"] != point.point_id:
            raise ValueError(f"record for {record['point_id']} given for point {point.point_id}")
        cols = ["point_id", "run_id", "sweep", "workload", "grp", "status", "error",
                *METRIC_COLUMNS, "worker", "stored_at", "point_json", "result_json"]
        vals = [point.point_id, run_id, point.sweep, point.workload, point.group(),
                record["status"], record.get("error"),
                *(record.get(c) for c in METRIC_COLUMNS), record.get("worker"), time.time(),
                json.dumps(point.describe(), sort_keys=True),
                json.dumps(record.get("result"), sort_keys=True) if record.get("result") else None]
        conflict = "DO NOTHING"
        if replace_failed:
            conflict = ("DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in cols[1:])
                        + " WHERE dse_points.status = 'failed'")
        with self._tx():
            cur = self.conn.execute(
                f"INSERT INTO dse_points ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
                f"ON CONFLICT (point_id) {conflict}", vals)
            inserted = cur.rowcount == 1
            self.conn.execute(
                "UPDATE dse_runs SET evaluated = evaluated + ?, failed = failed + ?, "
                "duplicates = duplicates + ? WHERE run_id = ?",
                (int(inserted), int(inserted and record["status"] != "ok"), int(not inserted),
                 run_id))
        return inserted

    def get(self, point_id: str) -> dict | None:
        rows = self.rows(where="point_id = ?", args=(point_id,))
        return rows[0] if rows else None

    def rows(self, where: str = "", args: Iterable = ()) -> list[dict]:
        """Stored points as dicts (point_json and result_json decoded)."""
        cur = self.conn.execute("SELECT * FROM dse_points" + (f" WHERE {where}" if where else "")
                                + " ORDER BY stored_at, point_id", tuple(args))
        names = [d[0] for d in cur.description]
        out = []
        for r in cur.fetchall():
            row = dict(zip(names, r))
            row["point"] = json.loads(row.pop("point_json"))
            rj = row.pop("result_json")
            row["result"] = json.loads(rj) if rj else None
            if row["values_match"] is not None:
                row["values_match"] = bool(row["values_match"])
            out.append(row)
        return out

    def count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM dse_points").fetchone()[0]

    def _tx(self):
        return _Transaction(self.conn)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error): the write lock is taken up front."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self):
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, *_):
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")
