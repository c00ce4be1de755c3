"""The model result file and its pictures: `dataflow simulate --model M --save R` writes a file
that round-trips and is checked by key path, and `dataflow report R` draws the per-layer
pictures (cycles by cause, roofline, share of time) and the summed heatmaps, every artist
inside its figure."""

import json
from pathlib import Path

import numpy as np
import pytest

from dataflow.cli import main
from dataflow.errors import UserError
from dataflow.models import simulate
from dataflow.report import MODEL_FORMAT, load_result, model_result_data, save_result, write_report
from tests.test_report import record_figure_extents

ROOT = Path(__file__).resolve().parent.parent
BERT = ROOT / "models" / "bert_base_layer.yaml"
TINY = {"seq": 8, "hidden": 16, "heads": 2, "ffn": 32}
MODEL_PICTURE_NAMES = {"layer_cycles.png", "layer_share.png", "layer_roofline.png",
                       "pe_utilisation.png", "spm_lines.png"}


@pytest.fixture(scope="module")
def bert():
    return simulate(BERT, arch="default", **TINY)


def test_model_result_file_round_trips(bert, tmp_path):
    path = save_result(bert, tmp_path / "r.json")
    data = load_result(path)
    assert data == json.loads(json.dumps(model_result_data(bert)))
    assert data["format"] == MODEL_FORMAT
    m = data["model"]
    assert m["cycles"] == bert.cycles == sum(la["cycles"] for la in m["layers"])
    assert [la["name"] for la in m["layers"]] == [lr.layer.name for lr in bert.layers]
    for row, lr in zip(m["layers"], bert.layers):
        assert row["energy_total_pj"] == pytest.approx(lr.result.energy_total_pj)
        assert row["pe_utilization"] == pytest.approx(lr.result.pe_utilization)
    busy = sum(lr.result.pe_busy_cycles for lr in bert.layers)
    assert np.array_equal(data["arrays"]["pe_busy_cycles"], busy)
    first = bert.layers[0].result
    assert data["roofline"] == {"peak_macs_per_cycle": first.peak_macs_per_cycle,
                                "dram_bytes_per_cycle": first.dram_bytes_per_cycle,
                                "issue_width": first.issue_width}


def test_every_model_picture_fits_its_figure(bert, tmp_path, monkeypatch):
    checked = record_figure_extents(monkeypatch)
    data = load_result(save_result(bert, tmp_path / "r.json"))
    written, skipped = write_report(data, tmp_path / "out")
    assert skipped == []
    assert {p.name for p in written} == MODEL_PICTURE_NAMES == set(checked)
    assert all(v == [] for v in checked.values()), checked


def test_cli_simulate_model_save_then_report(tmp_path, capsys):
    r = tmp_path / "r.json"
    sizes = [f"--size={k}={v}" for k, v in TINY.items() if k != "seq"]
    assert main(["simulate", "--model", str(BERT), "--seq", "8", *sizes, "--save", str(r)]) == 0
    assert load_result(r)["model"]["model"] == "bert_base_layer"
    assert main(["report", str(r), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert all(f"wrote {tmp_path / 'out' / n}" in out for n in MODEL_PICTURE_NAMES)
    # the bare --json object holds no peaks and no arrays: fewer pictures, each skip said
    j = tmp_path / "bare.json"
    assert main(["simulate", "--model", str(BERT), "--seq", "8", *sizes, "--json"]) == 0
    j.write_text(capsys.readouterr().out)
    assert main(["report", str(j), "--out", str(tmp_path / "bare")]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "layer_cycles.png" in out
    assert "skipped layer_roofline.png: the result holds no roofline peaks" in out


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["model"].update(cycles=-1), "model.cycles: must be a finite number >= 0"),
    (lambda d: d["model"].update(cycles=d["model"]["cycles"] + 1),
     "model.cycles: .* is not the sum over the layers"),
    (lambda d: d["model"].update(arch=3), "model.arch: expected a string"),
    (lambda d: d["model"].update(layers=[]), "model.layers: a model result has at least one"),
    (lambda d: d["model"]["layers"][2].pop("compute_cycles"),
     r"model.layers\[2\].compute_cycles: required key is missing"),
    (lambda d: d["model"]["layers"][1]["stall_cycles"].update(dram_bandwidth="x"),
     r"model.layers\[1\].stall_cycles.dram_bandwidth: expected an integer"),
    (lambda d: d["model"]["layers"][0].update(pe_utilization=2.0),
     r"model.layers\[0\].pe_utilization: a fraction"),
    (lambda d: d["arrays"].update(pe_busy_cycles=[[1, 2], [3]]), r"pe_busy_cycles\[1\]"),
    (lambda d: d["roofline"].update(dram_bytes_per_cycle=-2), "roofline.dram_bytes_per_cycle"),
    (lambda d: d.pop("model"), "model: required key is missing"),
])
def test_model_report_names_the_key_path_of_bad_content(bert, tmp_path, capsys, change,
                                                        message):
    data = json.loads(json.dumps(model_result_data(bert)))
    change(data)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match=message):
        load_result(path)
    assert main(["report", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dataflow: error: {path}: ") and "Traceback" not in err
    assert not (tmp_path / "out").exists()
