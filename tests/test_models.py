"""Model files, simulate layer by layer, the SPM/DRAM hand-off rule and `simulate --model`."""

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from dataflow.arch import resolve_arch
from dataflow.cli import main
from dataflow.models import Activation, Layer, LayerKind, Model, ModelError, load_model, simulate
from dataflow.models.files import evaluate

MODELS = Path(__file__).resolve().parent.parent / "models"
FILES = ("bert_base_layer", "gpt2_block", "vit_s16", "resnet18", "moe_ffn_layer")
TINY = {"bert_base_layer": {"seq": 8, "hidden": 32, "heads": 2},
        "gpt2_block": {"seq": 8, "hidden": 32, "heads": 2, "vocab": 64},
        "moe_ffn_layer": {"seq": 16, "hidden": 16, "ffn": 16, "experts": 4}}


@pytest.mark.parametrize("name", FILES)
def test_builtin_file_loads_at_real_sizes(name):
    m = load_model(MODELS / f"{name}.yaml")
    assert m.verify() is m and m.layers


def test_real_sizes_are_the_cited_ones():
    bert = load_model(MODELS / "bert_base_layer.yaml")
    assert bert.layers[0].sizes == (("m", 512), ("k", 768), ("n", 768))
    assert dict(bert.layers[3].sizes) == {"seq": 512, "heads": 12, "head_dim": 64}
    vit = load_model(MODELS / "vit_s16.yaml")
    assert dict(vit.layers[0].sizes) == {"m": 197, "k": 768, "n": 384}
    assert sum(la.kind == LayerKind.ATTENTION for la in vit.layers) == 12
    rn = load_model(MODELS / "resnet18.yaml")
    assert sum(la.kind == LayerKind.CONV2D for la in rn.layers) == 20
    assert dict(rn.layers[-1].sizes) == {"m": 1, "k": 512, "n": 1000}


@pytest.mark.parametrize("name", sorted(TINY))
def test_builtin_file_simulates_at_tiny_sizes(name):
    r = simulate(MODELS / f"{name}.yaml", **TINY[name])
    assert r.values_match_reference is True
    assert [lr.layer.name for lr in r.layers] == [la.name for la in r.model.layers]
    assert r.cycles == sum(lr.result.cycles for lr in r.layers) > 0
    assert r.layers[-1].activation == Activation.OUTPUT


def test_resnet18_runs_whole_on_the_systolic_preset():
    """Every conv of ResNet-18 at 224 x 224 as SCALE-Sim maps it (im2col GEMM, ws), the
    element-wise layers on the host; values equal numpy's chain of layers."""
    r = simulate(MODELS / "resnet18.yaml", arch="systolic_32x32", dataflow="ws")
    assert r.values_match_reference
    convs = [lr for lr in r.layers if lr.layer.kind == LayerKind.CONV2D]
    assert len(convs) == 20 and all(lr.result.compute_cycles > 0 for lr in convs)
    assert r.cycles == sum(lr.result.cycles for lr in r.layers)


def test_expressions_are_arithmetic_only():
    assert evaluate("hidden * 4 + (seq // 2) - 1", {"hidden": 8, "seq": 6}, "f") == 34
    assert evaluate("hidden / heads", {"hidden": 768, "heads": 12}, "f") == 64
    for bad in ("__import__('os')", "hidden ** 2", "7 / 2", "nope + 1"):
        with pytest.raises(ModelError, match="f"):
            evaluate(bad, {"hidden": 8}, "f")


