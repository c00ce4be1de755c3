"""DSE end to end: stored results, a sweep killed midway and resumed, Dask, Optuna, exports."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest

from dataflow.cli import main
from dataflow.dse import pareto
from dataflow.dse.points import grid_points
from dataflow.dse.runners import SerialRunner, run_sweep
from dataflow.dse.store import ResultsStore
from dataflow.dse.sweep import load_sweep
from tests.conftest import ROOT

TINY = ROOT / "examples" / "tiny_sweep.yaml"
COMPARED = ("status", "cycles", "energy_pj", "area_mm2", "pe_utilization", "mac_utilization",
            "dram_bytes", "values_match", "max_abs_error")


def metrics(db) -> dict[str, tuple]:
    with ResultsStore(db) as store:
        return {r["point_id"]: tuple(r[c] for c in COMPARED) for r in store.rows()}


@pytest.fixture(scope="module")
def tiny_db(tmp_path_factory):
    """The tiny example sweep, run serially in this process (the reference for other runs)."""
    db = tmp_path_factory.mktemp("dse") / "tiny.db"
    with ResultsStore(db) as store:
        summary = run_sweep(load_sweep(TINY), store, SerialRunner())
    assert summary.evaluated == 12 and summary.failed == 0
    return db


def test_points_are_stored_with_checked_values_and_area(tiny_db):
    sweep = load_sweep(TINY)
    with ResultsStore(tiny_db) as store:
        rows = {r["point_id"]: r for r in store.rows()}
    assert set(rows) == {p.point_id for p in grid_points(sweep).points}
    for r in rows.values():
        assert r["status"] == "ok" and r["values_match"] is True  # engine == numpy reference
        arch = r["point"]["arch"]
        pes = arch["pe_array"]["rows"] * arch["pe_array"]["cols"]
        a = arch["area"]
        spm, ic = arch["spm"], arch["interconnect"]
        ports = spm["read_ports_per_line"] + spm["write_ports_per_line"]
        links = (1 + len(ic["skip_hop_strides"])) * ic["links_per_direction"]
        assert r["area_mm2"] == pytest.approx(  # pe_array.simulate.area_breakdown's model
            pes * (a["pe_mm2"] + a["router_mm2"] * links)
            + spm["lines"] * a["spm_line_mm2"] * ports / 2)
        assert r["energy_pj"] == pytest.approx(r["result"]["energy_total_pj"])
        assert r["time_s"] == pytest.approx(r["cycles"] / (arch["clock_ghz"] * 1e9))
        assert r["cycles"] >= r["result"]["compute_cycles"] > 0


def test_each_point_is_committed_in_its_own_transaction(tmp_path):
    """While a sweep runs, another connection sees every point the moment it is reported."""
    db = tmp_path / "r.db"
    seen = []

    class Watching(SerialRunner):
        def imap_unordered(self, payloads):
            for rec in super().imap_unordered(payloads):
                with sqlite3.connect(db) as other:
                    seen.append(other.execute("SELECT COUNT(*) FROM dse_points").fetchone()[0])
                yield rec  # stored by the caller before the next point starts

    with ResultsStore(db) as store:
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        run_sweep(load_sweep(TINY), store, Watching())
    assert seen == list(range(12))  # point k+1 is evaluated only after point k was committed


def test_store_never_overwrites_and_retries_only_failed(tmp_path):
    sweep = load_sweep(TINY)
    p = grid_points(sweep).points[0]
    with ResultsStore(tmp_path / "r.db") as store:
        run = store.start_run("t", "t.yaml", "test", 1, 0)
        failed = {"point_id": p.point_id, "status": "failed", "error": "MappingError: x"}
        assert store.put(p, failed, run) is True
        assert store.put(p, failed, run) is False  # a repeat is refused
        ok = {"point_id": p.point_id, "status": "ok", "cycles": 7}
        assert store.put(p, ok, run) is False and store.get(p.point_id)["status"] == "failed"
        assert store.put(p, ok, run, replace_failed=True) is True
        assert store.get(p.point_id)["cycles"] == 7
        assert store.put(p, failed, run, replace_failed=True) is False  # ok is never replaced
        assert store.run(run)["duplicates"] == 3 and store.count() == 1


def test_impossible_mapping_is_a_failed_point_not_a_crash(tmp_path, capsys):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        "arch:\n"
        "  set: {pe_array.instruction_entries: 2}\n"
        "  zip: [{pe_array.rows: [1, 4], pe_array.cols: [1, 4]}]\n"
        "workloads: [{name: gemm, params: {m: 16, k: 16, n: 16}}]\n")
    db = tmp_path / "r.db"
    assert main(["sweep", str(sweep), "--out", str(db), "--serial", "--no-progress"]) == 0
    assert "2 evaluated (1 failed)" in capsys.readouterr().out
    with ResultsStore(db) as store:
        rows = {r["point"]["arch_overrides"]["pe_array.rows"]: r for r in store.rows()}
    # a 1x1 array holding 2 instructions cannot hold a GEMM body: the mapper says so
    assert rows[1]["status"] == "failed" and rows[1]["cycles"] is None
    assert (rows[1]["error"].startswith("MappingError:")
            and "instruction_entries" in rows[1]["error"])
    assert rows[4]["status"] == "ok" and rows[4]["values_match"] is True
    # pareto ranks the successful point and reports the failed one
    assert main(["pareto", str(db)]) == 0
    out = capsys.readouterr().out
    assert "1 of 1 points on the front" in out and "1 failed points" in out


KILL_SWEEP = """
name: kill
arch:
  zip: [{pe_array.rows: [4, 8], pe_array.cols: [4, 8]}]
  sweep: {spm.lines: [4, 8, 16], dram.bytes_per_cycle: [25.6, 51.2]}
