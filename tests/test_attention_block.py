"""The block lowering of block-sparse attention (docs/conventions.md#block-attention): BigBird
as gathered GEMMs in strip layout. Values equal the numpy reference (whole, split into row
blocks, without an accmax unit), the fast engine equals the reference stepper, the kernels are
the ones the docs name, and the block lowering runs in fewer cycles than the CSR one."""

import numpy as np
import pytest

from dataflow import api
from dataflow.arch import resolve_arch
from dataflow.attention import lower_block, sparse_attention
from dataflow.attention.api import make_inputs, mask_csr
from dataflow.attention.lower_block import (
    BLOCK_KERNELS,
    block_structure,
    find_blocks,
    key_block_order,
    lower_attention_block,
)
from dataflow.attention.op import SparseAttention
from dataflow.attention.reference import attention_reference
from dataflow.dfg.ops import Op
from dataflow.errors import UserError
from dataflow.plan.compile import compile_program
from dataflow.testing import assert_close
from tests.archs import variant
from tests.engine_checks import assert_engines_identical

DEFAULT = resolve_arch("arch_configs/default.yaml")
MLX = resolve_arch("arch_configs/mlx_4x4.yaml")
#: 16 lines x 1024 words: bigbird without global blocks at seq 512 splits into row blocks
SMALL = variant(**{"spm.capacity_words_per_line": 1024})


def _run(arch, seq, dim, seed, lowering="block", **kw):
    x = make_inputs("bigbird", seq, dim, seed, **kw)
    out, res = sparse_attention(x["q"], x["k"], x["v"], pattern=x["pattern"], backend="sim",
                                arch=arch, return_result=True, lowering=lowering, cache=False)
    return x, out, res


@pytest.mark.parametrize("seq, dim, seed, kw", [
    (64, 16, 0, {"block": 8}),
    (128, 32, 1, {"block": 16}),
    (96, 24, 3, {"block": 8, "global_blocks": 2, "random_blocks": 2}),
    (128, 16, 5, {"block": 32, "window_blocks": 0}),
])
def test_block_lowering_values_equal_numpy(seq, dim, seed, kw):
    x, out, res = _run(DEFAULT, seq, dim, seed, **kw)
    assert "block lowering" in res.notes[-1]
    assert_close(out, attention_reference(x["q"], x["k"], x["v"], x["pos"], x["crd"]))
    assert res.values_match_reference
    # never below its floors
    assert res.cycles >= res.roofline_cycles
    assert res.cycles >= res.macs / res.peak_macs_per_cycle


def test_block_lowering_without_accmax_values_equal_numpy():
    """mlx_4x4 has no accmax: the strips' maximum is `strip_max_levels` (max over gathers)."""
    x, out, res = _run(MLX, 128, 16, 2, block=8)
    names = [k.kernel for k in res.kernels]
    assert "softmax_max_1" in names and "block lowering" in res.notes[-1]
    assert_close(out, attention_reference(x["q"], x["k"], x["v"], x["pos"], x["crd"]))
    assert res.cycles >= res.roofline_cycles


def test_block_lowering_split_into_row_blocks_values_equal_numpy():
    """K and V do not fit the small SPM: query-row blocks of whole panels, each a block
    program over its packed keys (docs/conventions.md#attention-of-any-size)."""
    r = api.simulate("attention", SMALL, seq=512, dim=32, pattern="bigbird", block=16,
                     global_blocks=0, lowering="block")
    split = next(n for n in r.notes if n.startswith("split"))
    rows = int(split.split("block(s) of ")[1].split(" ")[0])
    assert rows % 16 == 0 and any("block lowering" in n for n in r.notes)
    x = make_inputs("bigbird", 512, 32, 0, block=16, global_blocks=0)
    assert_close(r.output, attention_reference(x["q"], x["k"], x["v"], x["pos"], x["crd"]))
    assert r.values_match_reference and r.cycles >= r.roofline_cycles


@pytest.mark.parametrize("arch, accmax", [(DEFAULT, True), (MLX, False)])
def test_block_program_engines_identical(arch, accmax):
    x = make_inputs("bigbird", 64, 16, 4, block=8)
    prog = lower_attention_block(x["q"], x["k"], x["v"], x["pos"], x["crd"], accmax=accmax)
    res = assert_engines_identical(compile_program(prog, arch))
    assert_close(np.asarray(res.output).reshape(64, 16),
                 attention_reference(x["q"], x["k"], x["v"], x["pos"], x["crd"]))


