"""Traces and pictures: the trace file holds exactly the reference engine's events; the result
file round-trips; `dataflow report` draws every picture from a saved result and fails cleanly
on bad input."""

import json
from pathlib import Path

import numpy as np
import pytest

import dataflow
from dataflow.cli import main
from dataflow.errors import UserError
from dataflow.report import (
    load_result,
    plots,
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


@pytest.fixture(scope="module")
def bigbird_data(tmp_path_factory):
    """The result whose long workload name pushed the roofline legend off the picture."""
    path = tmp_path_factory.mktemp("bigbird") / "r.json"
    assert main(["simulate", "--workload", "attention", "--pattern", "bigbird", "--seq", "128",
                 "--dim", "32", "--save", str(path)]) == 0
    return load_result(path)


def _extents_outside(fig) -> list[str]:
    """Legends, titles and axis labels of `fig`, and each axes' drawn tick labels (its tight
    box: what matplotlib draws for it, so no ticks outside the view), that reach past the
    figure's edges."""
    fig.canvas.draw()  # lay out, as savefig does
    renderer = fig.canvas.get_renderer()
    artists = [("figure legend", leg) for leg in fig.legends]
    for ax in fig.axes:
        artists += [("axes legend", ax.get_legend()), ("title", ax.title),
                    ("x label", ax.xaxis.label), ("y label", ax.yaxis.label),
                    ("axes with its tick labels", ax)]
    box, bad = fig.bbox, []
    for name, artist in artists:
        text = getattr(artist, "get_text", lambda: "not a text")
        if artist is None or not artist.get_visible() or text() == "":
            continue
        e = (artist.get_tightbbox(renderer) if name.startswith("axes with")
             else artist.get_window_extent(renderer))
        if e.x0 < box.x0 - 1 or e.y0 < box.y0 - 1 or e.x1 > box.x1 + 1 or e.y1 > box.y1 + 1:
            bad.append(f"{name} at {tuple(round(v) for v in e.bounds)} outside {box.bounds}")
    return bad


def record_figure_extents(monkeypatch) -> dict[str, list[str]]:
    """Picture file name -> what lies outside its figure, for every picture saved from now."""
    checked: dict[str, list[str]] = {}
    save = plots._save

    def checking_save(fig, path):
        checked[Path(path).name] = _extents_outside(fig)
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", checking_save)
    return checked


def test_every_picture_fits_its_figure(bigbird_data, traced, tmp_path, monkeypatch):
    checked = record_figure_extents(monkeypatch)
    for name, data in (("bigbird", bigbird_data), ("gemm", json.loads(json.dumps(
            result_data(traced))))):
        written, skipped = write_report(data, tmp_path / name)
        assert skipped == [] and len(written) == 4
        assert set(checked) == {p.name for p in written}
        assert all(v == [] for v in checked.values()), (name, checked)
        checked.clear()


def _result_file(tmp_path, data) -> Path:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["result"].update(cycles=-5), "result.cycles: must be a finite number >= 0"),
    (lambda d: d["result"].update(cycles="many"), "result.cycles: expected an integer"),
    (lambda d: d["result"].pop("macs"), "result.macs: required key is missing"),
    (lambda d: d["result"].update(workload=3), "result.workload: expected a string"),
    (lambda d: d["result"].update(pe_utilization=1.5), "result.pe_utilization: a fraction"),
    (lambda d: d.update(result=[1]), "result: expected an object, got a list"),
    (lambda d: d["arrays"].update(pe_busy_cycles=[[1, 2], [3]]), r"pe_busy_cycles\[1\]"),
    (lambda d: d["arrays"].update(spm_reads_per_line=[1, None]),
     r"arrays.spm_reads_per_line\[1\]: expected a number, got null"),
    (lambda d: d["schedule"][0].pop("ii"), r"schedule\[0\].ii: required key is missing"),
    (lambda d: d["schedule"][0].update(ii=0), r"schedule\[0\].ii: must be"),
    (lambda d: d["schedule"][0].update(pe_row=True), r"schedule\[0\].pe_row: expected an int"),
    (lambda d: d["roofline"].update(peak_macs_per_cycle="x"), "roofline.peak_macs_per_cycle"),
])
def test_report_names_the_key_path_of_bad_content(traced, tmp_path, capsys, change, message):
    data = json.loads(json.dumps(result_data(traced)))
    change(data)
    path = _result_file(tmp_path, data)
    with pytest.raises(UserError, match=message):
        load_result(path)
    assert main(["report", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dataflow: error: {path}: ") and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_report_refuses_folders_and_files_in_the_wrong_place(traced, tmp_path, capsys):
    good = save_result(traced, tmp_path / "r.json")
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "is a folder, not a result file" in capsys.readouterr().err
    assert main(["report", str(good), "--out", str(good)]) == 2
    assert f"--out {good}: is a file" in capsys.readouterr().err
    assert main(["report", str(good), "--out", str(good / "below")]) == 2
    assert "cannot make the folder" in capsys.readouterr().err
    with pytest.raises(UserError, match="is a folder; name the result file"):
        save_result(traced, tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        save_result(traced, tmp_path / "no" / "r.json")
    rc = main(["simulate", "--workload", "gemm", "--m", "4", "--k", "4", "--n", "8",
               "--save", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "is a folder; name the result file" in err and "Traceback" not in err
