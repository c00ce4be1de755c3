"""Per-line store queues (`spm.write_queue_depth`): the rule, both engines, and the knob's
effect."""

from __future__ import annotations

import numpy as np
import pytest

import dataflow
from dataflow.arch import ArchError
from dataflow.mapper import map_program
from dataflow.pe_array.simulate import run_array
from dataflow.spm.lines import StoreQueues, port_cycles
from tests.archs import variant
from tests.test_engines import _gemm, _spmm


def test_depth_zero_is_the_port_rule_and_a_queue_absorbs_bursts():
    spm = variant(**{"spm.lines": 4}).spm
    rng = np.random.default_rng(0)
    rd = rng.integers(0, 4, size=(200, 4))
    wr = rng.integers(0, 3, size=(200, 4))
    sq = StoreQueues(spm)
    got = [sq.cycle(rd[t], wr[t])[0] for t in range(200)]
    assert got == list((port_cycles(rd, wr, spm) - 1).max(axis=1))  # depth 0: the old rule
    assert sq.drain()[0] == 0
    # a burst of 3 stores on one line, then idle cycles: depth 2 absorbs it, depth 0 stalls 2
    deep = StoreQueues(variant(**{"spm.lines": 4, "spm.write_queue_depth": 2}).spm)
    burst = np.array([0, 0, 3, 0])
    assert deep.cycle(np.zeros(4, np.int64), burst)[0] == 0
    assert list(deep.q) == [0, 0, 2, 0]
    for _ in range(2):
        deep.cycle(np.zeros(4, np.int64), np.zeros(4, np.int64))
    assert deep.drain()[0] == 0  # drained by the idle cycles
    # overflow: 5 stores into depth 2 -> 1 retired, 4 queued, 2 over the depth -> 2 stall cycles
    over = StoreQueues(variant(**{"spm.lines": 4, "spm.write_queue_depth": 2}).spm)
    assert over.cycle(np.zeros(4, np.int64), np.array([5, 0, 0, 0]))[0] == 2
    assert over.drain()[0] == 2


def test_negative_depth_is_rejected():
    with pytest.raises(ArchError, match=r"spm\.write_queue_depth"):
        variant(**{"spm.write_queue_depth": -1})


@pytest.mark.parametrize("depth", [1, 4])
@pytest.mark.parametrize("case", ["gemm", "spmm"])
def test_engines_identical_with_store_queues(depth, case):
    arch = variant(**{"spm.write_queue_depth": depth, "pe_array.rows": 4, "pe_array.cols": 4,
                      "spm.lines": 2})
    prog, _ = _gemm(9, 4, 13, 1) if case == "gemm" else _spmm(16, 12, 8, 0.3, 2)
    mapping = map_program(prog, arch)
    fast, ref = run_array(mapping, "fast"), run_array(mapping, "reference")
    for f, r in zip(fast, ref):
        assert f.same_as(r) == []


def test_a_deeper_store_queue_never_costs_cycles_and_keeps_values():
    kw = dict(pattern="dense", seq=64, dim=32)
    res = [dataflow.simulate("attention", arch=variant(**{"spm.write_queue_depth": d}), **kw)
           for d in (0, 2, 8)]
    assert all(r.values_match_reference for r in res)
    stalls = [r.stall_cycles_spm_conflict for r in res]
    assert stalls[0] >= stalls[1] >= stalls[2] and stalls[2] < stalls[0]