def test_file_errors_name_file_and_key(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("name: m\nsizes: {seq: 4}\nlayers:\n  - {name: a, kind: gemm, m: seq, k: x, "
                 "n: 2}\n")
    with pytest.raises(ModelError, match=r"m\.yaml: layers\[0\]\.k: unknown size 'x'"):
        load_model(p)
    with pytest.raises(ModelError, match=r"m\.yaml: sizes: the model has no size 'hidden'"):
        load_model(p, hidden=3)


def _chain():
    return Model("t", (
        Layer("a", LayerKind.GEMM, (("m", 32), ("k", 16), ("n", 1024))),
        Layer("r", LayerKind.ELEMENTWISE, (("rows", 32), ("cols", 1024)), ("a",), "relu"),
        Layer("b", LayerKind.GEMM, (("m", 32), ("k", 1024), ("n", 4)), ("r",)),
        Layer("r2", LayerKind.ELEMENTWISE, (("rows", 32), ("cols", 4)), ("b",), "relu")))


def test_small_activation_stays_in_spm_large_goes_to_dram():
    spec = resolve_arch("default")
    small = dataclasses.replace(spec, spm=dataclasses.replace(spec.spm,
                                                              capacity_words_per_line=2048))
    r = simulate(_chain(), arch=small)
    base = simulate(_chain(), arch=spec)  # 1M-word SPM: every hand-off fits
    assert [str(lr.activation) for lr in r.layers] == ["dram", "dram", "spm", "output"]
    assert [str(lr.activation) for lr in base.layers] == ["spm", "spm", "spm", "output"]
    # a's output (32 x 1024 words) goes to DRAM and r reads it back: both counted
    out_bytes = 32 * 1024 * small.word_bytes
    assert r.layer("a").result.dram_bytes_written >= out_bytes
    assert r.layer("r").result.dram_bytes_read >= out_bytes
    # b's 32 x 4 output stays: its write-back and r2's re-read are subtracted
    assert r.layer("r2").result.dram_bytes_read == 0
    assert (base.layer("a").result.dram_bytes_written
            == r.layer("a").result.dram_bytes_written - out_bytes)
    assert any(n.startswith("a -> dram: 32,768 words") for n in r.notes)
    assert any(n.startswith("b -> spm: 128 words") for n in r.notes)


def test_cli_model_json_and_csv(tmp_path, capsys):
    out = tmp_path / "layers.csv"
    rc = main(["simulate", "--model", str(MODELS / "bert_base_layer.yaml"), "--seq", "8",
               "--hidden", "32", "--size", "heads=2", "--json", "--csv", str(out)])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("name", "cycles", "compute_cycles", "stall_cycles", "macs", "dram_bytes",
                "fraction_of_roofline", "values_match_reference"):
        assert key in d["layers"][0]
    assert d["cycles"] == sum(row["cycles"] for row in d["layers"])
    rows = list(csv.reader(out.open()))
    assert rows[0][0] == "name" and len(rows) == 1 + len(d["layers"])


def test_cli_model_summary_table(capsys):
    rc = main(["simulate", "--model", str(MODELS / "moe_ffn_layer.yaml"), "--seq", "16",
               "--hidden", "16", "--size", "ffn=16", "--experts", "4",
               "--attention-pattern", "window"])
    text = capsys.readouterr().out
    assert rc == 0 and "per layer" in text and "moe" in text


def test_cli_unknown_size_is_one_line(capsys):
    rc = main(["simulate", "--model", str(MODELS / "moe_ffn_layer.yaml"), "--size", "nope=3"])
    assert rc == 2 and "moe_ffn_layer.yaml: sizes: the model has no size 'nope'" in \
        capsys.readouterr().err


def test_gemm_shape_memo_is_exact(monkeypatch):
    """A GEMM layer of a shape already simulated reuses that run's timing and computes its
    values in the kernel's order (`models.gemm._SHAPE_MEMO`): the same result, every field,
    and the same bits as simulating it afresh; DATAFLOW_GEMM_MEMO=0 turns it off."""
    import numpy as np

    from dataflow.models import gemm as g
    from dataflow.models.runners import RunOptions

    arch = resolve_arch("default")
    rng = np.random.default_rng(3)
    a1, a2 = (rng.standard_normal((24, 40), dtype=np.float32) for _ in range(2))
    b = rng.standard_normal((40, 48), dtype=np.float32)  # each copy's chunk: whole k runs
    g._SHAPE_MEMO.clear()
    monkeypatch.setenv(g.GEMM_MEMO_ENV, "1")
    g.simulate_gemm(a1, b, arch, RunOptions(), "first")
    assert len(g._SHAPE_MEMO) == 1
    out_memo, res_memo = g.simulate_gemm(a2, b, arch, RunOptions(), "second")
    assert g.SHAPE_MEMO_NOTE in res_memo.notes
    monkeypatch.setenv(g.GEMM_MEMO_ENV, "0")
    out, res = g.simulate_gemm(a2, b, arch, RunOptions(), "second")
    assert g.SHAPE_MEMO_NOTE not in res.notes
    assert np.array_equal(out_memo.view(np.int32), out.view(np.int32))
    skip = {"notes", "wall_seconds", "output"}
    assert ({k: v for k, v in res_memo.to_dict().items() if k not in skip}
            == {k: v for k, v in res.to_dict().items() if k not in skip})
    # a shape whose copies split a k run (values not in `inorder_matmul`'s order) is not
    # reused: the check at its first reuse fails, it is simulated afresh
    g._SHAPE_MEMO.clear()
    monkeypatch.setenv(g.GEMM_MEMO_ENV, "1")
    g.simulate_gemm(a1, b[:, :16], arch, RunOptions(), "split runs")
    out2, res2 = g.simulate_gemm(a2, b[:, :16], arch, RunOptions(), "split runs again")
    assert g.SHAPE_MEMO_NOTE not in res2.notes
    monkeypatch.setenv(g.GEMM_MEMO_ENV, "0")
    out3, _ = g.simulate_gemm(a2, b[:, :16], arch, RunOptions(), "split runs again")
    assert np.array_equal(out2.view(np.int32), out3.view(np.int32))


def test_inorder_matmul_compiled_equals_numpy(monkeypatch):
    """`plan.split.inorder_matmul` (the values of memoised GEMM blocks and layers) gives the
    same bits in numba's loops as in numpy's rank-1 updates."""
    import numpy as np

    from dataflow.plan import split

    rng = np.random.default_rng(5)
    a = rng.standard_normal((70, 90), dtype=np.float32)
    b = rng.standard_normal((90, 60), dtype=np.float32)
    monkeypatch.setattr(split, "_use_numba", lambda macs: True)
    compiled = split.inorder_matmul(a, b)
    monkeypatch.setattr(split, "_use_numba", lambda macs: False)
    numpy_ = split.inorder_matmul(a, b)
    assert np.array_equal(compiled.view(np.int32), numpy_.view(np.int32))
