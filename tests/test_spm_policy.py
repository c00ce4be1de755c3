"""The `xor` SPM address policy: the line hashing, its validation, and its effect on conflicts."""

from __future__ import annotations

import numpy as np
import pytest

import dataflow
from dataflow.arch import ArchError
from dataflow.spm.lines import line_of_row
from tests.archs import variant


def test_xor_lines_are_a_permutation_of_each_block_and_spread_power_of_two_strides():
    spm = variant(**{"spm.address_mapping": "xor"}).spm
    rows = np.arange(spm.lines * spm.lines * 4)
    lines = line_of_row(rows, spm)
    # every aligned block of `lines` rows still covers every line once (no capacity lost)
    for blk in lines.reshape(-1, spm.lines):
        assert sorted(blk) == list(range(spm.lines))
    # rows a multiple of `lines` apart all hit line 0 when interleaved, but spread under xor
    strided = np.arange(spm.lines) * spm.lines
    assert len(set(line_of_row(strided, variant().spm).tolist())) == 1
    assert len(set(line_of_row(strided, spm).tolist())) == spm.lines
    # scalar and array forms agree
    assert all(int(line_of_row(int(r), spm)) == int(x) for r, x in zip(rows[:50], lines[:50]))


def test_xor_needs_power_of_two_lines():
    with pytest.raises(ArchError, match=r"spm\.address_mapping.*power-of-two"):
        variant(**{"spm.address_mapping": "xor", "spm.lines": 12})


def test_xor_policy_cuts_conflicts_of_strided_streams_with_the_same_values():
    kw = dict(pattern="dense", seq=64, dim=32)
    inter = dataflow.simulate("attention", arch=variant(), **kw)
    xor = dataflow.simulate("attention", arch=variant(**{"spm.address_mapping": "xor"}), **kw)
    assert inter.values_match_reference and xor.values_match_reference
    # the compiler may block the scores' lane sums differently per policy (another sum
    # order, docs/conventions.md#sparse-line-model): equal up to fp32 tolerances
    np.testing.assert_allclose(inter.output, xor.output, rtol=1e-5, atol=1e-5)
    # the line-aware copy delays and the measured schedule choice
    # (docs/conventions.md#sparse-line-model) spread part of the interleaved policy's strided
    # streams in software (7528 conflict cycles before them, 2616 now); the hash still cuts
    # a third of the rest
    assert xor.spm_conflict_cycles < 0.7 * inter.spm_conflict_cycles
    assert xor.cycles <= inter.cycles
