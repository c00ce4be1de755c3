"""Structured-sparse attention: patterns (as UST masks), values (sim vs numpy), timing bounds."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.attention import (
    PATTERNS,
    PatternError,
    attention_reference,
    compute_bound_cycles,
    pattern_mask,
    phase_cycles,
    sparse_attention,
)
from dataflow.attention.api import (
    KERNEL_NODES,
    issue_bound_cycles,
    kernel_iterations,
    mask_csr,
)
from dataflow.attention.row_softmax import row_width
from dataflow.testing import assert_close

SMALL = {"bigbird": {"block": 8}}  # bigbird's default block (16) leaves few blocks at seq 64


def qkv(seq, dim, seed=0, dim_v=None):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((seq, dim), dtype=np.float32),
            rng.standard_normal((seq, dim), dtype=np.float32),
            rng.standard_normal((seq, dim_v or dim), dtype=np.float32))


def dense_masked_attention(q, k, v, mask):
    """The textbook definition, independent of the package: softmax over allowed keys."""
    s = (q.astype(np.float64) @ k.T.astype(np.float64)) / math.sqrt(q.shape[1])
    s = np.where(mask, s, -np.inf)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)) @ v


# --- patterns -----------------------------------------------------------------------------------

def _dense_pattern(name, s, **kw):
    """Each pattern's definition written out with loops (independent of patterns.py)."""
    m = np.zeros((s, s), dtype=bool)
    for i in range(s):
        for j in range(s):
            if name == "dense":
                m[i, j] = True
            elif name == "window":
                m[i, j] = abs(i - j) <= kw["window"]
            elif name == "dilated":
                d = j - i
                m[i, j] = d % kw["dilation"] == 0 and abs(d) <= kw["window"] * kw["dilation"]
            elif name == "butterfly":
                m[i, j] = i == j or (i ^ j).bit_count() == 1
    return m


@pytest.mark.parametrize("name,kw", [("dense", {}), ("window", {"window": 3}),
                                     ("dilated", {"window": 2, "dilation": 3}),
                                     ("butterfly", {})])
def test_deterministic_patterns_match_their_definition(name, kw):
    mask = pattern_mask(name, 32, **kw)
    np.testing.assert_array_equal(mask.to_dense() != 0, _dense_pattern(name, 32, **kw))


def test_each_pattern_is_stored_in_its_own_ust_format():
    fmts = {name: str(pattern_mask(name, 64, **SMALL.get(name, {})).tensor_format)
            for name in PATTERNS}
    assert fmts["dense"] == "(i, j) -> (i : dense, j : dense)"
    assert fmts["window"] == fmts["dilated"] == "(i, j) -> (j - i : compressed, i : range)"
    assert fmts["bigbird"] == ("(i, j) -> (i / 8 : dense, j / 8 : compressed, i % 8 : dense, "
                               "j % 8 : dense)")
    assert fmts["butterfly"] == "(i, j) -> (i : dense, j : compressed)"
    assert fmts["nm"] == "(i, j) -> (i : dense, j / 4 : dense, j % 4 : structured[2, 4])"
    # DIA stores one value per (diagonal, row): 2w+1 diagonals of 64
    assert pattern_mask("window", 64, window=2).nse == 5 * 64


@pytest.mark.parametrize("name", PATTERNS)
def test_ust_mask_converted_to_csr_is_the_kernels_csr(name):
    """The lowering takes a named pattern's CSR from its coordinates; converting the pattern's
    UST mask (DIA, BSR, N:M, ...) to CSR through the format's levels must give the same."""
    from dataflow.ust_frontend.ops import csr_arrays

    kw = SMALL.get(name, {})
    pos, crd, csr = mask_csr(name, 64, **kw)
    upos, ucrd, uval = csr_arrays(pattern_mask(name, 64, **kw))
    keep = uval != 0  # DIA and BSR store filler zeros
    np.testing.assert_array_equal(crd, ucrd[keep])
    rows = np.repeat(np.arange(64), np.diff(upos))[keep]
    np.testing.assert_array_equal(np.diff(pos), np.bincount(rows, minlength=64))
    assert str(csr.tensor_format) == "(i, j) -> (i : dense, j : compressed)"