def test_block_kernels_are_the_documented_gathered_gemms():
    x = make_inputs("bigbird", 128, 32, 0, block=16)
    prog = lower_attention_block(x["q"], x["k"], x["v"], x["pos"], x["crd"])
    assert tuple(k.name for k in prog.kernels) == BLOCK_KERNELS
    kern = {k.name: k for k in prog.kernels}
    sddmm, spmm = kern["sddmm"], kern["spmm"]
    ops = [n.op for n in sddmm.nodes]
    # one gathered Q vector and two K^T rows (span 8: lanes = keys) feed 16 products
    assert ops.count(Op.GATHER) == 1 and ops.count(Op.MUL) == 16 == ops.count(Op.ACC)
    spans = [n for n in sddmm.nodes if n.op is Op.LOAD and n.addr.span == 8]
    assert len(spans) == 2 and {n.buffer for n in spans} == {"K_b"}
    assert sddmm.vector_var == "r" and sddmm.loops[-1].var == "c"
    # the PV: one gathered V row feeds the panel's 16 rows; E rows divided by their sums
    ops = [n.op for n in spmm.nodes]
    assert ops.count(Op.GATHER) == 1 and ops.count(Op.MUL) == 16 and ops.count(Op.DIV) == 2
    # the softmax needs no lane reduction: vectors over the query rows, an elementwise accmax
    assert all(n.op is not Op.VSUM for k in prog.kernels for n in k.nodes)
    assert kern["softmax_max"].vector_var == "r"
    # intermediates handed over in the SPM, never through DRAM; V loaded early by
    # softmax_max and kept for the PV
    held = {b.name for k in prog.kernels for b in k.buffers if b.on_chip}
    assert held == {"St", "E", "rowmax", "rowsum", "V"}
    assert kern["softmax_max"].buffer_map["V"].fetch == "keep"
    # compiled: the products fuse into maccs, accumulators in registers over c
    mapping = compile_program(prog, DEFAULT)
    body = next(km.kernel for km in mapping.kernels if km.kernel.name == "sddmm")
    assert sum(n.op is Op.MACC for n in body.nodes) >= 16


def test_block_lowering_fewer_cycles_than_csr_on_bigbird_512():
    cyc = {}
    for low in ("csr", "block"):
        x, out, res = _run(DEFAULT, 512, 64, 0, lowering=low)
        assert res.values_match_reference
        cyc[low] = res.cycles
    assert cyc["block"] < 0.6 * cyc["csr"], cyc


def test_block_structure_and_lowering_choice():
    pos, crd, _ = mask_csr("bigbird", 128, block=16)
    edge, bpos, bcrd = find_blocks(pos, crd, 128, 128)
    assert edge % 16 == 0 and len(bcrd) * edge * edge == len(crd) and bpos[-1] == len(bcrd)
    assert block_structure(pos, crd, 128, 128, 12) is None  # not a multiple of 8
    wpos, wcrd, _ = mask_csr("window", 128, window=4)
    assert find_blocks(wpos, wcrd, 128, 128) is None
    q = k = v = np.zeros((128, 16), dtype=np.float32)
    assert SparseAttention(q, k, v, pos, crd, lowering="default").lowering == "block"
    assert SparseAttention(q, k, v, pos, crd, lowering="auto").lowering == "block"
    assert SparseAttention(q, k, v, wpos, wcrd, lowering="default").lowering == "csr"
    dpos, dcrd, _ = mask_csr("dense", 128)  # every block: K would be copied per panel
    assert SparseAttention(q, k, v, dpos, dcrd, lowering="default").lowering == "csr"
    # a window is covered by the blocks it touches (fillers masked, test_attention_block_fill)
    assert SparseAttention(q, k, v, wpos, wcrd, lowering="block").lowering == "block"
    lone = np.zeros((128, 128), dtype=np.float32)
    lone[0, 0] = 1  # rows 1-7 of the touched panel attend nothing: not covered
    lpos, lcrd, _ = mask_csr(lone, 128)
    with pytest.raises(UserError, match="lowering='block' needs"):
        SparseAttention(q, k, v, lpos, lcrd, lowering="block")
    lanes4 = variant(**{"pe_array.simd_lanes": 4})
    op = SparseAttention(q, k, v, pos, crd, lowering="default")
    op.set_arch(lanes4)
    assert op.lowering == "csr"


def test_global_key_blocks_last_hide_v_load(monkeypatch):
    """The sddmm streams the key blocks every panel keeps last (`key_block_order`), so its
    last tile is long and V's early load (issued once the scores' last load has landed)
    hides behind it (docs/conventions.md#block-attention): fewer cycles than the key order,
    `softmax_max` waiting less for V, the same values."""
    bcrd = np.array([0, 1, 3, 0, 1, 2, 0, 2, 3])  # 3 panels, column 0 kept by all
    assert list(key_block_order(bcrd, 3, 4)) == [1, 2, 3, 0]
    assert list(key_block_order(np.array([0, 1, 1, 2]), 3, 3)) == [0, 1, 2]

    def span(res, name):
        k = next(k for k in res.kernels if k.kernel == name)
        return k.end_cycle - k.start_cycle

    x, out, new = _run(DEFAULT, 512, 64, 0)
    assert_close(out, attention_reference(x["q"], x["k"], x["v"], x["pos"], x["crd"]))
    assert new.values_match_reference and new.cycles >= new.roofline_cycles
    monkeypatch.setattr(lower_block, "key_block_order",
                        lambda bcrd, panels, nbj: np.arange(nbj, dtype=np.int64))
    _, out_nat, nat = _run(DEFAULT, 512, 64, 0)
    assert nat.values_match_reference
    assert new.cycles < nat.cycles - 500, (new.cycles, nat.cycles)  # 25,103 against 26,256
    assert span(new, "softmax_max") < span(nat, "softmax_max") - 500
