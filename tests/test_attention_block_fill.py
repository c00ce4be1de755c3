"""The block lowering over masks that are not whole blocks (docs/conventions.md#block-attention,
"Filler blocks"): a window covered by the 8 x 8 blocks it touches, the fillers masked by a
-inf bias. Values equal the numpy reference (several widths and lengths, with and without an
accmax unit, split into row blocks, one attended key per row), the fast engine equals the
reference stepper, the roofline counts the attended MACs only, and the automatic choice takes
the block lowering where it was measured faster (window) and not elsewhere (butterfly)."""

import numpy as np
import pytest

from dataflow import api
from dataflow.arch import resolve_arch
from dataflow.attention import sparse_attention
from dataflow.attention.api import make_inputs, mask_csr
from dataflow.attention.block_fill import cover_structure, filler_bias, find_cover, useful_fraction
from dataflow.attention.lower_block import lower_attention_block
from dataflow.attention.op import FILL_THRESHOLD, SparseAttention
from dataflow.attention.reference import attention_reference
from dataflow.errors import UserError
from dataflow.plan.compile import compile_program
from dataflow.testing import assert_close
from tests.archs import variant
from tests.engine_checks import assert_engines_identical

DEFAULT = resolve_arch("arch_configs/default.yaml")
MLX = resolve_arch("arch_configs/mlx_4x4.yaml")
#: 16 lines x 1024 words: a window at seq 512 splits into row blocks
SMALL = variant(**{"spm.capacity_words_per_line": 1024})


def _run(arch, pattern, seq, dim, seed, lowering="block", **kw):
    x = make_inputs(pattern, seq, dim, seed, **kw)
    out, res = sparse_attention(x["q"], x["k"], x["v"], pattern=x["pattern"], backend="sim",
                                arch=arch, return_result=True, lowering=lowering, cache=False)
    return x, out, res


@pytest.mark.parametrize("arch", [DEFAULT, MLX], ids=["default", "mlx_4x4"])
@pytest.mark.parametrize("seq, dim, window, seed", [
    (64, 16, 1, 0),
    (96, 32, 4, 1),
    (128, 16, 8, 2),
    (128, 24, 13, 3),
])
def test_window_block_lowering_values_equal_numpy(arch, seq, dim, window, seed):
    x, out, res = _run(arch, "window", seq, dim, seed, window=window)
    assert "block lowering" in res.notes[-1]
    assert_close(out, attention_reference(x["q"], x["k"], x["v"], x["pos"], x["crd"]))
    assert res.values_match_reference
    # the roofline counts the attended pairs' MACs, not the fillers' (the engine issues those)
    useful = len(x["crd"]) * 2 * dim
    assert res.roofline.compute_cycles == pytest.approx(useful / res.peak_macs_per_cycle)
    assert res.macs > useful
    assert res.cycles >= res.roofline_cycles
    assert res.cycles >= res.macs / res.peak_macs_per_cycle


def test_window_block_lowering_split_into_row_blocks_values_equal_numpy():
    """K and V do not fit the small SPM: query-row blocks of whole 8-row panels, each a
    block program over its packed keys with fillers (docs/conventions.md#attention-of-any-size)."""
    r = api.simulate("attention", SMALL, seq=512, dim=32, pattern="window", window=8,
                     lowering="block")
    split = next(n for n in r.notes if n.startswith("split"))
    rows = int(split.split("block(s) of ")[1].split(" ")[0])
    assert rows % 8 == 0 and any("block" in n and "lowering" in n for n in r.notes)
    x = make_inputs("window", 512, 32, 0, window=8)
    assert_close(r.output, attention_reference(x["q"], x["k"], x["v"], x["pos"], x["crd"]))
    assert r.values_match_reference and r.cycles >= r.roofline_cycles


@pytest.mark.parametrize("arch, accmax", [(DEFAULT, True), (MLX, False)],
                         ids=["default", "mlx_4x4"])
def test_filler_block_program_engines_identical(arch, accmax):
    x = make_inputs("window", 32, 8, 4, window=3)
    prog = lower_attention_block(x["q"], x["k"], x["v"], x["pos"], x["crd"], accmax=accmax,
                                 fill=True)
    assert dict(prog.inputs).keys() >= {"bias", "bpat"}
    res = assert_engines_identical(compile_program(prog, arch))
    assert_close(np.asarray(res.output).reshape(32, 8),
                 attention_reference(x["q"], x["k"], x["v"], x["pos"], x["crd"]))