def test_pattern_nnz_closed_forms():
    s = 64
    w = 5
    assert len(mask_csr("window", s, window=w)[1]) == (2 * w + 1) * s - w * (w + 1)
    assert len(mask_csr("butterfly", s)[1]) == s * (int(math.log2(s)) + 1)
    assert len(mask_csr("nm", s, nm="1:8")[1]) == s * s // 8
    assert len(mask_csr("dense", s)[1]) == s * s


def test_nm_keeps_exactly_n_of_every_m_and_is_seeded():
    a = pattern_mask("nm", 32, nm="3:8", seed=1).to_dense() != 0
    assert (a.reshape(32, 4, 8).sum(axis=2) == 3).all()
    b = pattern_mask("nm", 32, nm="3:8", seed=1).to_dense() != 0
    c = pattern_mask("nm", 32, nm="3:8", seed=2).to_dense() != 0
    assert (a == b).all() and (a != c).any()


def test_bigbird_has_global_window_and_random_blocks():
    s, b = 128, 16
    m = pattern_mask("bigbird", s, block=b, global_blocks=1, window_blocks=1,
                     random_blocks=1, seed=3).to_dense() != 0
    blocks = m.reshape(s // b, b, s // b, b)
    full = blocks.all(axis=(1, 3))
    assert (blocks.any(axis=(1, 3)) == full).all()  # made of whole blocks
    assert full[0].all() and full[:, 0].all()  # global row and column
    for r in range(1, s // b):
        band = set(range(max(0, r - 1), min(s // b, r + 2)))
        assert full[r, sorted(band)].all()  # the 3-block band
        # beyond the global column and the band: at most the one random block
        assert len(set(np.flatnonzero(full[r])) - band - {0}) <= 1
    other = pattern_mask("bigbird", s, block=b, seed=4).to_dense() != 0
    assert (m != other).any()  # the random blocks follow the seed


@pytest.mark.parametrize("call,needle", [
    (lambda: pattern_mask("window", 16, window=17), "window"),
    (lambda: pattern_mask("nm", 16, nm="5:4"), "N <= M"),
    (lambda: pattern_mask("nm", 16, nm="2-4"), "nm"),
    (lambda: pattern_mask("nm", 18, nm="2:4"), "M to divide seq"),
    (lambda: pattern_mask("bigbird", 40, block=16), "block"),
    (lambda: pattern_mask("butterfly", 48), "power of two"),
    (lambda: pattern_mask("dilated", 16, dilation=0), "dilation"),
    (lambda: pattern_mask("window", 16, dilation=2), "does not take 'dilation'"),
    (lambda: pattern_mask("sliding", 16), "unknown attention pattern 'sliding'"),
    (lambda: pattern_mask("window", 16, windo=2), "unknown pattern parameter 'windo'"),
    (lambda: pattern_mask("bigbird", 32, block=8, global_blocks=5), "global_blocks"),
    (lambda: pattern_mask("nm", 16, seed=-1), "seed"),
])
def test_bad_pattern_parameters_name_the_parameter(call, needle):
    with pytest.raises(PatternError, match=needle):
        call()


# --- values ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", PATTERNS)
def test_sim_equals_numpy_dense_masked_attention(name, default_arch):
    q, k, v = qkv(64, 16, seed=1, dim_v=24)
    kw = SMALL.get(name, {})
    out, res = sparse_attention(q, k, v, pattern=name, backend="sim", arch=default_arch,
                                return_result=True, **kw)
    ref = sparse_attention(q, k, v, pattern=name, backend="numpy", **kw)
    mask = pattern_mask(name, 64, **kw).to_dense() != 0
    assert_close(ref, dense_masked_attention(q, k, v, mask), dtype=np.float32)
    assert_close(out, ref, dtype=np.float32)
    assert res.values_match_reference
    # the normalisation folded into the SpMM (docs/conventions.md#attention-fold); rows of
    # one width: one row-body softmax kernel (docs/conventions.md#row-softmax)
    rows = row_width(mask_csr(name, 64, **kw)[0]) is not None
    assert [kr.kernel for kr in res.kernels] == (
        ["sddmm", "softmax", "spmm"] if rows else ["sddmm", "softmax_max", "softmax_exp", "spmm"])


def test_softmax_is_stable_for_large_and_all_negative_scores(default_arch):
    """Scores of -/+ thousands: without the row max (or with a max accumulator starting at 0
    instead of -inf) exp under- or overflows and the rows become NaN."""
    rng = np.random.default_rng(0)
    q = np.full((16, 8), 30.0, dtype=np.float32)
    k = -np.abs(rng.standard_normal((16, 8), dtype=np.float32)) * 30  # every score < 0, large
    v = rng.standard_normal((16, 8), dtype=np.float32)
    for qq in (q, -q):
        out = sparse_attention(qq, k, v, pattern="window", window=3, backend="sim",
                               arch=default_arch)
        mask = pattern_mask("window", 16, window=3).to_dense() != 0
        assert np.isfinite(out).all()
        assert_close(out, dense_masked_attention(qq, k, v, mask))


def test_given_mask_and_empty_rows(default_arch):
    q, k, v = qkv(16, 8, seed=2)
    m = sp.random(16, 16, density=0.3, format="lil", random_state=3)
    m[5, :] = 0  # an empty row: no key attended -> zeros (numpy and sim agree)
    m = m.tocsr()
    out = sparse_attention(q, k, v, pattern=m, backend="sim", arch=default_arch)
    ref = attention_reference(q, k, v, *mask_csr(m, 16)[:2])
    assert_close(out, ref)
    assert (ref[5] == 0).all()


@pytest.mark.parametrize("dim,lanes", [(8, 8), (12, 4)])
def test_fast_and_reference_engines_agree_on_attention(dim, lanes, default_arch):
    """Bit-identical engines on all four kernels (accmax, vsum, div included); lanes=4 on the
    8-lane array leaves half of every vector idle, dim=12 pads q and k with zero columns."""
    from dataflow.attention.lower import lower_attention
    from dataflow.dfg.transform import hold_invariant_loads
    from dataflow.mapper import map_program
    from dataflow.pe_array.simulate import run_array

    q, k, v = qkv(16, dim, seed=4)
    pos, crd, _ = mask_csr("window", 16, window=2)
    mapping = map_program(lower_attention(q, k, v, pos, crd, lanes=lanes), default_arch)
    assert {k.name: len(k.nodes) for k in mapping.program.kernels} == KERNEL_NODES
    # acc and accmax recurrences stay in a register: one cycle each, so no kernel has RecMII > 1
    assert [km.rec_mii for km in mapping.kernels] == [1] * 4
    # and with the loads held that do not move with the innermost loop (the SpMM's row sum:
    # docs/conventions.md#attention-fold)
    prog = mapping.program
    held = dataclasses.replace(prog, kernels=tuple(hold_invariant_loads(kern, lanes)
                                                   for kern in prog.kernels))
    assert any(n.hold for n in held.kernels[-1].nodes if n.buffer == "rowsum")
    for m in (mapping, map_program(held, default_arch)):
        fast, ref = run_array(m, "fast"), run_array(m, "reference")
        for a, b in zip(fast, ref):
            assert a.same_as(b) == [], a.kernel
        assert_close(dict(fast[-1].outputs)["O"].reshape(16, dim),
                     attention_reference(q, k, v, pos, crd))


# --- timing ---------------------------------------------------------------------------------------

def _same_up_to_blocks(iters: dict, want: dict) -> None:
    """Iterations per kernel against the lowering's closed forms. The compiler may split a
    kernel's vector loop into b blocks (b in 1, 2, 4, 8: docs/conventions.md#register-blocking),
    one iteration then covering b vectors: the PV kernel (`spmm`), whose product feeds an
    accumulation, may be blocked, and the scores (`sddmm`), whose lane sums may be blocked by
    b in 1, 2, 4, 8, 16 (docs/conventions.md#sparse-line-model); the others run as lowered."""
    for name, n in iters.items():
        if name == "spmm":
            assert want[name] % n == 0 and want[name] // n in (1, 2, 4, 8), (name, n)
        elif name == "sddmm":
            assert want[name] % n == 0 and want[name] // n in (1, 2, 4, 8, 16), (name, n)
        else:
            assert n == want[name], (name, n, want[name])
    assert set(iters) == set(want)


def test_cycles_scale_with_nnz_and_respect_the_compute_bound(default_arch):
    from dataflow import simulate

    seq, dim = 256, 16
    lanes = default_arch.pe_array.simd_lanes
    cases = {"dense": {}, "window": {"window": 8}, "butterfly": {}, "nm": {"nm": "1:4"}}
    # the CSR lowering's closed forms (a window runs the block lowering by default now:
    # docs/conventions.md#block-attention)
    runs = {name: simulate("attention", arch=default_arch, pattern=name, seq=seq, dim=dim,
                           lowering="csr", **kw)
            for name, kw in cases.items()}
    for name, r in runs.items():
        assert r.values_match_reference, name
        nnz = len(mask_csr(name, seq, **cases[name])[1])
        assert r.compute_cycles >= compute_bound_cycles(nnz, dim, dim, default_arch), name
        assert r.cycles >= r.compute_cycles
        # iterations are exactly the closed forms in nnz: the kernels touch stored entries only
        iters = {kr.kernel: sum(t.iterations for t in kr.tiles) for kr in r.kernels}
        want = {"sddmm": nnz * (dim // lanes), "softmax_max": nnz, "softmax_exp": nnz,
                "spmm": nnz * -(-dim // lanes)}
        assert want == kernel_iterations(nnz, dim, dim, lanes)
        if name == "butterfly":  # rows of one width: one softmax kernel over the rows
            # (docs/conventions.md#row-softmax)
            want = {"sddmm": want["sddmm"], "softmax": seq, "spmm": want["spmm"]}
        _same_up_to_blocks(iters, want)
        bound = issue_bound_cycles(nnz, dim, dim, default_arch)
        for kr in r.kernels:  # one op per PE per cycle (a blocked body has other nodes)
            if kr.kernel in bound and iters[kr.kernel] == want[kr.kernel]:
                assert kr.compute_cycles >= bound[kr.kernel], (name, kr.kernel)
        ph = phase_cycles(r)
        assert set(ph) == {"sddmm", "softmax", "spmm"}
        assert sum(ph.values()) == r.compute_cycles
    assert runs["window"].cycles < runs["nm"].cycles < runs["dense"].cycles
    assert runs["butterfly"].cycles < runs["dense"].cycles
    # a pattern with 1/15 of dense's entries is at least several times faster
    assert runs["window"].compute_cycles * 4 < runs["dense"].compute_cycles


def test_cli_attention_prints_summary(capsys):
    from dataflow.cli import main

    rc = main(["simulate", "--workload", "attention", "--pattern", "window", "--seq", "128",
               "--dim", "32"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "attention/window(seq=128, window=8)" in out
    assert "match the numpy reference" in out
    assert "sddmm" in out and "softmax_exp" in out and "spmm" in out


@pytest.mark.parametrize("argv,needle", [
    (["--pattern", "window", "--seq", "16", "--window", "40"], "window must be <= seq"),
    (["--pattern", "nm", "--seq", "16", "--nm", "4:2"], "N <= M"),
    (["--pattern", "bigbird", "--seq", "16", "--window", "2"], "does not take 'window'"),
])
def test_cli_bad_pattern_parameter_is_one_line_and_exit_2(argv, needle, capsys):
    from dataflow.cli import main

    rc = main(["simulate", "--workload", "attention", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_compute_energy_is_the_closed_form_of_the_op_counts(default_arch):
    """Every op of the four kernels counted once per stored entry (per lane for vectors):
    MULs nnz * (d + 1 + dv), EXP and DIV nnz each on the SFU (the division in the SpMM: one
    vector of dv per entry), SUB and CONST nnz each on the ALU, one lane sum (lanes - 1 adds)
    per entry and block of the chunks of d the compiler sums together (`sum_blocks`)."""
    from dataflow.attention.op import SparseAttention

    q, k, v = qkv(32, 16, seed=5, dim_v=8)
    _, res = sparse_attention(q, k, v, pattern="dilated", window=3, dilation=2, backend="sim",
                              arch=default_arch, return_result=True)
    pos, crd, _ = mask_csr("dilated", 32, window=3, dilation=2)
    nnz = len(crd)
    op = SparseAttention(q, k, v, pos, crd)
    blocks = op.plan(arch=default_arch).schedule.kernels[0].sum_blocks
    e = default_arch.energy
    lanes = default_arch.pe_array.simd_lanes
    want = (e.mac_pj * nnz * (16 + 1 + 8) + e.sfu_pj * 2 * nnz + e.alu_pj * 2 * nnz
            + e.alu_pj * (lanes - 1) * nnz * (16 // lanes // blocks))
    assert dict(res.energy_pj)["compute"] == pytest.approx(want, rel=1e-12)


def test_plans_are_cached_by_structure_not_values(default_arch, tmp_path):
    from dataflow.attention.op import SparseAttention
    from dataflow.ust_frontend.cache import PlanCache

    store = PlanCache(directory=tmp_path)
    q, k, v = qkv(32, 8, seed=6)
    pos, crd, _ = mask_csr("butterfly", 32)
    a = SparseAttention(q, k, v, pos, crd)
    a.plan(arch=default_arch, cache=store)
    first = a.execute("sim")
    assert a.plan_source == "built"
    b = SparseAttention(2 * q, k, v, pos, crd)  # new values, same structure: a memory hit
    b.plan(arch=default_arch, cache=store)
    assert b.plan_source == "memory"
    assert_close(b.execute("sim"), b.execute("numpy"))
    assert not np.allclose(first, b.execute("sim"))
    pos2, crd2, _ = mask_csr("window", 32, window=1)  # another structure: planned again
    c = SparseAttention(q, k, v, pos2, crd2)
    c.plan(arch=default_arch, cache=store)
    assert c.plan_source == "built"


def test_reference_in_row_blocks_equals_one_block():
    q, k, v = qkv(40, 8, seed=7)
    pos, crd, _ = mask_csr("bigbird", 40, block=8)
    one = attention_reference(q, k, v, pos, crd, rows_per_block=40)
    # equal up to float64 BLAS blocking, seen through the float32 result (1 ulp)
    np.testing.assert_allclose(attention_reference(q, k, v, pos, crd, rows_per_block=7), one,
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("changes", [{"pe_array.simd_lanes": 1},
                                     {"pe_array.rows": 4, "pe_array.cols": 4, "spm.lines": 4}])
def test_other_arrays_give_the_same_values(changes):
    """The SDDMM's reduction width follows the array's SIMD lanes (d = 20 is padded to a
    multiple of them); smaller arrays and SPMs only change the timing."""
    from dataflow import simulate
    from tests.archs import variant

    arch = variant(**changes)
    r = simulate("attention", arch=arch, pattern="dilated", seq=32, dim=20, window=2)
    assert r.values_match_reference
    nnz = len(mask_csr("dilated", 32, window=2)[1])
    assert r.compute_cycles >= compute_bound_cycles(nnz, 20, 20, arch)


# --- the DIA lowering of banded patterns ---------------------------------------------------------

def test_band_offsets_recognise_whole_equally_spaced_diagonals():
    from dataflow.attention.lower_dia import band_offsets

    assert band_offsets(*mask_csr("window", 32, window=3)[:2], 32) == (-3, 1, 7)
    assert band_offsets(*mask_csr("dilated", 32, window=2, dilation=5)[:2], 32) == (-10, 5, 5)
    for name, kw in (("bigbird", {"block": 8}), ("butterfly", {}), ("nm", {})):
        assert band_offsets(*mask_csr(name, 32, **kw)[:2], 32) is None, name
    assert band_offsets(*mask_csr("dense", 32)[:2], 32) == (-31, 1, 63)  # all 63 diagonals
    i = np.arange(32)
    m = np.zeros((32, 32))
    m[i[4:], i[4:] - 4] = m[i, i] = 1
    m[i[:-4], i[:-4] + 4] = 1
    assert band_offsets(*mask_csr(m, 32)[:2], 32) == (-4, 4, 3)  # a given banded mask
    m[3, 7] = 0  # one missing position: not whole diagonals any more
    assert band_offsets(*mask_csr(m, 32)[:2], 32) is None


@pytest.mark.parametrize("name,seq,dim,kw", [("window", 30, 12, {"window": 4}),
                                             ("dilated", 32, 16, {"window": 3, "dilation": 4})])
def test_dia_lowering_values_and_engines(name, seq, dim, kw, default_arch):
    """Ragged seq and dim (padding), -inf fillers at both ends: values as numpy, engines equal."""
    from dataflow.attention.op import SparseAttention
    from dataflow.mapper import map_program
    from dataflow.pe_array.simulate import run_array

    q, k, v = qkv(seq, dim, seed=8, dim_v=10)
    pos, crd, _ = mask_csr(name, seq, **kw)
    out = sparse_attention(q, k, v, pattern=name, backend="sim", arch=default_arch,
                           lowering="dia", **kw)
    assert_close(out, attention_reference(q, k, v, pos, crd))
    op = SparseAttention(q, k, v, pos, crd, lowering="dia")
    op.plan(arch=default_arch, cache=False)
    mapping = map_program(op._lower(), default_arch)
    assert not any(n.op.value == "gather" for k_ in mapping.program.kernels for n in k_.nodes)
    for a, b in zip(run_array(mapping, "fast"), run_array(mapping, "reference")):
        assert a.same_as(b) == [], a.kernel


def test_dia_lowering_iterations_and_fewer_cycles_than_csr(default_arch):
    from dataflow import simulate

    seq, dim, w = 256, 32, 8
    lanes = default_arch.pe_array.simd_lanes
    csr, dia = (simulate("attention", arch=default_arch, pattern="window", seq=seq, dim=dim,
                         window=w, lowering=low) for low in ("csr", "dia"))
    assert csr.values_match_reference and dia.values_match_reference
    T = 2 * w + 1  # diagonals, fillers included: T * seq positions
    iters = {kr.kernel: sum(t.iterations for t in kr.tiles) for kr in dia.kernels}
    _same_up_to_blocks(iters, {"sddmm": seq * T * dim // lanes, "softmax_max": seq * T,
                               "softmax_exp": seq * T, "softmax_norm": seq * T,
                               "spmm": seq * T * dim // lanes})
    # no column indices to load and no gathers: the scores' body is smaller than the CSR
    # program's, and its array cycles were fewer until the held-row SDDMM with the row maximum
    # folded in (docs/conventions.md#held-loads, #attention-fold) made the CSR scores 1,844
    # cycles against DIA's 2,216 here (the whole program's went the same way with line-aware
    # delays and lane-sum blocking, docs/conventions.md#sparse-line-model: 10,654 against
    # 11,472); they stay within a quarter
    phase = {low: {kr.kernel: kr.compute_cycles for kr in r.kernels}
             for low, r in (("csr", csr), ("dia", dia))}
    assert phase["dia"]["sddmm"] < 1.25 * phase["csr"]["sddmm"]


def test_dia_lowering_rejects_other_patterns_and_auto_falls_back():
    q, k, v = qkv(16, 8)
    with pytest.raises(ValueError, match="lowering='dia' needs"):
        sparse_attention(q, k, v, pattern="butterfly", backend="sim", lowering="dia")
    from dataflow.attention.op import SparseAttention

    pos, crd, _ = mask_csr("butterfly", 16)
    assert SparseAttention(q, k, v, pos, crd, lowering="auto").lowering == "csr"
    pos, crd, _ = mask_csr("window", 16, window=2)
    assert SparseAttention(q, k, v, pos, crd, lowering="auto").lowering == "dia"
    pos, crd, _ = mask_csr("dense", 16)  # a band too, but half of its DIA positions are fillers
    assert SparseAttention(q, k, v, pos, crd, lowering="auto").lowering == "csr"
    assert SparseAttention(q, k, v, pos, crd, lowering="dia").lowering == "dia"


def test_reference_dense_blocks_equal_gathered_pairs(monkeypatch):
    """`attention_reference` on a dense or causal mask takes its scores from dense Q K^T
    blocks (`DENSE_BLOCK`): the same output, and the same rows NaN when q or k hold NaN or
    inf, as gathering the attended pairs one by one."""
    import dataflow.attention.reference as r

    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((96, 16), dtype=np.float32) for _ in range(3))
    q[3, 5], k[7, 1] = np.nan, np.inf
    for mask in (np.ones((96, 96)), np.tril(np.ones((96, 96)))):
        pos, crd, _ = mask_csr(mask, 96)
        monkeypatch.setattr(r, "DENSE_BLOCK", 0.25)
        dense = r.attention_reference(q, k, v, pos, crd, rows_per_block=40)
        monkeypatch.setattr(r, "DENSE_BLOCK", 2.0)  # never dense
        pairs = r.attention_reference(q, k, v, pos, crd, rows_per_block=40)
        assert np.array_equal(np.isnan(dense), np.isnan(pairs))
        assert np.isnan(pairs).any() and not np.isnan(pairs).all()
        np.testing.assert_allclose(dense, pairs, rtol=1e-6, atol=1e-7, equal_nan=True)
    v[50, 2] = np.inf  # rows that do not attend key 50 stay finite (0 * inf never formed)
    band = np.triu(np.ones((96, 96))) * np.tril(np.ones((96, 96)), 30)
    pos, crd, _ = mask_csr(band, 96)
    monkeypatch.setattr(r, "DENSE_BLOCK", 0.25)
    dense = r.attention_reference(q, k, v, pos, crd, rows_per_block=40)
    monkeypatch.setattr(r, "DENSE_BLOCK", 2.0)
    pairs = r.attention_reference(q, k, v, pos, crd, rows_per_block=40)
    assert np.array_equal(np.isnan(dense), np.isnan(pairs)) and not np.isnan(pairs[51:]).any()


def test_the_attention_workload_plans_through_the_plan_cache(default_arch, tmp_path,
                                                              monkeypatch):
    """A second run of the same pattern and arch reuses its plan (issue 14: the workload
    planned afresh every run) with the same cycles and values; another seed's values run on
    the same plan when the mask is the same."""
    monkeypatch.setenv("DATAFLOW_CACHE_DIR", str(tmp_path))
    from dataflow import simulate
    from dataflow.ust_frontend.cache import default_cache
    default_cache().clear_memory()
    first = simulate("attention", arch=default_arch, pattern="window", seq=44, dim=12)
    again = simulate("attention", arch=default_arch, pattern="window", seq=44, dim=12)
    other = simulate("attention", arch=default_arch, pattern="window", seq=44, dim=12, seed=1)
    assert "plan built" in " ".join(first.notes)
    assert "plan built" not in " ".join(again.notes)
    assert again.cycles == first.cycles == other.cycles
    assert first.values_match_reference and again.values_match_reference
    assert other.values_match_reference


def test_reference_pair_chunks_change_no_bit(monkeypatch):
    """`attention_reference` gathers the attended pairs `PAIRS_PER_CHUNK` at a time: every
    output bit equals one gather of the whole block (NaN rows included)."""
    import dataflow.attention.reference as r

    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((320, 24), dtype=np.float32) for _ in range(3))
    q[7, 3] = np.nan
    for name in ("window", "bigbird", "dilated"):
        pos, crd, _ = mask_csr(name, 320)
        monkeypatch.setattr(r, "PAIRS_PER_CHUNK", 37)
        chunked = r.attention_reference(q, k, v, pos, crd, rows_per_block=128)
        monkeypatch.setattr(r, "PAIRS_PER_CHUNK", 1 << 30)
        whole = r.attention_reference(q, k, v, pos, crd, rows_per_block=128)
        assert len(crd) > 37 and np.isnan(whole).any()
        assert np.array_equal(chunked.view(np.int32), whole.view(np.int32))
