"""Store timing of butterfly stage kernels against the SPM lines
(docs/conventions.md#butterfly-stage-lines): values, floors, the direction of the effect and
the disk cache."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import dataflow.plan.orchestrate as orchestrate
from dataflow.arch import resolve_arch
from dataflow.butterfly import simulate as bsim
from dataflow.butterfly.ops import run_fft, run_fnet_attention
from dataflow.dfg.lower_butterfly import ButterflyKind, ButterflySpec, lower_butterfly
from dataflow.plan import stage_lines
from dataflow.plan.layout_cost import kernel_stalls
from dataflow.plan.stage_mapping import map_stage_kernel
from dataflow.testing import assert_close

from .conftest import ARCH_DIR

DEFAULT = ARCH_DIR / "default.yaml"
N, BATCH = 64, 128  # three radix-4 stage kernels whose stores collide on the default array


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAFLOW_CACHE_DIR", str(tmp_path))
    stage_lines._CHOICES.clear()
    return tmp_path


def _x():
    return np.random.default_rng(3).standard_normal((BATCH, N)).astype(np.float32)


def _plain(monkeypatch):
    monkeypatch.setattr(orchestrate, "choose_store_timing", lambda km, *a: km)


def test_values_match_numpy_above_the_floors_with_fewer_conflicts_than_plain(cache_dir,
                                                                          monkeypatch):
    x = _x()
    y, run = run_fft(x, DEFAULT)
    assert_close(y, np.fft.fft(x))
    timed = run.result
    assert timed.cycles >= timed.roofline_cycles
    for k in timed.kernels:
        assert k.fraction_of_roofline <= 1.0, (k.kernel, k.roofline, k.span_cycles)
    _plain(monkeypatch)
    y_plain, run_plain = run_fft(x, DEFAULT)
    plain = run_plain.result
    assert np.array_equal(y, y_plain)  # store timing moves issue cycles, never values
    assert timed.stall_cycles_spm_conflict < plain.stall_cycles_spm_conflict
    assert timed.compute_cycles < plain.compute_cycles
    assert timed.cycles < plain.cycles


def _stage_kernel(arch, index=1):
    """The mapped (plain) schedule of stage kernel `index` of the test FFT, and its tile rows."""
    spec = ButterflySpec(n=N, batch=BATCH, lanes=arch.pe_array.simd_lanes,
                         kind=ButterflyKind.FFT, bitrev_input=True, real_input=True)
    plan = orchestrate.plan_orchestration(spec, arch, "multilayer")
    c = plan.choice
    spec = dataclasses.replace(spec, skew_lines=c.skew_lines, skew_perm=c.skew_perm,
                               skew_flip=c.skew_flip)
    prog = lower_butterfly(spec, plan.groups, _x())
    k = prog.kernels[index]
    return map_stage_kernel(k, arch, c.tile_rows, c.entry_budget), c


def test_each_variant_is_legal_and_stagger_stores_removes_store_conflicts(cache_dir):
    arch = resolve_arch(DEFAULT)
    km, _ = _stage_kernel(arch)
    before = kernel_stalls(km, arch, stage_lines.SCORED_TILES)
    staggered = stage_lines.stagger_stores(km, arch)
    assert staggered is not km
    # only stores move, never earlier, and never off their PE
    old = {(p.copy, p.node): p for p in km.placements}
    for p in staggered.placements:
        o = old[(p.copy, p.node)]
        assert p.pe == o.pe and p.time >= o.time
        if p.time != o.time:
            assert km.kernel.nodes[p.node].op.writes_spm
    assert kernel_stalls(staggered, arch, stage_lines.SCORED_TILES) < before
    assert stage_lines.stage_cycles(staggered, arch) < stage_lines.stage_cycles(km, arch)


def test_near_copies_shift_whole_copies_and_fewer_copies_can_win(cache_dir):
    arch = resolve_arch(DEFAULT)
    km, c = _stage_kernel(arch, index=2)
    near = stage_lines.near_copies(km, arch)
    assert near is not km
    old = {(p.copy, p.node): p.time for p in km.placements}
    shift = {}
    for p in near.placements:  # every op of a copy moves by one whole number of IIs
        shift.setdefault(p.copy, set()).add(p.time - old[(p.copy, p.node)])
    assert all(len(d) == 1 and next(iter(d)) % km.ii == 0 for d in shift.values())
    assert any(next(iter(d)) for d in shift.values())
    assert stage_lines.stage_cycles(near, arch) < stage_lines.stage_cycles(km, arch)
    # fewer copies at the same II: fewer stores in flight, and the chosen variant here
    chosen = stage_lines.choose_store_timing(km, arch, c.tile_rows, c.entry_budget)
    assert chosen.copies < km.copies and chosen.ii <= km.ii
    assert stage_lines.stage_cycles(chosen, arch) < stage_lines.stage_cycles(near, arch)


def test_choice_is_cached_on_disk_and_a_corrupt_entry_is_remade(cache_dir, monkeypatch):
    arch = resolve_arch(DEFAULT)
    km, c = _stage_kernel(arch)
    chosen = stage_lines.choose_store_timing(km, arch, c.tile_rows, c.entry_budget)
    assert chosen is not km
    files = list((cache_dir / "stage_lines").glob("*.pkl"))
    assert len(files) == 1
    # a new process (empty memory) reads the choice back without searching
    stage_lines._CHOICES.clear()

    def no_search(*a):
        raise AssertionError("searched although the choice is on disk")

    monkeypatch.setattr(stage_lines, "_choose", no_search)
    again = stage_lines.choose_store_timing(km, arch, c.tile_rows, c.entry_budget)
    assert again.placements == chosen.placements and again.copies == chosen.copies
    # another program's kernel with the same body and addresses gets the choice bound to it
    other, _ = _stage_kernel(arch)
    assert other.kernel is not km.kernel
    assert stage_lines.choose_store_timing(other, arch, c.tile_rows,
                                           c.entry_budget).kernel is other.kernel
    # a flipped byte: the entry is ignored (deleted), the choice made again and rewritten
    blob = bytearray(files[0].read_bytes())
    blob[-5] ^= 0xFF
    files[0].write_bytes(bytes(blob))
    stage_lines._CHOICES.clear()
    calls = []
    monkeypatch.setattr(stage_lines, "_choose", lambda *a: calls.append(1) or chosen)
    remade = stage_lines.choose_store_timing(km, arch, c.tile_rows, c.entry_budget)
    assert calls == [1] and remade.placements == chosen.placements
    assert files[0].read_bytes() != bytes(blob)


def test_residency_dma_one_transfer_per_buffer_tables_packed_loads_with_configuration(
        cache_dir, monkeypatch):
    """The system side of a butterfly residency (docs/conventions.md#system-level): one DMA
    transfer per data buffer and direction, the coefficient tables in one packed transfer on
    the first tile, and the first tile's loads issued during the first configuration."""
    x = _x()
    arch = resolve_arch(DEFAULT)
    seen = []
    real = bsim.run_system

    def spy(seg_tiles, arch_, prefetch=None, buffers=None):
        seen.append((seg_tiles, prefetch))
        return real(seg_tiles, arch_, prefetch, buffers)

    monkeypatch.setattr(bsim, "run_system", spy)
    on = run_fft(x, arch)[1].result
    off_arch = dataclasses.replace(arch, dram=dataclasses.replace(
        arch.dram, prefetch_next_kernel=False))
    off = run_fft(x, off_arch)[1].result
    (tiles, prefetch), (_, no_prefetch) = seen
    first, second = tiles[0][1][0].dram_transfers, tiles[0][1][1].dram_transfers
    names = [b for b, _, _ in first]
    assert len(names) == len(set((b, k) for b, k, _ in first))  # one per buffer and direction
    assert names.count(bsim.TABLES) == 1 and bsim.TABLES not in [b for b, _, _ in second]
    assert prefetch[0] == {b for b, k, _ in first if k == "read"} and no_prefetch is None
    # the loads hide under the configuration: exactly its cycles saved (DRAM-bound FFT)
    assert 0 < off.cycles - on.cycles <= arch.reconfiguration_cycles


def test_fnet_passes_share_one_system_timeline(cache_dir):
    """Pass 2's configuration overlaps pass 1's last write-backs
    (`butterfly.simulate.back_to_back`): fewer cycles than the passes one after another,
    never below the floors, pass 2's kernels after pass 1's."""
    x = np.random.default_rng(4).standard_normal((64, 16)).astype(np.float32)
    y, res, (r1, r2) = run_fnet_attention(x, DEFAULT)
    assert_close(y, np.real(np.fft.fft2(x)))
    assert res.cycles < r1.result.cycles + r2.result.cycles
    assert res.cycles >= res.roofline_cycles
    n1 = len(r1.result.kernels)
    assert max(k.end_cycle for k in res.kernels[:n1]) <= min(
        k.start_cycle for k in res.kernels[n1:])
    assert max(k.end_cycle for k in res.kernels) <= res.cycles
    assert res.stall_cycles_spm_conflict == (r1.result.stall_cycles_spm_conflict
                                             + r2.result.stall_cycles_spm_conflict)
