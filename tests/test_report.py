"""Traces and pictures: the trace file holds exactly the reference engine's events; the result
file round-trips; `dataflow report` draws every picture from a saved result and fails cleanly
on bad input."""

import json

import numpy as np
import pytest

import dataflow
from dataflow.cli import main
from dataflow.report import (
    load_result,
    read_trace,
    result_data,
    save_result,
    write_report,
    write_trace,
)


@pytest.fixture(scope="module")
def traced(default_arch):
    return dataflow.simulate("gemm", arch=default_arch, m=6, k=4, n=16, engine="reference",
                             trace=True)


@pytest.mark.parametrize("ext", [".csv", ".jsonl"])
def test_trace_file_holds_every_issued_op(traced, tmp_path, ext):
    path = write_trace(traced.trace, tmp_path / f"t{ext}")
    rows = read_trace(path)
    assert rows == [(c, pe[0], pe[1], op) for c, pe, op in traced.trace]
    # one event per op issued: the per-PE busy counters say the same
    busy = np.zeros_like(traced.pe_busy_cycles)
    for _, r, c, _ in rows:
        busy[r, c] += 1
    assert np.array_equal(busy, traced.pe_busy_cycles)
    # on the system clock: after the first reconfiguration, before the end
    assert 64 <= min(r[0] for r in rows) and max(r[0] for r in rows) < traced.cycles


def test_trace_rejects_unknown_extension(traced, tmp_path):
    with pytest.raises(ValueError, match=r"\.csv or \.jsonl"):
        write_trace(traced.trace, tmp_path / "t.txt")


def test_result_file_round_trips_and_report_draws_all(traced, tmp_path):
    path = save_result(traced, tmp_path / "r.json")
    data = load_result(path)
    assert data == json.loads(json.dumps(result_data(traced)))
    assert len(data["schedule"]) == len(traced.schedule) > 0
    assert data["result"]["area_total_mm2"] == pytest.approx(traced.area_total_mm2)
    written, skipped = write_report(data, tmp_path / "out")
    assert skipped == []
    assert sorted(p.name for p in written) == ["gantt.png", "pe_utilisation.png", "roofline.png",
                                               "spm_lines.png"]
    assert all(p.stat().st_size > 5000 for p in written)


def test_cli_simulate_save_trace_then_report(tmp_path, capsys):
    res, tr, out = tmp_path / "r.json", tmp_path / "t.jsonl", tmp_path / "pics"
    rc = main(["simulate", "--workload", "gemm", "--m", "4", "--k", "4", "--n", "8",
               "--engine", "reference", "--save", str(res), "--trace", str(tr)])
    assert rc == 0 and res.exists() and len(read_trace(tr)) > 0
    assert main(["report", str(res), "--out", str(out)]) == 0
    assert len(list(out.glob("*.png"))) == 4
    # the bare --json output draws what it holds and says what it skipped
    capsys.readouterr()
    main(["simulate", "--workload", "gemm", "--m", "4", "--k", "4", "--n", "8", "--json"])
    bare = tmp_path / "bare.json"
    bare.write_text(capsys.readouterr().out)
    assert main(["report", str(bare), "--out", str(tmp_path / "bare")]) == 0
    assert "skipped gantt.png" in capsys.readouterr().out


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing.json")]) == 2
    assert "no such result file" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "dataflow-result/1", "result": {"arch": "x"}}')
    assert main(["report", str(bad)]) == 2
    assert "result.workload: required key is missing" in capsys.readouterr().err
    assert main(["simulate", "--workload", "gemm", "--trace", str(tmp_path / "t.csv")]) == 2
    assert "--engine reference" in capsys.readouterr().err