workloads:
  - {name: gemm, params: {m: 64, k: 64, n: [32, 64]}}
  - {name: spmm, params: {m: 64, k: 64, n: 32, density: 0.3}}
"""  # 12 architectures x 3 workload instances = 36 points of 30-150 ms


def test_killed_sweep_resumes_without_losing_or_repeating_points(tmp_path):
    sweep_file = tmp_path / "kill.yaml"
    sweep_file.write_text(KILL_SWEEP)
    db = tmp_path / "killed.db"
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dataflow.cli", "sweep", str(sweep_file), "--out", str(db),
         "--workers", "2", "--no-progress"],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    stored = 0
    try:
        while stored < 4:
            assert proc.poll() is None, f"sweep ended before the kill: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "no points stored within 60 s"
            time.sleep(0.02)
            if db.exists():
                try:
                    with sqlite3.connect(db) as c:
                        stored = c.execute("SELECT COUNT(*) FROM dse_points").fetchone()[0]
                except sqlite3.OperationalError:  # tables not created yet
                    pass
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep, its forkserver and its workers
        proc.wait()
    total = len(grid_points(load_sweep(sweep_file)).points)
    with ResultsStore(db) as store:
        before = {r["point_id"]: (r["stored_at"], r["run_id"]) for r in store.rows()}
        (killed_run,) = store.runs()
    assert 4 <= len(before) < total, "the kill must land midway"
    assert killed_run["finished_at"] is None and killed_run["evaluated"] == len(before)

    with ResultsStore(db) as store:  # restart: serially in this process
        summary = run_sweep(load_sweep(sweep_file), store, SerialRunner())
        after = {r["point_id"]: (r["stored_at"], r["run_id"]) for r in store.rows()}
    assert summary.already_stored == len(before)
    assert summary.evaluated == total - len(before) and summary.duplicates == 0
    assert len(after) == total
    assert {k: after[k] for k in before} == before  # nothing stored before was redone
    with ResultsStore(tmp_path / "whole.db") as store:
        run_sweep(load_sweep(sweep_file), store, SerialRunner())
    assert metrics(db) == metrics(tmp_path / "whole.db")  # same as an uninterrupted run


def test_dask_cluster_via_scheduler_gives_the_serial_results(tiny_db, tmp_path, capsys):
    from distributed import LocalCluster

    db = tmp_path / "dask.db"
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, protocol="tcp",
                      dashboard_address=None) as cluster:
        assert cluster.scheduler_address.startswith("tcp://")
        assert main(["sweep", str(TINY), "--out", str(db), "--scheduler",
                     cluster.scheduler_address, "--no-progress"]) == 0
    assert "12 evaluated" in capsys.readouterr().out
    assert metrics(db) == metrics(tiny_db)


def test_unreachable_scheduler_is_one_clear_error(tmp_path, capsys):
    rc = main(["sweep", str(TINY), "--out", str(tmp_path / "r.db"), "--scheduler",
               "tcp://127.0.0.1:9", "--scheduler-timeout", "1"])
    assert rc == 2
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in capsys.readouterr().err


SEARCH_SWEEP = """
name: search
arch:
  zip: [{pe_array.rows: [2, 4, 8], pe_array.cols: [2, 4, 8]}]
  sweep: {spm.lines: [2, 4, 8], dram.bytes_per_cycle: [12.8, 51.2]}