@pytest.mark.parametrize("arch", [DEFAULT, MLX], ids=["default", "mlx_4x4"])
def test_fillers_are_masked(arch):
    """One attended key per row, in a different block for each half of a panel: each 8 x 8
    covering block has 4 attended entries and 60 fillers, whose scores are made the largest
    (q and k large along one direction), so a filler that leaked would dominate its row."""
    seq, dim = 32, 8
    rng = np.random.default_rng(7)
    mask = np.zeros((seq, seq), dtype=np.float32)
    rows = np.arange(seq)
    cols = (rows // 8) * 8 + (rows % 4) + np.where(rows % 8 < 4, 0, 8)
    cols %= seq
    mask[rows, cols] = 1
    q = rng.standard_normal((seq, dim), dtype=np.float32)
    k = rng.standard_normal((seq, dim), dtype=np.float32)
    q[:, 0] = 4.0
    k[:, 0] = 4.0
    k[cols, 0] = -4.0  # the attended keys score lowest
    v = rng.standard_normal((seq, dim), dtype=np.float32)
    out, res = sparse_attention(q, k, v, pattern=mask, backend="sim", arch=arch,
                                return_result=True, lowering="block", cache=False)
    assert "block lowering" in res.notes[-1]
    # one attended key per row: softmax is 1 on it, the output its V row
    assert_close(out, v[cols])
    pos, crd, _ = mask_csr(mask, seq)
    assert_close(out, attention_reference(q, k, v, pos, crd))


def test_cover_bias_and_choice():
    pos, crd, _ = mask_csr("window", 1024, window=8)
    edge, bpos, bcrd = find_cover(pos, crd, 1024, 1024)
    assert edge == 8 and bpos[-1] == len(bcrd) == 382
    frac = useful_fraction(len(crd), len(bcrd), edge)
    assert 0.70 < frac < 0.72
    table, pattern = filler_bias(pos, crd, 1024, edge, bpos, bcrd)
    # a few distinct blocks (first, interior three, last), each 0 on its attended entries
    assert len(table) <= 8 * 64 and len(pattern) == len(bcrd)
    assert (table == 0).sum() <= len(crd) and np.isneginf(table).any()
    # a row of a touched panel that attends nothing: not covered (its max would be -inf)
    epos = pos.copy()
    epos[2:] -= int(pos[2] - pos[1])  # row 1 loses its keys
    assert cover_structure(epos, np.delete(crd, np.s_[pos[1]:pos[2]]), 1024, 1024, 8) is None
    x = make_inputs("window", 1024, 64, 0)
    args = (x["q"], x["k"], x["v"], x["pos"], x["crd"])
    for arch in (DEFAULT, MLX):
        for low in ("default", "auto"):
            op = SparseAttention(*args, lowering=low)
            op.set_arch(arch)
            assert op.lowering == "block", (arch.name, low)
    b = make_inputs("butterfly", 1024, 64, 0)
    bargs = (b["q"], b["k"], b["v"], b["pos"], b["crd"])
    for arch in (DEFAULT, MLX):
        op = SparseAttention(*bargs, lowering="default")
        op.set_arch(arch)
        assert op.useful_fraction() < min(FILL_THRESHOLD.values()) and op.lowering == "csr"
    # a non-finite K or V value would reach rows that do not attend it through a filler
    k_inf = x["k"].copy()
    k_inf[5, 0] = np.inf
    op = SparseAttention(x["q"], k_inf, x["v"], x["pos"], x["crd"], lowering="default")
    assert op.lowering == "csr"
    with pytest.raises(UserError, match="inf or NaN"):
        SparseAttention(x["q"], k_inf, x["v"], x["pos"], x["crd"], lowering="block")
    # whole blocks (bigbird) take no bias
    g = make_inputs("bigbird", 128, 16, 0, block=16)
    prog = lower_attention_block(g["q"], g["k"], g["v"], g["pos"], g["crd"], fill=True)
    assert not {"bias", "bpat"} & dict(prog.inputs).keys()
