"""Any problem size (issue 13 point 4, docs/conventions.md#tiling-any-problem-size): a matmul
that does not fit the SPM or the host's memory runs in blocks -- N blocks, K panels whose
partial sums are read back, M tiles generated one at a time -- with values checked tile by tile,
cycles never below the whole problem's roofline, and a dense GEMM's timing memoised per block
shape. Small SPMs (a derived default arch) force every split on small shapes."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest

from dataflow import api, matmul_split, workloads
from dataflow.dynamic import split as dynamic_split
from dataflow.errors import UserError
from dataflow.mapper import map_program
from dataflow.mapper.tiling import tile_and_allocate
from dataflow.matmul_split import matmul_work, plan_split, sim_bytes
from dataflow.matmul_workloads import make_operands
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan import split as splitter
from dataflow.testing import assert_close
from dataflow.ust_frontend.ops import as_tensor, lower_matmul
from tests.archs import variant

#: 16 lines x 256 words: B of a 64 x 96 GEMM no longer fits
TINY = variant(**{"spm.capacity_words_per_line": 256})
#: 16 lines x 1024 words, for the dynamic programs (a 32-row panel of A beside B)
SMALL = variant(**{"spm.capacity_words_per_line": 1024})


def _split_note(r) -> str:
    return next(n for n in r.notes if n.startswith("split"))


def _floors_hold(r) -> None:
    assert r.roofline is not None and r.cycles >= r.roofline_cycles > 0
    for kr in r.kernels:
        assert kr.roofline is None or kr.span_cycles >= kr.roofline.cycles - 1e-9


@pytest.mark.parametrize("workload, params", [
    ("gemm", {"m": 48, "k": 96, "n": 64}),
    ("spmm", {"m": 64, "k": 300, "n": 40, "density": 0.1}),
])
def test_matmul_split_values_equal_numpy(workload, params):
    r = api.simulate(workload, TINY, **params)
    a, b = make_operands(workload, params["m"], params["k"], params["n"],
                         params.get("density", 0.05))
    assert "K panel" in _split_note(r) and r.values_match_reference
    assert_close(r.output, np.asarray(a.astype(np.float64) @ b.astype(np.float64)))
    _floors_hold(r)
    m, k, n = params["m"], params["k"], params["n"]
    nnz = m * k if workload == "gemm" else a.nnz
    assert r.roofline.compute_cycles == nnz * n / (TINY.pe_array.num_pes
                                                   * TINY.pe_array.simd_lanes)


def test_small_problems_run_exactly_as_before():
    for workload, m, k, n in (("gemm", 256, 256, 64), ("spmm", 256, 256, 64),
                              ("gemm", 64, 32, 48)):
        assert plan_split(workload, api.resolve_arch("default"), m, k, n, 0.05) is None
    r = api.simulate("gemm", m=64, k=32, n=48)
    assert not any("split" in n for n in r.notes) and len(r.kernels) == 1


def test_a_k_split_charges_the_partial_sums():
    m, k, n = 48, 96, 64
    r = api.simulate("gemm", TINY, m=m, k=k, n=n)
    split = plan_split("gemm", TINY, m, k, n)
    mc, kc, nc = split.counts
    assert kc > 1
    read = written = reread = 0
    for m0, m1 in split.m_tiles():
        for n0, n1 in split.n_blocks():
            for blk in split.blocks(m0, m1, n0, n1):
                mt, kp, nb = blk.shape
                read += 4 * (mt * kp + kp * nb)
                written += 4 * mt * nb
                reread += 4 * mt * nb if blk.reloads else 0
    assert r.dram_bytes_written == written
    assert r.dram_bytes_read == read + reread  # every panel after the first reads C back
    assert f"({reread:,} B, in the DRAM traffic" in " ".join(r.notes)


def test_reloading_the_partial_sums_costs_dram_time():
    a, b = make_operands("gemm", 64, 32, 48)
    mapping = map_program(lower_matmul(as_tensor(a), as_tensor(b)), TINY)
    plain = simulate_mapping(mapping)
    again = simulate_mapping(mapping, reload=("C",))
    assert again.dram_bytes_read == plain.dram_bytes_read + 64 * 48 * 4
    assert again.cycles > plain.cycles and again.stall_cycles_dram > plain.stall_cycles_dram
    np.testing.assert_array_equal(again.output, plain.output)  # values are the caller's


def test_memoised_timing_equals_simulating_every_block():
    split = plan_split("gemm", TINY, 96, 96, 64)
    work = matmul_work(split, "gemm", 1.0, 0, make_operands)
    memo = splitter.run_split(split, work, TINY)
    again = matmul_work(split, "gemm", 1.0, 0, make_operands)
    full = splitter.run_split(split, dataclasses.replace(again, memo_key=lambda blk: None), TINY)
    assert any("timing memoised" in n for n in memo.notes)
    assert not any("timing memoised" in n for n in full.notes)
    for field in ("cycles", "compute_cycles", "stall_cycles_dram", "stall_cycles_spm_conflict",
                  "dram_bytes_read", "dram_bytes_written", "macs"):
        assert getattr(memo, field) == getattr(full, field), field
    assert memo.energy_total_pj == pytest.approx(full.energy_total_pj)
    assert memo.roofline == full.roofline and memo.values_match_reference
    assert_close(memo.output, full.output)


def _budget(monkeypatch, nbytes: int) -> None:
    """A host of `nbytes` for the operands alone (the simulation's own bytes left out)."""
    monkeypatch.setattr(workloads, "memory_budget_bytes", lambda: nbytes)
    monkeypatch.setattr(matmul_split, "HOST_BYTES_PER_ITERATION", 0)
    monkeypatch.setattr(dynamic_split, "HOST_BYTES_PER_ITERATION", 0)


def test_a_simulation_too_large_for_the_host_is_cut_into_m_tiles():
    arch = api.resolve_arch("default")
    m, k, n = 200_000, 64, 64  # 100 MB of operands, but 13 GB of the engine's arrays
    split = plan_split("gemm", arch, m, k, n)
    assert split is not None and not split.streamed and split.counts == (split.counts[0], 1, 1)
    assert split.counts[0] > 1 and workloads.fits_host_memory(
        matmul_split.host_bytes("gemm", m, k, n, 1.0)
        + sim_bytes(arch, "gemm", split.m_tile, k, n, 1.0))


def test_a_csr_split_cuts_m_only_as_far_as_the_host_needs(monkeypatch):
    monkeypatch.setattr(workloads, "memory_budget_bytes", lambda: 2 * 2**30)
    arch = api.resolve_arch("default")
    # the spmm: B is 6.4M words; whole, its simulation would take 10 GB, one
    # K panel x N block of it well under the 2 GiB host, so M stays whole
    split = plan_split("spmm", arch, 100_000, 100_000, 64, 0.001)
    assert split.counts[0] == 1 and split.counts[1] > 1 and not split.streamed
    monkeypatch.setattr(workloads, "memory_budget_bytes", lambda: 2**29)
    assert plan_split("spmm", arch, 100_000, 100_000, 64, 0.001).counts[0] > 1


def test_a_streamed_gemm_generates_tiles_and_memoises_them(monkeypatch):
    _budget(monkeypatch, 100_000)
    m, k, n = 2000, 16, 16
    r = api.simulate("gemm", TINY, m=m, k=k, n=n, seed=3)
    split = plan_split("gemm", TINY, m, k, n)
    assert split.streamed and split.counts[0] > 2
    notes = " ".join(r.notes)
    assert "streamed" in notes and "timing memoised: 2 distinct" in notes
    b = np.random.default_rng(3).standard_normal((k, n), dtype=np.float32)
    for m0, m1 in split.m_tiles():  # the tiles are the documented draws
        a = np.random.default_rng([3, m0]).standard_normal((m1 - m0, k), dtype=np.float32)
        assert_close(r.output[m0:m1], a.astype(np.float64) @ b.astype(np.float64))
    assert r.kernels[0].kernel == f"gemm x{split.counts[0] - 1}"
    _floors_hold(r)
    assert r.roofline.dram_cycles == pytest.approx(
        (m * k + k * n + m * n) * 4 / TINY.dram.bytes_per_cycle)


def test_a_streamed_gemm_on_a_systolic_array(monkeypatch):
    _budget(monkeypatch, 100_000)
    r = api.simulate("gemm", "systolic_32x32", m=2000, k=16, n=16)
    assert r.values_match_reference and "streamed" in " ".join(r.notes)
    assert "K panel(s) of 16 x 1 N block" in _split_note(r)  # a systolic array folds K and N


def test_a_streamed_spmm_and_the_tiling_of_uneven_rows(monkeypatch):
    # the mapper's tiles of uneven CSR rows: the allocation holds every buffer's largest
    # window, so a tile grows only while those fit (this kernel did not fit before)
    a, b = make_operands("spmm", 2000, 64, 16, 0.1)
    _, allocs = tile_and_allocate(lower_matmul(as_tensor(a), as_tensor(b)).kernels[0], TINY)
    assert max(x.base + x.words * (2 if x.streamed else 1) for x in allocs) \
        <= TINY.spm.capacity_words
    _budget(monkeypatch, 100_000)
    r = api.simulate("spmm", TINY, m=2000, k=64, n=16, density=0.1)
    assert r.values_match_reference and "streamed" in " ".join(r.notes)
    _floors_hold(r)


@pytest.mark.parametrize("granularity", ["32x1", "32x64"])
def test_dynamic_spmm_split_values_equal_numpy(granularity):
    # 32x1 runs N blocks inside one program while a 32-row panel of A fits half the SPM
    # (dataflow.dynamic.panel_gemm): a longer K splits it
    m, k, n = 64, 512 if granularity == "32x1" else 256, 48
    r = api.simulate("dynamic-spmm", SMALL, m=m, k=k, n=n, sparsity=0.8,
                     granularity=granularity)
    assert "K panel" in _split_note(r) and r.values_match_reference
    assert any(nt.startswith(f"granularity {granularity}") for nt in r.notes)
    _floors_hold(r)


def test_dynamic_spmm_streamed(monkeypatch):
    _budget(monkeypatch, 60_000)
    r = api.simulate("dynamic-spmm", TINY, m=192, k=32, n=16, sparsity=0.5,
                     granularity="32x1")
    assert r.values_match_reference and "streamed" in " ".join(r.notes)
    _floors_hold(r)


def test_too_large_even_streamed_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(workloads, "memory_budget_bytes", lambda: 2_000)
    with pytest.raises(UserError, match=r"gemm streamed tile \(--m \d+ of 10000000 --k 64 "
                                        r"--n 64\) and its simulation need .* of host "
                                        r"memory; the limit is"):
        api.simulate("gemm", m=10_000_000, k=64, n=64)


def test_hours_of_work_are_refused_up_front():
    with pytest.raises(UserError, match=r"MACs of host arithmetic to check its values; "
                                        "the limit is"):
        api.simulate("gemm", m=10**12, k=64, n=64)


def test_a_block_that_cannot_fit_the_spm_is_one_clear_error():
    with pytest.raises(UserError, match="not even a 64-column panel of A"):
        api.simulate("dynamic-spmm", TINY, m=64, k=128, n=64, granularity="32x64")


def test_choose_split_prefers_less_traffic():
    arch = api.resolve_arch("default")

    def fits(kp, nb):
        return kp * nb <= 1000

    # A costs a lot to re-read: cut K (C's partial sums) rather than N
    s = splitter.choose_split(arch, 1000, 100, 100, fits, traffic=(1e9, 1.0, 1.0))
    assert s.counts[2] == 1 and s.counts[1] > 1
    # C costs a lot to re-read: cut N rather than K
    s = splitter.choose_split(arch, 1000, 100, 100, fits, traffic=(1.0, 1.0, 1e9))
    assert s.counts[1] == 1 and s.counts[2] > 1
    assert s.k_panel * s.n_block <= 1000


def test_progress_shows_on_a_terminal_only():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    out, quiet = Tty(), io.StringIO()
    for stream in (out, quiet):
        p = splitter._Progress("gemm", 10, t0=-100.0, stream=stream)
        p.step(3)
        p.close()
    assert "gemm: tile 3/10" in out.getvalue() and quiet.getvalue() == ""


# --- attention: query-row blocks (docs/conventions.md#attention-of-any-size) ---------------

def test_attention_split_into_row_blocks_values_equal_numpy():
    from dataflow.attention.api import make_inputs
    from dataflow.attention.reference import attention_reference
    from dataflow.attention.split import plan_split as attention_split

    seq, dim = 512, 32
    x = make_inputs("window", seq, dim, 0)
    split = attention_split(TINY, x["pos"], x["crd"], seq, dim, dim)
    # K's packed window of a block takes at most half the SPM: (rows + 16) x 32 <= 2048 words
    assert split is not None and split.count > 2 and (split.rows + 16) * dim <= 2048
    assert attention_split(api.resolve_arch("default"), x["pos"], x["crd"], seq, dim,
                           dim) is None  # fits whole: runs exactly as before
    r = api.simulate("attention", TINY, seq=seq, dim=dim, pattern="window")
    assert r.values_match_reference
    assert_close(r.output, attention_reference(x["q"], x["k"], x["v"], x["pos"], x["crd"]))
    notes = " ".join(r.notes)
    assert f"cut into {split.count} block(s) of {split.rows} rows" in notes
    # first, interior and last blocks differ at the sequence's ends; the interior ones repeat
    assert "timing memoised: 3 distinct block programs simulated" in notes
    # four kernels a block (the normalisation is the SpMM's), three where the compiler folds
    # the row maximum into the scores (docs/conventions.md#attention-fold)
    names = [kr.kernel for kr in r.kernels]
    assert all(names.count(k) == split.count for k in ("sddmm", "softmax_exp", "spmm"))
    assert len(names) == 3 * split.count + names.count("softmax_max")
    _floors_hold(r)
    nnz, lanes = len(x["crd"]), TINY.pe_array.simd_lanes
    assert r.roofline.compute_cycles == nnz * 2 * dim / (TINY.pe_array.num_pes * lanes)


def test_attention_split_memo_equals_simulating_every_block(monkeypatch):
    from dataflow.attention import split as attention_split

    r = api.simulate("attention", TINY, seq=384, dim=32, pattern="dilated")
    fresh = iter(range(10**6))
    monkeypatch.setattr(attention_split, "_key",
                        lambda lp, lc, keys: next(fresh))  # every block its own: all simulated
    full = api.simulate("attention", TINY, seq=384, dim=32, pattern="dilated")
    assert "timing memoised" in " ".join(r.notes) and full.values_match_reference
    for field in ("cycles", "compute_cycles", "dram_bytes_read", "dram_bytes_written"):
        assert getattr(r, field) == getattr(full, field), field
    assert_close(r.output, full.output)


def test_attention_row_too_wide_for_the_spm_is_one_clear_error():
    with pytest.raises(UserError, match=r"row \d+ attends 512 keys, whose K and V rows "
                                        r"\(512 x 32 words\) need more than half"):
        api.simulate("attention", TINY, seq=512, dim=32, pattern="dense")


# --- relu-ffn: token blocks (docs/conventions.md#relu-ffn-and-moe-of-any-size) -------------

@pytest.mark.parametrize("granularity", ["32x1", "dense"])
def test_relu_ffn_split_into_token_blocks_values_equal_numpy(granularity):
    from dataflow.dynamic.ffn import ffn_reference, make_ffn_operands
    from dataflow.dynamic.ffn_split import plan_tokens

    tokens, dim, hidden = 256, 32, 64
    rows = plan_tokens(SMALL, granularity, tokens, dim, hidden)
    assert rows is not None and rows % 32 == 0 and rows < tokens
    assert plan_tokens(api.resolve_arch("default"), granularity, tokens, dim, hidden) is None
    r = api.simulate("relu-ffn", SMALL, tokens=tokens, dim=dim, hidden=hidden,
                     granularity=granularity)
    assert r.values_match_reference
    assert_close(r.output, ffn_reference(*make_ffn_operands(tokens, dim, hidden, 0.9)))
    blocks = -(-tokens // rows)
    assert f"cut into {blocks} block(s) of {rows}" in " ".join(r.notes)
    _floors_hold(r)


def test_relu_ffn_memo_equals_simulating_every_block(monkeypatch):
    from dataflow.dynamic import ffn_split

    args = dict(tokens=256, dim=32, hidden=64, granularity="32x1")
    r = api.simulate("relu-ffn", SMALL, **args)
    assert "timing memoised: 1 distinct" in " ".join(r.notes)  # the dead neurons set the index
    fresh = iter(range(10**6))
    monkeypatch.setattr(ffn_split, "_key", lambda *a: next(fresh))
    full = api.simulate("relu-ffn", SMALL, **args)
    for field in ("cycles", "compute_cycles", "dram_bytes_read", "dram_bytes_written", "macs"):
        assert getattr(r, field) == getattr(full, field), field
    assert_close(r.output, full.output)


def test_relu_ffn_weights_too_large_for_the_spm_is_one_clear_error():
    with pytest.raises(UserError, match=r"relu-ffn \(--dim 128 --hidden 256\) does not fit "
                                        r"the SPM .* even split into token blocks"):
        api.simulate("relu-ffn", TINY, tokens=64, dim=128, hidden=256)


# --- moe: token blocks (docs/conventions.md#relu-ffn-and-moe-of-any-size) -----------------

@pytest.mark.parametrize("placement", ["parallel", "sequential"])
def test_moe_split_into_token_blocks_values_equal_numpy(placement):
    from dataflow.moe.gating import make_moe_operands, moe_reference
    from dataflow.moe.split import plan_tokens

    args = dict(experts=4, top_k=2, tokens=600, dim=16, hidden=16)
    rows = plan_tokens(SMALL, 4, 2, 600, 16, 16, 0.0)
    # the combine's gathered outputs (rows x top_k x hidden) take at most half the SPM
    assert rows is not None and rows * 32 <= SMALL.spm.capacity_words // 2
    assert plan_tokens(api.resolve_arch("default"), 4, 2, 600, 16, 16, 0.0) is None
    r = api.simulate("moe", SMALL, placement=placement, **args)
    x, wg, bias, w = make_moe_operands(4, 600, 16, 16, 0.0, 0)
    assert r.values_match_reference
    assert_close(r.output, moe_reference(x, wg, bias, w, 2))
    blocks = -(-600 // rows)
    assert f"cut into {blocks} block(s) of {rows}" in " ".join(r.notes)
    assert r.cycles >= r.roofline_cycles > 0
    assert r.roofline.compute_cycles == 600 * (16 * 4 + 2 * (16 * 16 + 16)) / (
        SMALL.pe_array.num_pes * SMALL.pe_array.simd_lanes)


# --- butterfly / fft: streamed batch blocks (docs/conventions.md#butterfly-and-fft-over-any-batch)

@pytest.mark.parametrize("workload", ["fft", "butterfly"])
def test_a_batch_too_large_for_the_host_streams_blocks(monkeypatch, workload):
    from dataflow.butterfly import reference as bref
    from dataflow.butterfly.stream import block_rows

    monkeypatch.setattr(workloads, "memory_budget_bytes", lambda: 200_000)
    batch, n = 64, 64
    rows = block_rows(batch, n)
    assert rows is not None and 1 < rows < batch
    r = api.simulate(workload, batch=batch, n=n, seed=5)
    blocks = -(-batch // rows)
    notes = " ".join(r.notes)
    assert f"in {blocks} block(s) of {rows}" in notes and r.values_match_reference
    assert f"timing memoised: {2 if batch % rows else 1} distinct block size" in notes
    fs = bref.random_factors(n, np.random.default_rng(5))
    for b0 in range(0, batch, rows):  # the blocks are the documented draws
        x = np.random.default_rng([5, b0]).standard_normal(
            (min(batch, b0 + rows) - b0, n)).astype(np.float32)
        want = np.fft.fft(x) if workload == "fft" else bref.butterfly_apply(x, fs)
        got = r.output[b0:b0 + len(x)]
        if np.iscomplexobj(want):
            assert_close(np.stack([got.real, got.imag], -1), np.stack([want.real, want.imag], -1))
        else:
            assert_close(got, want)
    assert r.cycles >= r.roofline_cycles > 0
    one = api.simulate(workload, batch=rows, n=n)  # a block's floors, once per block
    assert r.roofline.compute_cycles == pytest.approx(
        one.roofline.compute_cycles * batch / rows)


def test_attention_split_leaves_room_for_the_row_maximum_levels():
    """Without an accmax unit (the MLX preset) the row maximum's doubling levels gather from a
    level buffer of about the entries, resident whole (dfg/row_max.py): where K and V fit but
    that buffer does not, the attention is split into row blocks whose entries fit, instead of
    the mapper refusing the row kernel (N:M at 128 keys a row on a 32 Ki-word SPM)."""
    import yaml

    from dataflow.arch import arch_from_dict
    from dataflow.attention.api import make_inputs
    from dataflow.attention.split import plan_split as attention_split
    from dataflow.dfg.row_max import level_words
    from tests.conftest import ARCH_DIR

    d = yaml.safe_load((ARCH_DIR / "mlx_4x4.yaml").read_text())
    d["spm"]["capacity_words_per_line"] = 4096
    small = arch_from_dict(d, source="<mlx_4x4, 4096 words a line>")
    seq, dim = 256, 32
    x = make_inputs("nm", seq, dim, 0)
    nnz, widest = len(x["crd"]), int(np.diff(x["pos"]).max())
    assert seq * dim <= small.spm.capacity_words // 2  # K and V fit whole
    assert level_words(nnz, widest) > small.spm.capacity_words  # the levels do not
    split = attention_split(small, x["pos"], x["crd"], seq, dim, dim)
    assert split is not None and split.count >= 2
    assert level_words(split.rows * widest, widest) < small.spm.capacity_words
    r = api.simulate("attention", small, seq=seq, dim=dim, pattern="nm")
    assert r.values_match_reference
    assert any(kr.kernel.startswith("softmax_max.rows") for kr in r.kernels)
    _floors_hold(r)
