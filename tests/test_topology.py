"""SCALE-Sim topology files: reading them (and every bad-input error), and per-layer parity
with SCALE-Sim 3.0.0 on the systolic preset.

Golden values: tests/data/scalesim_topology_golden.json, produced by running SCALE-Sim on
models/topologies/*.csv (benchmarks/scalesim/regen_topology_golden.py); SCALE-Sim is not needed
here.
"""

import dataclasses
import json
import sys

import numpy as np
import pytest

from dataflow.arch import load_arch
from dataflow.cli import main
from dataflow.mapper import map_program
from dataflow.models import conv, gemm
from dataflow.models import simulate as simulate_model
from dataflow.models.layers import LayerKind, ModelError
from dataflow.models.runners import RunOptions, runner_for
from dataflow.models.topology import read_topology
from dataflow.pe_array.systolic_memory import scalesim_im2col_addresses, systolic_memory
from dataflow.ust_frontend.ops import as_tensor, lower_matmul
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "scalesim"))
from closed_form import scalesim_compute_cycles  # noqa: E402
from regen_topology_golden import USER_BANDWIDTH_WORDS  # noqa: E402

GOLDEN = json.loads((ROOT / "tests" / "data" / "scalesim_topology_golden.json").read_text())
TOPO_DIR = ROOT / "models" / "topologies"
SYSTOLIC = load_arch(ROOT / "arch_configs" / "systolic_32x32.yaml")
# SCALE-Sim USER: three DRAM links (ifmap, filter, ofmap) of USER_BANDWIDTH_WORDS words/cycle
# each; the systolic memory model gives each SRAM (spm line) an equal share of the DRAM's
USER_ARCH = dataclasses.replace(SYSTOLIC, dram=dataclasses.replace(
    SYSTOLIC.dram, bytes_per_cycle=3 * USER_BANDWIDTH_WORDS * SYSTOLIC.word_bytes,
    latency_cycles=0))

CASES = [(name, df, i) for name, f in GOLDEN["files"].items() for df in f["dataflows"]
         for i in range(len(f["dataflows"][df]["calc"]))]


def _ids(case):
    name, df, i = case
    return f"{name.removesuffix('.csv')}-{df}-{i}"


_RUNS: dict = {}


def _run(name, df, i, arch, tag):
    key = (name, df, i, tag)
    if key not in _RUNS:
        layer = read_topology(TOPO_DIR / name).layers[i]
        mod = conv if layer.kind == LayerKind.CONV2D else gemm
        rng = np.random.default_rng(i)
        x = rng.standard_normal(mod.input_shape(layer), dtype=np.float32)
        w = rng.standard_normal(mod.weight_shapes(layer)["weight"], dtype=np.float32)
        _RUNS[key] = runner_for(layer)(layer, [x], {"weight": w}, arch,
                                       RunOptions(dataflow=df))
    return _RUNS[key]


def test_golden_covers_conv_gemm_and_strided_layers():
    models = {n: read_topology(TOPO_DIR / n) for n in GOLDEN["files"]}
    assert {n.name for n in TOPO_DIR.glob("*.csv")} == set(models)
    kinds = {lay.kind for m in models.values() for lay in m.layers}
    assert kinds == {LayerKind.CONV2D, LayerKind.GEMM}
    # layers where SCALE-Sim's ceil sizing differs from floor((h - r) / stride) + 1
    odd = [lay for m in models.values() for lay in m.layers if lay.kind == LayerKind.CONV2D
           and (lay.size("h") - lay.size("r")) % lay.size("stride")]
    assert len(odd) >= 3
    assert GOLDEN["header"]["scalesim_version"] == "3.0.0"
    for f in GOLDEN["files"].values():
        assert set(f["dataflows"]) == {"os", "ws", "is"}


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_golden_is_the_im2col_gemm_closed_form(case):
    """SCALE-Sim's own cycles pin its conv sizing: M = ceil((h - r) / stride) + 1 squared."""
    name, df, i = case
    layer = read_topology(TOPO_DIR / name).layers[i]
    if layer.kind == LayerKind.CONV2D:
        oh, ow = conv.conv_shape(layer).out_hw
        m, n, k = oh * ow, layer.size("k"), layer.size("r") * layer.size("s") * layer.size("c")
    else:
        m, k, n = gemm.gemm_dims(layer)
    assert GOLDEN["files"][name]["dataflows"][df]["calc"][i]["total_cycles"] == \
        scalesim_compute_cycles(m, n, k, df, 32, 32)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_compute_cycles_equal_scalesim_calc(case):
    name, df, i = case
    run = _run(name, df, i, SYSTOLIC, "calc")
    gold = GOLDEN["files"][name]["dataflows"][df]["calc"][i]
    assert gold["stall_cycles"] == 0
    assert run.result.compute_cycles == gold["total_cycles"]
    assert run.result.values_match_reference is True


# ---- reading topology files: layers, sources, and one clear error per kind of bad input ----

