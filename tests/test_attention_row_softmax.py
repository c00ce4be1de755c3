"""The CSR attention's row-body softmax (docs/conventions.md#row-softmax): a mask whose rows
all attend the same number of keys (butterfly, N:M) runs the scores (with lane-select sums on
an array without vsum: no lane partials through DRAM), one softmax kernel that takes a whole
row per iteration (the row maximum a tree of `max`, no max levels, the probabilities
normalised) and the CSR SpMM, S and P handed over in the SPM. Values equal numpy (fast engine;
the reference stepper on a small case), cycles stay above the roofline, the default lowering
takes it by itself (on `default.yaml` too), and on `mlx_4x4` it moves fewer DRAM bytes in
fewer cycles than the CSR program with the max levels it replaces."""

import numpy as np
import pytest

from dataflow.arch import resolve_arch
from dataflow.attention import sparse_attention
from dataflow.attention.api import make_inputs, mask_csr
from dataflow.attention.lower import lower_attention
from dataflow.attention.op import SparseAttention
from dataflow.attention.reference import attention_reference
from dataflow.attention.row_softmax import MAX_ROW_WIDTH, row_softmax_kernel, row_width
from dataflow.dfg.graph import BufferFetch
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan.compile import compile_program
from dataflow.testing import assert_close
from tests.archs import variant
from tests.engine_checks import assert_engines_identical

DEFAULT = resolve_arch("arch_configs/default.yaml")
MLX = resolve_arch("arch_configs/mlx_4x4.yaml")


def _inputs(pattern, seq, dim, seed=0, **kw):
    x = make_inputs(pattern, seq, dim, seed, **kw)
    return x, attention_reference(x["q"], x["k"], x["v"], x["pos"], x["crd"])


def _run(x, arch, lowering="default"):
    return sparse_attention(x["q"], x["k"], x["v"], pattern=x["pattern"], backend="sim",
                            arch=arch, return_result=True, lowering=lowering, cache=False)


def test_row_width():
    assert row_width(np.array([0, 3, 6, 9])) == 3
    assert row_width(np.array([0, 3, 5, 9])) is None  # rows of different widths
    assert row_width(np.array([0, 1, 2])) is None  # one key a row: nothing to reduce
    wide = MAX_ROW_WIDTH + 1
    assert row_width(np.arange(4) * wide) is None
    x = make_inputs("butterfly", 256, 8)
    assert row_width(x["pos"]) == 9  # the key itself and one per power-of-two stride


@pytest.mark.parametrize("seq, dim, seed", [(64, 16, 0), (128, 24, 1), (256, 8, 2)])
def test_butterfly_row_softmax_values_equal_numpy(seq, dim, seed):
    x, ref = _inputs("butterfly", seq, dim, seed)
    out, res = _run(x, MLX)
    assert "csr lowering" in res.notes[-1]
    names = {kr.kernel for kr in res.kernels}
    assert "softmax" in names and not any(n.startswith("softmax_max") for n in names)
    # one SIMD chunk (dim 8) is no reduction for lane-select sums: the lane partials stay
    assert ("sddmm.lanes" in names) == (dim <= 8)
    assert_close(out, ref)
    assert res.values_match_reference
    assert res.cycles >= res.roofline_cycles


def test_nm_rows_of_one_width_values_equal_numpy():
    """N:M at 2:16 (seq 64): 8 keys in every row, chosen at random per group."""
    x, ref = _inputs("nm", 64, 16, 3, nm="2:16")
    assert row_width(x["pos"]) == 8
    out, res = _run(x, MLX, lowering="csr")
    assert any(kr.kernel == "softmax" for kr in res.kernels)
    assert_close(out, ref)


def test_row_softmax_engines_identical():
    """The reference stepper and the fast engine agree on every counter and value (a small
    butterfly, the hand-over in the SPM and the one-tile softmax included)."""
    x, ref = _inputs("butterfly", 32, 8, 4)
    prog = lower_attention(x["q"], x["k"], x["v"], x["pos"], x["crd"], lanes=8,
                           row_bodies=True, on_chip=True)
    held = {b.name for kr in prog.kernels for b in kr.buffers if b.fetch == BufferFetch.ON_CHIP}
    assert held == {"S", "P"}
    res = assert_engines_identical(compile_program(prog, MLX))
    assert_close(np.asarray(res.output).reshape(32, 8), ref)


def test_row_softmax_through_dram_values_equal_numpy():
    """Without the hand-over (a mask whose intermediates do not fit) the same kernels run
    with S and P through DRAM."""
    x, ref = _inputs("butterfly", 64, 16, 5)
    prog = lower_attention(x["q"], x["k"], x["v"], x["pos"], x["crd"], lanes=8,
                           row_bodies=True, on_chip=False)
    assert not any(b.held for kr in prog.kernels for b in kr.buffers)
    res = simulate_mapping(compile_program(prog, MLX), engine="fast")
    assert_close(np.asarray(res.output).reshape(64, 16), ref)


