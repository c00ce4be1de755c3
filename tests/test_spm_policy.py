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


def _plain_attention(arch):
    """Dense attention (seq 64, d 32) mapped as lowered: no schedule search, no line-aware
    delays, so the address policy alone decides which line each strided stream hits."""
    from dataflow.attention.api import make_inputs
    from dataflow.attention.op import SparseAttention
    from dataflow.mapper import map_program
    from dataflow.pe_array.simulate import simulate_mapping

    x = make_inputs("dense", 64, 32)
    prog = SparseAttention(x["q"], x["k"], x["v"], x["pos"], x["crd"])._lower()
    return simulate_mapping(map_program(prog, arch))


def test_xor_policy_cuts_conflicts_of_strided_streams_with_the_same_values():
    xor_arch = variant(**{"spm.address_mapping": "xor"})
    inter, xor = _plain_attention(variant()), _plain_attention(xor_arch)
    # the hash in hardware spreads the strided streams the interleaved policy puts on a line
    assert xor.spm_conflict_cycles < inter.spm_conflict_cycles
    np.testing.assert_array_equal(inter.output, xor.output)  # the policy moves no value
    # through the compiler (which also spreads them in software, by line-aware copy delays,
    # docs/conventions.md#sparse-line-model) both still compute attention; the compiler may
    # block the lane sums differently per policy (another sum order): fp32 tolerances
    kw = dict(pattern="dense", seq=64, dim=32)
    c_inter = dataflow.simulate("attention", arch=variant(), **kw)
    c_xor = dataflow.simulate("attention", arch=xor_arch, **kw)
    assert c_inter.values_match_reference and c_xor.values_match_reference
    np.testing.assert_allclose(c_inter.output, c_xor.output, rtol=1e-5, atol=1e-5)