workloads: [{name: gemm, params: {m: 32, k: 32, n: 16}}]
search: {objectives: [cycles, energy, area], population: 4, seed: 1}
"""


def test_optuna_search_stores_trials_and_points_and_resumes(tmp_path, capsys):
    import optuna
    from optuna.trial import TrialState

    sweep_file = tmp_path / "search.yaml"
    sweep_file.write_text(SEARCH_SWEEP)
    db = tmp_path / "search.db"
    args = ["sweep", str(sweep_file), "--out", str(db), "--search", "optuna", "--serial",
            "--no-progress"]
    assert main([*args, "--trials", "6"]) == 0
    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{db}")  # same file as the results
    study = optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{db}")
    assert study.study_name.startswith("search/gemm(m=32, k=32, n=16")
    trials = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(trials) == 6
    with ResultsStore(db) as store:
        rows = {r["point_id"]: r for r in store.rows()}
        for t in trials:  # every trial's values are the stored point's metrics
            r = rows[t.user_attrs["point_id"]]
            assert t.values == [r["cycles"], r["energy_pj"], r["area_mm2"]]
            assert r["point"]["arch_overrides"] == t.user_attrs["arch_overrides"]
    n_points = len(rows)
    assert n_points == len({t.user_attrs["point_id"] for t in trials})

    assert main([*args, "--trials", "10"]) == 0  # resume: the study grows to 10 trials
    study = optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{db}")
    done = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(done) == 10
    with ResultsStore(db) as store:
        assert store.count() == len({t.user_attrs["point_id"] for t in done})  # nothing repeated
    # the study's own front agrees with ours over the same points
    best = {t.user_attrs["point_id"] for t in study.best_trials}
    rows = pareto.rank_rows(pareto.load_rows(db), ["cycles", "energy_pj", "area_mm2"])
    assert best == {r["point_id"] for r in rows if r["pareto_rank"] == 0}


def test_pareto_cli_exports_round_trip(tiny_db, tmp_path, capsys):
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    csv_path, pq_path, png = tmp_path / "f.csv", tmp_path / "f.parquet", tmp_path / "f.png"
    assert main(["pareto", str(tiny_db), "--x", "cycles", "--y", "energy", "--csv", str(csv_path),
                 "--parquet", str(pq_path), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    rows = pareto.rank_rows(pareto.load_rows(tiny_db), ["cycles", "energy_pj"])
    # the printed fronts are the brute-force fronts of (cycles, energy) per workload instance
    for r in rows:
        others = [o for o in rows if o["group"] == r["group"]]
        dominated = any(o["cycles"] <= r["cycles"] and o["energy_pj"] <= r["energy_pj"]
                        and (o["cycles"], o["energy_pj"]) != (r["cycles"], r["energy_pj"])
                        for o in others)
        assert (r["pareto_rank"] == 0) == (not dominated)
        assert (r["point_id"] in out) == (not dominated)
    expected = pareto.to_arrow(rows)
    assert pq.read_table(pq_path).equals(expected)
    back = pacsv.read_csv(csv_path, convert_options=pacsv.ConvertOptions(
        column_types=expected.schema, strings_can_be_null=True))
    assert back.equals(expected)
    assert png.stat().st_size > 10_000
    assert set(expected.column_names) >= {"arch.pe_array.rows", "arch.spm.lines", "param.n",
                                          "cycles", "energy_pj", "area_mm2", "pareto_rank"}
    assert np.array_equal(np.sort(expected.column("cycles").to_numpy()),
                          np.sort([r["cycles"] for r in rows]))
    front_only = tmp_path / "front.csv"
    assert main(["pareto", str(tiny_db), "--x", "cycles", "--y", "energy", "--front-only",
                 "--csv", str(front_only)]) == 0
    n_front = sum(r["pareto_rank"] == 0 for r in rows)
    assert len(front_only.read_text().strip().splitlines()) == 1 + n_front


def test_pareto_bad_input_is_clear(tiny_db, tmp_path, capsys):
    assert main(["pareto", str(tmp_path / "none.db")]) == 2
    assert "no such results file" in capsys.readouterr().err
    assert main(["pareto", str(tiny_db), "--x", "speed"]) == 2
    assert "unknown metric 'speed'" in capsys.readouterr().err
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite" * 100)
    assert main(["pareto", str(junk)]) == 2
    assert "not a results database" in capsys.readouterr().err
    assert json.loads(json.dumps(pareto.load_rows(tiny_db)[0]))  # rows are plain data
