"""Mixture of experts: routing, values vs the numpy reference, load imbalance in the timeline,
placements, errors, the timeline drawing and the CLI."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from dataflow.moe import draw_timeline, make_moe_operands, moe_reference, route, simulate_moe
from dataflow.moe.gating import gate_logits
from dataflow.testing import assert_close


def test_route_top_k_and_dispatch_order():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((50, 6))
    r = route(logits, 2)
    for t in range(50):  # brute force: the two largest logits, larger first
        assert list(r.expert[t]) == list(np.argsort(-logits[t])[:2])
        sel = logits[t, r.expert[t]]
        assert_close(r.gate[t], np.exp(sel) / np.exp(sel).sum())
    assert r.offsets[-1] == 100 and np.array_equal(r.tokens_per_expert,
                                                   np.bincount(r.expert.ravel(), minlength=6))
    for e in range(6):  # rows of expert e hold exactly its tokens, ascending
        rows = r.token_of_row[r.offsets[e]:r.offsets[e + 1]]
        assert np.array_equal(rows, np.flatnonzero((r.expert == e).any(axis=1)))
    # row_of points back at the token
    assert np.array_equal(r.token_of_row[r.row_of], np.repeat(np.arange(50)[:, None], 2, axis=1))


@pytest.fixture(scope="module")
def runs(default_arch):
    """Balanced-ish (skew 0) and skewed routing, every placement; 4 experts, top-2."""
    out = {}
    for skew in (0.0, 4.0):
        ops = make_moe_operands(4, 64, 16, 16, skew, seed=1)
        for placement in ("grouped", "parallel", "sequential"):
            out[skew, placement] = (ops, *simulate_moe(*ops, 2, default_arch, placement=placement))
    return out


@pytest.mark.parametrize("placement", ("grouped", "parallel", "sequential"))
@pytest.mark.parametrize("skew", (0.0, 4.0))
def test_values_equal_numpy(runs, skew, placement):
    ops, res, _ = runs[skew, placement]
    assert res.values_match_reference
    assert_close(res.output, moe_reference(*ops, 2), dtype=np.float32)


def test_engine_logits_give_the_same_top_k(default_arch):
    """The gate kernel's logits (engine arithmetic) route every token as the host does."""
    from dataflow.mapper import map_program
    from dataflow.moe.lower import front_program
    from dataflow.pe_array.simulate import run_array

    x, wg, bias, _ = make_moe_operands(4, 32, 16, 8, 0.0, seed=2)
    r = route(gate_logits(x, wg, bias), 2)
    arrays = run_array(map_program(front_program(x, wg, r), default_arch))
    logits = dict(arrays[0].outputs)["logits"].reshape(32, 4) + bias
    assert np.array_equal(route(logits, 2).expert, r.expert)
    xd = dict(arrays[1].outputs)["Xd"].reshape(-1, 16)
    assert np.array_equal(xd, x[r.token_of_row])  # dispatch is a pure copy


def test_skewed_routing_makes_the_busiest_expert_longest(runs):
    _, res, routing = runs[4.0, "parallel"]
    n = routing.tokens_per_expert
    spans = {k.kernel: k.end_cycle - k.start_cycle for k in res.kernels}
    busiest = f"expert{int(np.argmax(n))}"
    experts = {k: v for k, v in spans.items() if k.startswith("expert")}
    assert max(experts, key=experts.get) == busiest
    assert n.max() >= 2 * n.mean()  # the skew really skews


def test_parallel_total_is_front_plus_busiest_expert_plus_combine(runs):
    for skew in (0.0, 4.0):
        _, res, routing = runs[skew, "parallel"]
        ks = {k.kernel: k for k in res.kernels}
        experts = [k for k in res.kernels if k.kernel.startswith("expert")]
        assert len(experts) == int(np.count_nonzero(routing.tokens_per_expert))
        start = {k.start_cycle for k in experts}
        assert len(start) == 1  # side by side: all start when dispatch's program is done
        assert start.pop() >= ks["dispatch"].end_cycle
        # combine waits for the slowest expert, whose region's program ends at its kernel's end
        # plus the write-back tail
        slowest = max(k.end_cycle for k in experts)
        assert ks["combine"].start_cycle >= slowest
        assert res.cycles >= ks["combine"].end_cycle
    balanced = runs[0.0, "parallel"][1]
    skewed = runs[4.0, "parallel"][1]
    assert skewed.cycles > balanced.cycles  # the same work, worse spread, longer layer