def test_row_softmax_through_dram_where_the_spm_is_small():
    """The default lowering on a 16 k-word SPM: S and P with K (8 k words) exceed three
    quarters of it, so they go through DRAM (the plan's name says so); values as numpy."""
    small = variant(**{"spm.capacity_words_per_line": 1024})
    x, ref = _inputs("butterfly", 256, 32, 7)
    op = SparseAttention(x["q"], x["k"], x["v"], x["pos"], x["crd"], lowering="default")
    op.set_arch(small)
    assert ":rows:dram:" in op.op
    out, res = _run(x, small)
    assert [kr.kernel for kr in res.kernels] == ["sddmm", "softmax", "spmm"]
    assert_close(out, ref)


def test_row_max_is_exact_with_large_scores():
    """Scores far from zero: the row maximum (a tree of max) is subtracted exactly, so exp
    neither overflows nor underflows a row away; one key per row dominates its softmax."""
    seq, dim = 64, 8
    x, _ = _inputs("butterfly", seq, dim, 6)
    q, k, v = x["q"] * 30, x["k"] * 30, x["v"]
    pos, crd, _ = mask_csr("butterfly", seq)
    out = sparse_attention(q, k, v, pattern="butterfly", backend="sim", arch=MLX, cache=False)
    assert np.isfinite(out).all()
    assert_close(out, attention_reference(q, k, v, pos, crd))


def test_default_takes_row_softmax_by_itself():
    """Chosen by itself, on both presets (measured faster on each): the default lowering is
    the CSR program with the row-body softmax held on chip; rows of different widths keep the
    CSR softmax."""
    x = make_inputs("butterfly", 1024, 64)
    op = SparseAttention(x["q"], x["k"], x["v"], x["pos"], x["crd"], lowering="default")
    for arch in (MLX, DEFAULT):
        op.set_arch(arch)
        assert op.lowering == "csr" and op.op.startswith("attention:csr:rows:")
    window = make_inputs("window", 1024, 64)  # rows of different widths at the edges
    op = SparseAttention(window["q"], window["k"], window["v"], window["pos"], window["crd"],
                         lowering="csr")
    op.set_arch(MLX)
    assert ":rows" not in op.op


def test_butterfly_default_preset_beats_the_folded_csr_program():
    """On `default.yaml` (accmax, vsum) the row-body program against the CSR program with the
    row maximum folded into the scores (docs/conventions.md#attention-fold): fewer cycles."""
    x, ref = _inputs("butterfly", 1024, 64)
    out, res = _run(x, DEFAULT)
    assert_close(out, ref)
    assert [kr.kernel for kr in res.kernels] == ["sddmm", "softmax", "spmm"]
    old = simulate_mapping(compile_program(
        lower_attention(x["q"], x["k"], x["v"], x["pos"], x["crd"], lanes=8), DEFAULT),
        engine="fast")
    assert res.cycles >= res.roofline_cycles
    assert res.cycles < old.cycles


def test_butterfly_mlx_beats_max_levels_and_reaches_half_the_roofline():
    """Issue 13: butterfly, seq 1024, dim 64 on `mlx_4x4`: fewer DRAM bytes and cycles than
    the CSR program with the max levels (the lowering before), at least 0.5 of the roofline,
    no lane partials (lane-select sums), the softmax one tile."""
    x, ref = _inputs("butterfly", 1024, 64)
    out, res = _run(x, MLX)
    assert_close(out, ref)
    names = [kr.kernel for kr in res.kernels]
    assert names == ["sddmm", "softmax", "spmm"]
    assert len(res.kernels[1].tiles) == 1
    assert res.cycles >= res.roofline_cycles
    assert res.roofline_cycles / res.cycles >= 0.5
    old = simulate_mapping(compile_program(
        lower_attention(x["q"], x["k"], x["v"], x["pos"], x["crd"], lanes=8), MLX),
        engine="fast")
    assert any(k.kernel.startswith("softmax_max.level") for k in old.kernels)
    assert res.dram_bytes < old.dram_bytes
    assert res.cycles < old.cycles


def test_row_softmax_kernel_shape():
    k = row_softmax_kernel(16, 5, 0.25)
    loads = [n for n in k.nodes if n.buffer == "S"]
    assert len(loads) == 5 and [n.addr.const for n in loads] == list(range(5))
    assert not any(n.op.value == "accmax" for n in k.nodes)
    assert {b.name for b in k.buffers if b.role == "output"} == {"P"}
