"""Sweeps that are interrupted, killed, raced, or pointed at the wrong file (issue 15, part 4)."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dataflow.cli import main
from dataflow.dse.points import grid_points
from dataflow.dse.store import ResultsStore
from dataflow.dse.sweep import load_sweep
from tests.conftest import ROOT

TINY = ROOT / "examples" / "tiny_sweep.yaml"
SLOW_SWEEP = """
name: slow
arch:
  sweep: {spm.lines: [4, 8], dram.latency_cycles: [50, 100, 200, 400]}
workloads:
  - {name: gemm, params: {m: 128, k: 128, n: [128, 192]}}
"""  # 16 points of 0.3-0.9 s each


def _env(tmp_path: Path) -> dict:
    # the repo on the path, and a plan cache of this test's own: every point really simulates
    return dict(os.environ, DATAFLOW_CACHE_DIR=str(tmp_path / "plans"),
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def _start(tmp_path: Path, db: Path, *extra: str) -> subprocess.Popen:
    sweep_file = tmp_path / "slow.yaml"
    sweep_file.write_text(SLOW_SWEEP)
    return subprocess.Popen(
        [sys.executable, "-m", "dataflow.cli", "sweep", str(sweep_file), "--out", str(db),
         *extra], env=_env(tmp_path), start_new_session=True, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _stored(db: Path) -> int:
    try:
        with sqlite3.connect(db) as c:
            return c.execute("SELECT COUNT(*) FROM dse_points").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


def _wait_stored(proc: subprocess.Popen, db: Path, n: int, limit_s: float = 30) -> None:
    deadline = time.monotonic() + limit_s
    while not (db.exists() and _stored(db) >= n):
        assert proc.poll() is None, f"sweep ended early: {proc.communicate()}"
        assert time.monotonic() < deadline, f"fewer than {n} points stored in {limit_s} s"
        time.sleep(0.05)


def _group(pgid: int) -> set[int]:
    """Live (not zombie) processes of process group `pgid`: the sweep, forkserver, workers."""
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            out.add(int(d.name))
    return out


def _wait_gone(pgid: int, limit_s: float) -> set[int]:
    deadline = time.monotonic() + limit_s
    while (left := _group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _evaluated(stdout: str) -> int:
    return int(re.search(r"(\d+) evaluated", stdout).group(1))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_ctrl_c_stops_the_sweep_keeps_its_points_and_leaves_no_worker(tmp_path):
    db = tmp_path / "r.db"
    proc = _start(tmp_path, db, "--workers", "2")
    try:
        _wait_stored(proc, db, 3)
        assert len(_group(proc.pid)) >= 4  # the sweep, the forkserver, two workers
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        t0 = time.monotonic()
        _out, err = proc.communicate(timeout=10)
        assert time.monotonic() - t0 < 5
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not _wait_gone(proc.pid, 5), "worker processes left behind"
    total = len(grid_points(load_sweep(tmp_path / "slow.yaml")).points)
    with ResultsStore(db) as store:
        before = {r["point_id"]: r["stored_at"] for r in store.rows()}
        (run,) = store.runs()
    assert 3 <= len(before) < total and run["evaluated"] == len(before)
    assert all(r["status"] == "ok" for r in ResultsStore(db).rows())

    again = _start(tmp_path, db, "--workers", "2")
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert f"{len(before)} already stored, {total - len(before)} evaluated" in out
    with ResultsStore(db) as store:
        after = {r["point_id"]: r["stored_at"] for r in store.rows()}
        assert sum(r["duplicates"] for r in store.runs()) == 0
    assert len(after) == total and {k: after[k] for k in before} == before


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_workers_exit_when_the_sweep_is_killed(tmp_path):
    db = tmp_path / "r.db"
    proc = _start(tmp_path, db, "--workers", "2")
    try:
        _wait_stored(proc, db, 1)
        helpers = _group(proc.pid) - {proc.pid}
        assert len(helpers) >= 3  # the forkserver and two workers
        os.kill(proc.pid, signal.SIGKILL)  # the sweep alone: its workers are not told
        proc.wait(timeout=10)  # not communicate(): a surviving worker would hold its pipes
        assert not _wait_gone(proc.pid, 5), "workers outlived their sweep"
    finally:
        for pid in _group(proc.pid):
            os.kill(pid, signal.SIGKILL)


def test_a_second_sweep_on_the_same_file_refuses_up_front(tmp_path):
    db = tmp_path / "r.db"
    first = _start(tmp_path, db, "--workers", "2")
    try:
        _wait_stored(first, db, 1)
        second = _start(tmp_path, db, "--serial")
        out, err = second.communicate(timeout=30)
        assert second.returncode == 2, (out, err)
        assert "another sweep is writing" in err and str(db) in err and len(err.splitlines()) == 1
        out, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    total = len(grid_points(load_sweep(tmp_path / "slow.yaml")).points)
    assert _evaluated(out) == total
    with ResultsStore(db) as store:
        assert store.count() == total and len(store.runs()) == 1


@pytest.fixture(scope="module")
def small_db(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("robust") / "tiny.db"
    assert main(["sweep", str(TINY), "--out", str(db), "--serial"]) == 0
    return db


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("dataflow: error: "), err
    assert "Traceback" not in err
    return err


def test_damaged_database_is_one_clear_error(small_db, tmp_path, capsys):
    db = tmp_path / "damaged.db"
    data = bytearray(small_db.read_bytes())
    page = 4096
    assert len(data) >= 4 * page
    middle = (len(data) // page // 2) * page
    data[middle:middle + page] = b"\xa5" * page
    db.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["sweep", str(TINY), "--out", str(db), "--serial"]) == 2
    assert "damaged" in _one_error_line(capsys)
    assert main(["pareto", str(db)]) == 2
    assert "damaged" in _one_error_line(capsys)


def test_foreign_sqlite_file_is_refused_and_left_unchanged(tmp_path, capsys):
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE users (name TEXT)")
        c.execute("INSERT INTO users VALUES ('ada')")
    c.close()
    before = db.read_bytes()
    assert main(["sweep", str(TINY), "--out", str(db), "--serial"]) == 2
    err = _one_error_line(capsys)
    assert str(db) in err and "users" in err
    assert main(["pareto", str(db)]) == 2
    _one_error_line(capsys)
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # no -wal, no -shm


def test_a_folder_as_out_is_one_clear_error(tmp_path, capsys):
    assert main(["sweep", str(TINY), "--out", str(tmp_path), "--serial"]) == 2
    assert "is a folder" in _one_error_line(capsys)
    assert main(["pareto", str(tmp_path)]) == 2
    _one_error_line(capsys)


def test_negative_size_in_a_sweep_file_is_refused_before_any_point(tmp_path, capsys):
    sweep = tmp_path / "neg.yaml"
    sweep.write_text("workloads:\n  - {name: gemm, params: {m: 32, k: 32, n: [32, -64]}}\n")
    db = tmp_path / "r.db"
    assert main(["sweep", str(sweep), "--out", str(db), "--serial"]) == 2
    err = _one_error_line(capsys)
    assert str(sweep) in err and "workloads[0].params.n" in err and "-64" in err
    assert not db.exists()


@pytest.mark.parametrize(("flags", "named"), [
    (["--scheduler-timeout", "-1"], "--scheduler-timeout"),
    (["--scheduler-timeout", "nan"], "--scheduler-timeout"),
    (["--workers", "0"], "--workers"),
    (["--search", "optuna", "--trials", "-1"], "--trials"),
])
def test_bad_sweep_flags_name_the_flag(tmp_path, capsys, flags, named):
    db = tmp_path / "r.db"
    assert main(["sweep", str(TINY), "--out", str(db), *flags]) == 2
    assert named in _one_error_line(capsys)
    assert not db.exists()


def test_progress_bar_only_on_a_terminal(small_db, capsys, monkeypatch):
    assert main(["sweep", str(TINY), "--out", str(small_db), "--serial"]) == 0
    assert capsys.readouterr().err == ""  # not a terminal: no bar
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["sweep", str(TINY), "--out", str(small_db), "--serial"]) == 0
    assert "12/12" in capsys.readouterr().err