def test_sequential_total_is_the_sum_of_kernels(runs):
    _, res, _ = runs[4.0, "sequential"]
    ks = res.kernels
    assert all(a.end_cycle == b.start_cycle for a, b in itertools.pairwise(ks))
    assert [k.kernel for k in ks][:2] == ["gate", "dispatch"] and ks[-1].kernel == "combine"


def test_grouped_is_one_kernel_for_all_experts_and_the_fastest(runs):
    for skew in (0.0, 4.0):
        _, res, _ = runs[skew, "grouped"]
        assert [k.kernel for k in res.kernels] == ["gate", "experts", "combine"]
        assert all(a.end_cycle == b.start_cycle for a, b in itertools.pairwise(res.kernels))
        assert res.cycles >= res.roofline_cycles
        # the same floors as the other placements (the layer's), fewer cycles than either
        for other in ("parallel", "sequential"):
            assert res.roofline_cycles == runs[skew, other][1].roofline_cycles
            assert res.cycles < runs[skew, other][1].cycles


def test_grouped_rows_are_padded_per_expert_and_map_back():
    from dataflow.moe.grouped import padded_rows

    x, wg, bias, _ = make_moe_operands(4, 32, 8, 8, 2.0, seed=3)
    routing = route(gate_logits(x, wg, bias), 2)
    panels, token, where = padded_rows(routing, 4)
    assert np.array_equal(np.diff(panels), -(-routing.tokens_per_expert // 4))
    assert len(token) == panels[-1] * 4
    assert np.array_equal(token[where], routing.token_of_row)  # every row keeps its token
    assert len(set(where.tolist())) == len(where)
    for e in range(4):  # each expert's rows inside its own panels
        lo, hi = routing.offsets[e], routing.offsets[e + 1]
        assert np.all((where[lo:hi] >= panels[e] * 4) & (where[lo:hi] < panels[e + 1] * 4))


def test_grouped_engines_agree_and_an_empty_expert_is_skipped(default_arch):
    from dataflow.moe.gating import route
    from dataflow.moe.grouped import grouped_program
    from dataflow.plan.compile import compile_program
    from tests.engine_checks import assert_engines_identical

    x, wg, bias, w = make_moe_operands(4, 8, 8, 8, 8.0, seed=2)
    routing = route(gate_logits(x, wg, bias), 1)
    assert 0 in routing.tokens_per_expert  # the skew leaves an expert without tokens
    res = assert_engines_identical(compile_program(grouped_program(x, wg, w, routing),
                                                   default_arch))
    assert_close(res.output, moe_reference(x, wg, bias, w, 1), dtype=np.float32)


@pytest.mark.parametrize("params, message", [
    ({"experts": 4, "top_k": 5}, r"--top-k \(5\) cannot exceed --experts \(4\)"),
    ({"experts": 3, "placement": "parallel"}, "split the 8x8 PE array"),
    ({"skew": -1.0}, "--skew must be >= 0"),
    ({"tokens": 0}, "--tokens must be a positive integer"),
])
def test_bad_parameters(default_arch, params, message):
    import dataflow

    with pytest.raises(ValueError, match=message):
        dataflow.simulate("moe", arch=default_arch,
                          **{"tokens": 16, "dim": 8, "hidden": 8, **params})


def test_odd_expert_count_runs_sequentially(default_arch):
    import dataflow

    res = dataflow.simulate("moe", arch=default_arch, experts=3, top_k=1, tokens=16, dim=8,
                            hidden=8, placement="sequential")
    assert res.values_match_reference
    from dataflow.pe_array.simulate import area_breakdown

    assert dict(res.area_mm2) == area_breakdown(default_arch)  # area like every workload's
    assert res.dram_bytes_per_cycle == default_arch.dram.bytes_per_cycle  # for rooflines


def test_draw_timeline_has_a_bar_per_kernel(runs):
    import matplotlib

    matplotlib.use("Agg")
    _, res, _ = runs[4.0, "parallel"]
    ax = draw_timeline(res)
    bars = ax.patches
    assert len(bars) == len(res.kernels)
    assert [b.get_x() for b in bars] == [k.start_cycle for k in res.kernels]
    assert [b.get_width() for b in bars] == [k.end_cycle - k.start_cycle for k in res.kernels]


def test_cli_moe(capsys):
    from dataflow.cli import main

    rc = main(["simulate", "--workload", "moe", "--experts", "4", "--top-k", "2", "--tokens", "32",
               "--dim", "8", "--hidden", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["values_match_reference"]
    assert [k["kernel"] for k in out["kernels"]] == ["gate", "experts", "combine"]
    assert main(["simulate", "--workload", "moe", "--experts", "2", "--top-k", "3"]) == 2
    assert "--top-k (3) cannot exceed --experts (2)" in capsys.readouterr().err