def test_read_conv_and_gemm_files():
    m = read_topology(TOPO_DIR / "small_conv.csv")
    first = m.layers[0]
    assert (first.name, first.kind, first.op) == ("s1", LayerKind.CONV2D, "scalesim")
    assert dict(first.sizes) == {"h": 8, "w": 8, "r": 3, "s": 3, "c": 4, "k": 8, "stride": 1}
    assert first.source.endswith("small_conv.csv:2")
    g = read_topology(TOPO_DIR / "gemm_layers.csv").layers[1]
    assert (g.name, g.kind, dict(g.sizes)) == ("attn.qkv", LayerKind.GEMM,
                                               {"m": 64, "k": 128, "n": 384})
    assert g.source.endswith("gemm_layers.csv:3")


def test_header_variants_blank_lines_and_sparsity_column(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("Layer name, M, N, K, Sparsity,\n\nfc, 4, 5, 6, 1:1,\n")
    (layer,) = read_topology(p).layers
    assert dict(layer.sizes) == {"m": 4, "k": 6, "n": 5}
    assert layer.source == f"{p}:3"


def _bad(tmp_path, text, match):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(ModelError, match=match) as info:
        read_topology(p)
    assert str(p) in str(info.value)
    return str(info.value)


CONV_HEAD = ("Layer, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, "
             "Num Filter, Strides,\n")


def test_malformed_value_names_file_line_and_column(tmp_path):
    msg = _bad(tmp_path, CONV_HEAD + "a, 8, 8, 3, 3, 2, 4, 1,\nb, 8, x8, 3, 3, 2, 4, 1,\n",
               r"bad.csv:3:7: IFMAP Width must be an integer, got 'x8'")
    assert "line" not in msg  # file:line:column form, nothing else


def test_wrong_number_of_fields(tmp_path):
    _bad(tmp_path, CONV_HEAD + "a, 8, 8, 3, 3, 2, 4,\n", r"bad.csv:2:\d+: expected 8 fields")
    _bad(tmp_path, "Layer, M, N, K,\nfc, 1, 2, 3, 4, 5,\n", r"bad.csv:2:\d+: expected 4 fields")


def test_missing_trailing_comma(tmp_path):
    _bad(tmp_path, "Layer, M, N, K,\nfc, 1, 2, 3\n", r"bad.csv:2:12: .*does not end with a comma")


def test_unknown_layer_type(tmp_path):
    _bad(tmp_path, "Layer, Seq, Heads,\nattn, 4, 2,\n", r"bad.csv:1: unknown layer type")
    _bad(tmp_path, CONV_HEAD + "conv_DP1, 8, 8, 3, 3, 2, 4, 1,\n",
         r"bad.csv:2:1: unknown layer type: depthwise")


def test_shapes_that_do_not_agree(tmp_path):
    _bad(tmp_path, CONV_HEAD + "a, 8, 8, 9, 3, 2, 4, 1,\n",
         r"bad.csv:2:10: shapes do not agree: Filter Height 9 is larger than IFMAP Height 8")
    _bad(tmp_path, CONV_HEAD + "a, 8, 4, 3, 5, 2, 4, 1,\n",
         r"bad.csv:2:13: shapes do not agree: Filter Width 5 is larger than IFMAP Width 4")


def test_non_positive_stride_and_sizes(tmp_path):
    _bad(tmp_path, CONV_HEAD + "a, 8, 8, 3, 3, 2, 4, 0,\n", r"bad.csv:2:22: stride must be "
                                                             r"positive, got 0")
    _bad(tmp_path, CONV_HEAD + "a, 8, 8, 3, 3, 2, 4, -2,\n", r"stride must be positive, got -2")
    _bad(tmp_path, "Layer, M, N, K,\nfc, 0, 2, 3,\n", r"bad.csv:2:5: M must be positive")


def test_duplicate_names_empty_and_missing_files(tmp_path):
    _bad(tmp_path, "Layer, M, N, K,\nfc, 1, 2, 3,\nfc, 1, 2, 3,\n",
         r"bad.csv:3: layer name 'fc' is used twice")
    _bad(tmp_path, "", r"empty")
    _bad(tmp_path, "Layer, M, N, K,\n", r"no layers")
    with pytest.raises(ModelError, match="cannot read"):
        read_topology(tmp_path / "nope.csv")


# ---- USER bandwidth: SCALE-Sim's memory model (dataflow/pe_array/systolic_memory.py) ----

# the im2col matrix repeats ifmap pixels: the conv runner hands the memory model SCALE-Sim's
# addresses, which share them (GEMM addresses would thrash conv1-is's stationary ifmap window)
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_user_bandwidth_total_within_10_percent(case):
    name, df, i = case
    gold = GOLDEN["files"][name]["dataflows"][df]["user"][i]
    res = _run(name, df, i, USER_ARCH, "user").result
    assert abs(res.cycles / gold["total_cycles"] - 1) <= 0.10, (res.cycles, gold)


def _memory(name, df, i):
    mapping = _run(name, df, i, USER_ARCH, "user")
    res = mapping.result
    (note,) = [n for n in res.notes if n.startswith("SCALE-Sim memory")]
    return res, note


@pytest.mark.parametrize("case", CASES,
                         ids=_ids)
def test_user_bandwidth_incl_prefetch_and_stalls(case):
    """Every layer but the known gap: SCALE-Sim's stall count within 5 % of the run (exact on
    all but conv1), "Total Cycles (incl. prefetch)" within 2 %."""
    name, df, i = case
    gold = GOLDEN["files"][name]["dataflows"][df]["user"][i]
    res, note = _memory(name, df, i)
    incl = int(note.split("Total Cycles (incl. prefetch) ")[1].split(",")[0])
    assert abs(incl / gold["total_cycles_incl_prefetch"] - 1) <= 0.02, (incl, gold)
    assert abs(res.stall_cycles_dram - gold["stall_cycles"]) <= 0.05 * res.cycles
    assert res.cycles == res.compute_cycles + res.stall_cycles_dram
    if gold["stall_cycles"] == 0:  # the operands fit their SRAMs: fetched once, no stall
        assert res.stall_cycles_dram == 0
        assert res.cycles == gold["total_cycles"]
        assert incl == gold["total_cycles_incl_prefetch"]


def test_user_bandwidth_stalls_are_reported_on_both_sides():
    gold = GOLDEN["files"]["resnet18_conv1.csv"]["dataflows"]
    for df in ("os", "ws"):  # the ifmap-heavy conv1 stalls in SCALE-Sim at 10 words/cycle
        run = _run("resnet18_conv1.csv", df, 0, USER_ARCH, "user").result
        assert gold[df]["user"][0]["stall_cycles"] > 0
        assert run.stall_cycles["dram_bandwidth"] > 0
        assert run.cycles >= run.compute_cycles + run.stall_cycles_dram


@pytest.mark.parametrize("df", ["os", "ws", "is"])
def test_whole_topology_file_through_models_simulate(df):
    """`dataflow.models.simulate` on a topology file: every row runs (each on an input of its
    own shape) and each layer's compute cycles equal SCALE-Sim's measured Total Cycles."""
    name = "resnet18_stage2.csv"
    r = simulate_model(read_topology(TOPO_DIR / name), arch=SYSTOLIC, dataflow=df)
    gold = GOLDEN["files"][name]["dataflows"][df]["calc"]
    assert [lr.result.compute_cycles for lr in r.layers] == [g["total_cycles"] for g in gold]
    assert r.values_match_reference


@pytest.mark.parametrize("case", [c for c in CASES if not GOLDEN["files"][c[0]]["gemm"]],
                         ids=_ids)
def test_memory_model_with_scalesim_conv_addresses_is_exact(case):
    """Given SCALE-Sim's own im2col addresses (shared pixels), the memory model reproduces all
    three USER figures of every conv layer, conv1-is included: the one gap above is the
    addresses the runner path hands it (GEMM addresses), not the model."""
    name, df, i = case
    layer = read_topology(TOPO_DIR / name).layers[i]
    addr = scalesim_im2col_addresses(*(layer.size(x) for x in ("h", "w", "r", "s", "c",
                                                               "stride")))
    (sm,) = _mapping_of(addr.shape[0], layer.size("k"), addr.shape[1], df)
    mem = systolic_memory(sm, USER_ARCH, addr)
    gold = GOLDEN["files"][name]["dataflows"][df]["user"][i]
    assert (mem.total_cycles, mem.total_cycles_incl_prefetch, mem.stall_cycles) == \
        (gold["total_cycles"], gold["total_cycles_incl_prefetch"], gold["stall_cycles"])


def _mapping_of(m, n, k, df):
    a = np.zeros((m, k), dtype=np.float32)
    b = np.zeros((k, n), dtype=np.float32)
    return map_program(lower_matmul(as_tensor(a), as_tensor(b)), USER_ARCH,
                       dataflow=df).kernels


def test_cli_simulates_a_topology_file(tmp_path, capsys):
    name = "resnet18_stage2.csv"
    out_csv = tmp_path / "layers.csv"
    assert main(["simulate", "--topology", str(TOPO_DIR / name), "--arch", "systolic_32x32",
                 "--dataflow", "ws", "--json", "--csv", str(out_csv)]) == 0
    d = json.loads(capsys.readouterr().out)
    gold = GOLDEN["files"][name]["dataflows"]["ws"]["calc"]
    assert [la["compute_cycles"] for la in d["layers"]] == [g["total_cycles"] for g in gold]
    for la in d["layers"]:
        assert {"name", "cycles", "stall_cycles", "macs", "dram_bytes", "fraction_of_roofline",
                "values_match_reference"} <= set(la)
        assert 0 < la["fraction_of_roofline"] <= 1 and la["values_match_reference"]
    assert d["cycles"] == sum(la["cycles"] for la in d["layers"])
    assert out_csv.read_text().splitlines()[0].startswith("name,kind,cycles")
    assert main(["simulate", "--topology", str(TOPO_DIR / name), "--seq", "8"]) == 2
    assert "no size flags" in capsys.readouterr().err
