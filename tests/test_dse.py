"""DSE without running sweeps: sweep-file validation, ranges, point ids, area, Pareto sorting."""

from __future__ import annotations

import hashlib
import textwrap

import numpy as np
import pytest

import dataflow
from dataflow.cli import main
from dataflow.dse.evaluate import area_breakdown_mm2, evaluate_point
from dataflow.dse.pareto import nondominated_ranks, pareto_mask, rank_rows
from dataflow.dse.points import canonical_json, grid_points
from dataflow.dse.sweep import SweepError, expand_values, load_sweep
from dataflow.models import simulate as simulate_model
from dataflow.models.topology import read_topology
from tests.conftest import ARCH_DIR, ROOT

GOOD = """
name: t
arch:
  base: default
  sweep:
    spm.lines: [4, 8]
  zip:
    - {pe_array.rows: [4, 8], pe_array.cols: [4, 8]}
workloads:
  - {name: gemm, params: {m: 32, k: 32, n: [16, 32]}}
"""


def write(tmp_path, text: str, name: str = "sweep.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path, text: str) -> SweepError:
    path = write(tmp_path, text)
    with pytest.raises(SweepError) as info:
        grid_points(load_sweep(path))
    assert str(path) in str(info.value), "the error must name the sweep file"
    return info.value


BAD = {
    "unknown ArchSpec key": (
        GOOD.replace("spm.lines: [4, 8]", "pe_array.rowz: [4, 8]"),
        "arch.sweep.pe_array.rowz", "unknown ArchSpec key 'rowz' at pe_array"),
    "unknown section key": (
        GOOD.replace("spm.lines: [4, 8]", "spn.lines: [4, 8]"),
        "arch.sweep.spn.lines", "unknown ArchSpec key 'spn'"),
    "range with step 0": (
        GOOD.replace("spm.lines: [4, 8]", "spm.lines: {start: 4, stop: 16, step: 0}"),
        "arch.sweep.spm.lines.step", "step must not be 0"),
    "range that never arrives": (
        GOOD.replace("spm.lines: [4, 8]", "spm.lines: {start: 4, stop: 16, step: -2}"),
        "arch.sweep.spm.lines.step", "never gets from 4 to 16"),
    "unknown range key": (
        GOOD.replace("spm.lines: [4, 8]", "spm.lines: {start: 4, end: 16}"),
        "arch.sweep.spm.lines.end", "unknown range key"),
    "wrong value type": (
        GOOD.replace("spm.lines: [4, 8]", "spm.lines: [4, four]"),
        "arch.sweep.spm.lines", "value 'four': expected an integer"),
    "impossible value on its own": (
        GOOD.replace("spm.lines: [4, 8]", "spm.lines: [0, 8]"),
        "arch.sweep.spm.lines", "value 0: must be > 0"),
    "impossible combination": (
        GOOD.replace("spm.lines: [4, 8]", "pe_array.simd_lanes: [8, 16]"),
        "arch.sweep.pe_array.simd_lanes", "is impossible: spm.words_per_row"),
    "unknown workload": (
        GOOD.replace("name: gemm", "name: gemmm"), "workloads[0].name", "unknown workload 'gemmm'"),
    "unknown workload param": (
        GOOD.replace("m: 32,", "q: 32,"), "workloads[0].params.q", "has no parameter 'q'"),
    "non-integer size": (
        GOOD.replace("m: 32,", "m: 32.5,"), "workloads[0].params.m", "not a valid 'm'"),
    "zip of unequal lengths": (
        GOOD.replace("pe_array.cols: [4, 8]", "pe_array.cols: [4, 8, 16]"),
        "arch.zip[0]", "the same number of values"),
    "key swept twice": (
        GOOD.replace("spm.lines: [4, 8]", "pe_array.rows: [4, 8]"),
        "arch.zip[0].pe_array.rows", "already swept at arch.sweep.pe_array.rows"),
    "list field given scalars": (
        GOOD.replace("spm.lines: [4, 8]", "interconnect.skip_hop_strides: [2, 3]"),
        "arch.sweep.interconnect.skip_hop_strides", "give a list of lists"),
    "value listed twice": (
        GOOD.replace("spm.lines: [4, 8]", "spm.lines: [4, 4]"),
        "arch.sweep.spm.lines", "listed twice"),
    "mapping option no workload takes": (
        GOOD + "mapping: {tile: [1, 2]}\n", "mapping.tile", "no workload in this sweep takes"),
    "unknown engine": (
        GOOD + "mapping: {engine: turbo}\n", "mapping.engine", "must be one of"),
    "unknown top-level key": (GOOD + "sweeps: 1\n", "sweeps", "unknown key"),
    "unknown objective": (
        GOOD + "search: {objectives: [cycles, speed]}\n", "search.objectives", "unknown metric"),
    "missing base file": (
        GOOD.replace("base: default", "base: nowhere.yaml"), "arch.base", "no architecture file"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sweep_files_name_file_and_key_path(tmp_path, case):
    text, key_path, words = BAD[case]
    err = error_of(tmp_path, text)
    assert err.key_path == key_path, str(err)
    assert words in str(err), str(err)


def test_cli_reports_a_bad_sweep_as_one_line(tmp_path, capsys):
    path = write(tmp_path, GOOD.replace("spm.lines: [4, 8]",
                                        "spm.lines: {start: 4, stop: 8, step: 0}"))
    assert main(["sweep", str(path), "--out", str(tmp_path / "r.db"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{path}: arch.sweep.spm.lines.step: step must not be 0" in err


def test_skip_impossible_drops_only_impossible_combinations(tmp_path):
    text = GOOD.replace("spm.lines: [4, 8]", "pe_array.simd_lanes: [8, 16]").replace(
        "base: default", "base: default\n  skip_impossible: true")
    grid = grid_points(load_sweep(write(tmp_path, text)))
    # simd_lanes 16 needs 16-word SPM rows (default: 8): both array sizes with 16 lanes dropped
    assert grid.impossible_archs == 2
    assert len(grid.points) == 2 * 2
    assert {dict(p.arch_overrides)["pe_array.simd_lanes"] for p in grid.points} == {8}


@pytest.mark.parametrize("spec, values", [
    ({"start": 4, "stop": 16, "step": 4}, (4, 8, 12, 16)),
    ({"start": 4, "stop": 15, "step": 4}, (4, 8, 12)),
    ({"start": 16, "stop": 4, "step": -6}, (16, 10, 4)),
    ({"start": 0.1, "stop": 0.5, "step": 0.1}, (0.1, 0.2, 0.3, 0.4, 0.5)),
    ({"start": 2, "stop": 64, "scale": "log2"}, (2, 4, 8, 16, 32, 64)),
    ({"start": 3, "stop": 20, "scale": "log2"}, (3, 6, 12)),
    (7, (7,)),
    ([1, 2.5], (1, 2.5)),
])
def test_ranges_and_lists(spec, values):
    got = expand_values(spec, "s.yaml", "k")
    assert got == values
    assert [type(v) for v in got] == [type(v) for v in values]


def test_point_ids_are_hashes_of_canonical_json_and_stable(tmp_path):
    a = grid_points(load_sweep(write(tmp_path, GOOD, "a.yaml"))).points
    # the same design space written in another order, with ranges instead of lists
    b_text = """
    workloads:
      - {params: {n: {start: 16, stop: 32, step: 16}, k: 32, m: 32}, name: gemm}
    arch:
      zip:
        - {pe_array.cols: [4, 8], pe_array.rows: [4, 8]}
      sweep:
        spm.lines: {start: 4, stop: 8, scale: log2}
      base: ../../""" + str(ARCH_DIR / "default.yaml") + "\n"
    b = grid_points(load_sweep(write(tmp_path, b_text.replace("../../", ""), "b.yaml"))).points
    assert len(a) == 8 and len({p.point_id for p in a}) == 8
    assert {p.point_id for p in a} == {p.point_id for p in b}
    for p in a:
        assert p.point_id == hashlib.sha256(canonical_json(p.canonical()).encode()).hexdigest()[:16]
        assert p.canonical()["params"]["density"] == 0.05  # defaults are part of the identity
    # a change of the base architecture outside the swept keys is a different design
    c = grid_points(load_sweep(write(tmp_path, GOOD.replace(
        "base: default", "base: default\n  set: {dram.latency_cycles: 50}"), "c.yaml"))).points
    assert not {p.point_id for p in a} & {p.point_id for p in c}


def test_mapping_options_reach_only_workloads_that_take_them(tmp_path):
    text = """
    arch: {base: systolic_32x32}
    workloads: [{name: gemm, params: {m: 32, k: 32, n: 32}}]
    mapping: {dataflow: [os, ws], seed: [0, 1]}
    """
    points = grid_points(load_sweep(write(tmp_path, text))).points
    assert sorted((dict(p.options)["dataflow"], p.seed) for p in points) == [
        ("os", 0), ("os", 1), ("ws", 0), ("ws", 1)]
    assert len({p.group() for p in points}) == 1  # mapping choices share one Pareto group


def test_area_is_the_simulators_area_model(default_arch):
    from dataflow.arch import arch_to_dict

    area = area_breakdown_mm2(arch_to_dict(default_arch))
    pes, lines, t = 8 * 8, 16, default_arch.area
    ports = default_arch.spm.read_ports_per_line + default_arch.spm.write_ports_per_line
    assert area == pytest.approx({"pe_array": pes * t.pe_mm2,
                                  "spm": lines * t.spm_line_mm2 * ports / 2,
                                  "interconnect": pes * t.router_mm2})
    r = dataflow.simulate("gemm", arch=default_arch, m=8, k=8, n=8)
    assert dict(r.area_mm2) == pytest.approx(area)


# ---------------------------------------------------------------- Pareto sorting

def brute_dominates(a, b) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


@pytest.mark.parametrize("seed", range(6))
def test_pareto_mask_and_ranks_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    d = 2 + seed % 2
    y = rng.integers(0, 6, size=(80, d)).astype(float)  # small range: ties and duplicates
    y[5] = y[6]
    mask = pareto_mask(y)
    brute = [not any(brute_dominates(y[j], y[i]) for j in range(len(y))) for i in range(len(y))]
    assert mask.tolist() == brute
    ranks = nondominated_ranks(y)
    for i in range(len(y)):
        dominators = [ranks[j] for j in range(len(y)) if brute_dominates(y[j], y[i])]
        # rank r: dominated by someone of rank r-1, by no one of rank >= r
        assert (ranks[i] == 0) == (not dominators)
        if dominators:
            assert max(dominators) == ranks[i] - 1


def test_rank_rows_groups_failures_and_maximised_metrics():
    rows = [
        {"point_id": "a", "group": "g", "status": "ok", "cycles": 10, "pe_utilization": 0.5},
        {"point_id": "b", "group": "g", "status": "ok", "cycles": 20, "pe_utilization": 0.9},
        {"point_id": "c", "group": "g", "status": "ok", "cycles": 20, "pe_utilization": 0.4},
        {"point_id": "d", "group": "h", "status": "ok", "cycles": 99, "pe_utilization": 0.1},
        {"point_id": "e", "group": "g", "status": "failed", "cycles": None, "pe_utilization": None},
    ]
    got = {r["point_id"]: r["pareto_rank"] for r in rank_rows(rows, ["cycles", "utilisation"])}
    # utilisation is maximised: c (slower and less busy than b) is dominated; d alone in its group
    assert got == {"a": 0, "b": 0, "c": 1, "d": 0, "e": None}
    merged = {r["point_id"]: r["pareto_rank"]
              for r in rank_rows(rows, ["cycles", "pe_utilization"], group_by="none")}
    assert merged["d"] == 2  # merged with g: dominated by c (rank 1), which a and b dominate


def test_example_sweeps_are_valid():
    paths = sorted((ROOT / "examples").glob("*sweep*.yaml"))
    assert len(paths) >= 2
    for path in paths:
        grid = grid_points(load_sweep(path))
        assert grid.points


def test_every_registered_workload_can_be_swept(tmp_path):
    """Sweeps take workloads from the registry, whatever module registered them."""
    from dataflow.workloads import workloads

    for name, w in workloads().items():
        path = write(tmp_path, f"arch: {{sweep: {{spm.lines: [8, 16]}}}}\nworkloads: [{name}]\n",
                     f"{name}.yaml")
        points = grid_points(load_sweep(path)).points
        assert len(points) == 2 and {p.workload for p in points} == {name}
        assert dict(points[0].params) == w.resolve({})  # every default is part of the point


# ---------------------------------------------------------------- whole models as workloads

MODEL_SWEEP = f"""
name: m
arch: {{base: default, sweep: {{spm.lines: [8, 16]}}}}
workloads:
  - {{model: {ROOT / "models" / "bert_base_layer.yaml"},
     params: {{seq: 8, hidden: 16, heads: 2, ffn: 32}}}}
"""


def test_a_model_workload_sweeps_and_stores_the_models_metrics(tmp_path):
    from dataflow.arch import arch_from_dict
    from dataflow.dse.evaluate import evaluate_point
    from dataflow.models import simulate as simulate_model
    from dataflow.pe_array.simulate import area_breakdown

    sweep = load_sweep(write(tmp_path, MODEL_SWEEP))
    points = grid_points(sweep).points
    assert len(points) == 2 and len({p.point_id for p in points}) == 2
    assert {p.workload for p in points} == {f"model:{ROOT / 'models' / 'bert_base_layer.yaml'}"}
    assert points[0].group() == points[1].group()
    assert "seq=8" in points[0].group()
    for p in points:
        rec = evaluate_point(p.payload())
        assert rec["status"] == "ok", rec.get("error")
        arch = arch_from_dict(p.canonical()["arch"])
        r = simulate_model(ROOT / "models" / "bert_base_layer.yaml", arch=arch, seq=8,
                           hidden=16, heads=2, ffn=32)
        layers = [lr.result for lr in r.layers]
        assert rec["cycles"] == r.cycles == sum(x.cycles for x in layers)
        assert rec["energy_pj"] == pytest.approx(r.energy_total_pj)
        assert rec["dram_bytes"] == r.dram_bytes
        assert rec["area_mm2"] == pytest.approx(sum(area_breakdown(arch).values()))
        busy = sum(float(x.pe_busy_cycles.sum()) for x in layers)
        assert rec["pe_utilization"] == pytest.approx(busy / (arch.pe_array.rows
                                                             * arch.pe_array.cols * r.cycles))
        assert 0 < rec["pe_utilization"] <= 1 and rec["values_match"] is True
        assert [la["name"] for la in rec["result"]["layers"]] == [lr.layer.name
                                                                 for lr in r.layers]


def test_model_point_ids_hold_the_layers_not_the_path(tmp_path):
    import shutil

    a = grid_points(load_sweep(write(tmp_path, MODEL_SWEEP, "a.yaml"))).points
    copy = tmp_path / "bert.yaml"
    shutil.copy(ROOT / "models" / "bert_base_layer.yaml", copy)
    b_text = MODEL_SWEEP.replace(str(ROOT / "models" / "bert_base_layer.yaml"), "bert.yaml")
    b = grid_points(load_sweep(write(tmp_path, b_text, "b.yaml"))).points
    assert {p.point_id for p in a} == {p.point_id for p in b}  # same model, another place
    c = grid_points(load_sweep(write(tmp_path, MODEL_SWEEP.replace("seq: 8", "seq: [8, 16]"),
                                     "c.yaml"))).points
    assert len(c) == 4 and {p.point_id for p in a} < {p.point_id for p in c}


@pytest.mark.parametrize(("entry", "where", "message"), [
    ("{model: nowhere.yaml}", "workloads[0].model", "no model file 'nowhere.yaml'"),
    ("{model: MODEL, params: {sq: 8}}", "workloads[0].params.sq",
     "has no parameter 'sq'; it takes: seq, hidden"),
    ("{model: MODEL, params: {seq: 0}}", "workloads[0].params", "must be a positive integer"),
    ("{model: MODEL, params: {attention_pattern: diagonal}}",
     "workloads[0].params.attention_pattern", "must be one of"),
    ("{model: MODEL, name: gemm}", "workloads[0]", "exactly one of name, model, topology"),
])
def test_bad_model_workloads_name_the_key_path(tmp_path, entry, where, message):
    entry = entry.replace("MODEL", str(ROOT / "models" / "bert_base_layer.yaml"))
    err = error_of(tmp_path, f"arch: {{base: default}}\nworkloads: [{entry}]\n")
    assert err.key_path == where and message in str(err), str(err)


def test_a_topology_workload_sweeps_on_the_systolic_preset(tmp_path):
    topo = tmp_path / "t.csv"
    topo.write_text("Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, "
                    "Channels, Num Filter, Strides,\nc1, 8, 8, 3, 3, 2, 4, 1,\n")
    text = f"arch: {{base: systolic_32x32}}\nworkloads: [{{topology: {topo}}}]\n"
    points = grid_points(load_sweep(write(tmp_path, text))).points
    assert len(points) == 1 and points[0].workload == f"topology:{topo}"
    rec = evaluate_point(points[0].payload())
    assert rec["status"] == "ok", rec.get("error")
    direct = simulate_model(read_topology(topo), arch="systolic_32x32")
    assert rec["cycles"] == direct.cycles > 0 and rec["values_match"] is True
