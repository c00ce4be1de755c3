"""Register blocks that share PEs (issue 13 point 6; docs/conventions.md#register-blocking):
`best_copies` (more copies of a body than the PEs hold at II = 1, at a longer II), the
line-aware `stagger_reads` and the fixed `skew_copies`, and C stored with a row pitch
(`layout.pitch_output_rows`) so a block's flushes spread over the lines.

Values equal numpy on both engines, cycles never below the roofline, and each effect in the
expected direction.
"""

import dataclasses

import numpy as np
import pytest

import dataflow
from dataflow.arch import load_arch
from dataflow.dfg import layout
from dataflow.dfg.graph import DFGError
from dataflow.dfg.lower import lower_gemm
from dataflow.mapper import map_program
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan.gemm_schedule import (
    GemmSchedule,
    apply_gemm_schedule,
    best_copies,
    body_nodes,
    c_pad,
    compile_gemm,
    gemm_candidates,
)
from dataflow.plan.retime import post_passes, skew_copies, stagger_flushes, stagger_reads
from tests.conftest import ARCH_DIR
from tests.engine_checks import assert_engines_identical

DEFAULT = load_arch(ARCH_DIR / "default.yaml")
MLX = load_arch(ARCH_DIR / "mlx_4x4.yaml")


def _gemm(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    return a, b, lower_gemm(a, b)


def _check(res, a, b):
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.allclose(np.asarray(res.output).reshape(want.shape), want, rtol=1e-4, atol=1e-4)
    assert res.cycles >= res.roofline_cycles


def test_best_copies_fills_the_pes_at_a_longer_ii():
    # an 8 x 1 block is 10 nodes: 6 copies on 64 PEs at II 1 (48 products a cycle); 32 copies
    # share them at II 5 (256 / 5 = 51.2); on MLX's 16 PEs one copy (8), 8 copies at II 5 (12.8)
    assert body_nodes(8, 1, True) == 10
    assert best_copies(10, 8, 2, DEFAULT) == (32, 5)
    assert best_copies(10, 8, 2, MLX) == (8, 5)
    for arch in (DEFAULT, MLX):
        pes = arch.pe_array.num_pes
        for rows, cols in ((8, 1), (8, 2), (4, 2)):
            nodes = body_nodes(rows, cols, True)
            copies, ii = best_copies(nodes, rows * cols, 1 + cols, arch)
            assert copies * nodes <= ii * pes  # the issue slots hold them
            assert copies * rows * cols / ii >= (pes // nodes) * rows * cols  # never fewer
    # the candidates carry the shared-PE variant with its C pitch
    _, _, prog = _gemm(64, 32, 64)
    shared = [c for c in gemm_candidates(prog, MLX) if c.copies]
    assert shared and all(c.copies > MLX.pe_array.num_pes // body_nodes(c.rows, c.cols, True)
                          for c in shared)
    assert all(c.pad_c == c_pad(c.rows, c.cols, 64, MLX) for c in shared)


def test_c_pad_spreads_a_blocks_accumulators_over_the_lines():
    lines, wpr = DEFAULT.spm.lines, DEFAULT.spm.words_per_row
    pad = c_pad(8, 1, 512, DEFAULT)
    assert pad and pad % wpr == 0
    rows = {(u * (512 + pad) // wpr) % lines for u in range(8)}
    assert len(rows) == 8  # without the pad all eight rows of C share one line
    assert len({(u * 512 // wpr) % lines for u in range(8)}) == 1
    assert c_pad(8, 1, 12, DEFAULT) == 0  # rows of C not whole SPM rows: no pad


def test_pitched_output_keeps_the_values_on_both_engines():
    a, b, prog = _gemm(16, 8, 24)
    pitched = layout.pitch_output_rows(prog, "C", 16, 24, 8)
    size = {buf.name: buf.size for buf in pitched.kernels[0].buffers}["C"]
    assert size == 16 * 32 and pitched.output_pitch == (("C", 24, 32),)
    flat = np.arange(16 * 32)
    assert np.array_equal(pitched.logical_output("C", flat),
                          flat.reshape(16, 32)[:, :24].ravel())
    res = assert_engines_identical(map_program(pitched, DEFAULT))
    _check(res, a, b)
    with pytest.raises(DFGError, match="pitched already"):
        layout.pitch_output_rows(pitched, "C", 16, 24, 8)
    with pytest.raises(DFGError, match="negative"):
        layout.pitch_output_rows(prog, "C", 16, 24, -8)


def _shared(m, k, n, arch, rows=8, cols=1):
    a, b, prog = _gemm(m, k, n)
    nodes = body_nodes(rows, cols, True)
    copies, _ = best_copies(nodes, rows * cols, 1 + cols, arch)
    sched = GemmSchedule(rows, cols, pack_b=True, fuse=True, copies=copies,
                         pad_c=c_pad(rows, cols, n, arch))
    out = apply_gemm_schedule(prog, sched, arch.pe_array.simd_lanes)
    return a, b, out, map_program(out, arch, copies=copies)


def test_skew_copies_moves_copy_c_by_c_whole_iis():
    _, _, _, mapping = _shared(32, 64, 64, MLX)
    km = mapping.kernels[0]
    assert km.ii > 1
    skewed = skew_copies(km, MLX)
    assert skewed is not km
    before = {(p.copy, p.node): p.time for p in km.placements}
    for p in skewed.placements:  # c IIs, not ceil(c / II) IIs
        assert p.time - before[(p.copy, p.node)] >= p.copy * km.ii


def test_staggered_reads_spread_a_slot_over_the_lines_and_keep_values():
    a, b, prog, mapping = _shared(64, 128, 128, DEFAULT, cols=2)
    km = stagger_flushes(mapping.kernels[0], DEFAULT)
    moved = stagger_reads(km, DEFAULT)
    assert moved is not km and any("row reads" in n for n in moved.notes)
    before = simulate_mapping(dataclasses.replace(mapping, kernels=(km,)))
    after = simulate_mapping(dataclasses.replace(mapping, kernels=(moved,)))
    assert after.stall_cycles_spm_conflict < before.stall_cycles_spm_conflict / 2
    _check(after, a, b)
    # the search keeps the best of the variants, measured
    _, best = post_passes(mapping.kernels[0], DEFAULT, prog)
    res = simulate_mapping(dataclasses.replace(mapping, kernels=(best,)))
    assert res.cycles <= after.cycles
    _check(res, a, b)


#: mlx_4x4 with single-issue PEs (pe_array.issue_width 1), where one copy per II-1 slot caps a
#: block at half the peak
MLX_SINGLE = dataclasses.replace(MLX, pe_array=dataclasses.replace(MLX.pe_array, issue_width=1))


def test_shared_pes_beat_the_one_copy_ceiling_on_mlx():
    # on single-issue PEs any block that fits 16 PEs at II 1 issues at most 8 products a cycle
    # (half the peak: 8 x 1, 4 x 2 and 2 x 4 are 10-13 nodes, one copy); sharing PEs goes past it
    a, b, prog = _gemm(64, 64, 64)
    mapping, sched = compile_gemm(prog, MLX_SINGLE)
    assert sched.copies > 1
    res = simulate_mapping(mapping)
    _check(res, a, b)
    assert res.fraction_of_roofline > 0.55


def test_multi_issue_mlx_beats_single_issue_on_gemm():
    """mlx_4x4's issue_width 4 (docs/architecture.md#issue-width): several copies of a block
    issue at II 1 (the loads and the maccs on their own units), past the shared-PE schedule of
    the single-issue array."""
    a, b, prog = _gemm(64, 64, 64)
    single = simulate_mapping(compile_gemm(prog, MLX_SINGLE)[0])
    mapping, _ = compile_gemm(prog, MLX)
    res = simulate_mapping(mapping)
    _check(res, a, b)
    assert res.cycles < single.cycles
    assert res.fraction_of_roofline > 0.65


def test_engines_agree_on_a_shared_pe_block():
    a, b, _, mapping = _shared(16, 16, 32, MLX)
    assert mapping.kernels[0].ii > 1 and mapping.program.output_pitch
    _check(assert_engines_identical(mapping), a, b)


def test_the_workload_reports_the_logical_c():
    r = dataflow.simulate("gemm", arch=MLX, m=32, k=32, n=64)
    assert r.values_match_reference and r.output.shape == (32, 64)
    assert r.cycles >= r.roofline_cycles


def test_a_pitched_output_moves_only_its_logical_words():
    """The pad words of C's row pitch stay on chip: the DMA writes m x n words, whatever the
    schedule chose, and a window of whole and part rows moves the logical words in it."""
    from dataflow.dfg.graph import Buffer, BufferRole

    b = Buffer("C", 4 * 11, BufferRole.OUTPUT, pitch=(8, 11))
    assert b.dma_words(0, b.size) == 32
    assert b.dma_words(0, 3 * 11 + 8) == 32  # the last row's pad is not in the window
    assert b.dma_words(5, 14) == 3 + 3  # columns 5..7 of row 0, 0..2 of row 1
    assert Buffer("D", 40).dma_words(3, 13) == 10
    for m, k, n in ((64, 64, 64), (96, 32, 200)):
        r = dataflow.simulate("gemm", "default", m=m, k=k, n=n)
        assert r.values_match_reference
        assert r.dram_bytes_written == 4 * m * n
