"""Deeper tile buffers (`dram.tile_buffers`, docs/conventions.md#deeper-tile-buffers): closed
forms on hand-made tiles, the SPM room rule, the value check, and FNet seq 256 on mlx_4x4 (three
slots: at 0.9 of its roofline or better) against the same run double-buffered."""

import dataclasses
import math

import numpy as np
import pytest

import dataflow
from dataflow.arch import ArchError, load_arch
from dataflow.butterfly.ops import run_fnet_attention
from dataflow.pe_array.result import TileResult
from dataflow.pe_array.system import run_system, tile_buffer_counts
from tests.archs import variant

LAT, BW, RECONF = 100, 8.0, 32
TWO_ENGINES = {"dram.channels": 1, "dram.dma_engines": 2, "dram.latency_cycles": LAT,
               "dram.bytes_per_cycle": BW, "reconfiguration_cycles": RECONF}


def _tiles(n, compute, nbytes):
    return [("k", tuple(TileResult(kernel="k", index=i, iterations=1, compute_cycles=compute,
                                   stall_cycles_spm_conflict=0, dram_bytes_read=nbytes,
                                   dram_bytes_written=0,
                                   dram_transfers=(("x", "read", nbytes),))
                        for i in range(n)))]


def _with(arch, n):
    return dataclasses.replace(arch, dram=dataclasses.replace(arch.dram, tile_buffers=n))


def test_closed_form_loads_back_to_back_with_three_slots():
    arch = variant(**TWO_ENGINES)
    n, compute, nbytes = 6, 50, 1600
    stream = math.ceil(nbytes / BW)  # 200 cycles, longer than the latency plus a tile's compute
    double = run_system(_tiles(n, compute, nbytes), arch)
    # double buffering: each tile's load is issued once the previous one's has landed
    assert double.cycles == RECONF + n * (LAT + stream) + compute
    assert run_system(_tiles(n, compute, nbytes), arch, buffers=[2]) == double
    triple = run_system(_tiles(n, compute, nbytes), arch, buffers=[3])
    # two tiles' loads in flight: one pays the latency while the other streams, so the channel
    # never idles after the first latency
    assert triple.cycles == RECONF + LAT + n * stream + compute
    assert triple.stall_cycles_dram < double.stall_cycles_dram
    assert triple.cycles >= n * nbytes / BW  # never below the DRAM floor
    # a fourth slot adds nothing once the DMA streams without a gap
    assert run_system(_tiles(n, compute, nbytes), arch, buffers=[4]) == triple


def test_slots_need_room_in_the_spm():
    arch = _with(variant(**TWO_ENGINES), 4)
    cap = arch.spm.capacity_words
    # (slot words, words taken): room for two more, one more, none, a kernel without a slot
    assert tile_buffer_counts([(100, cap - 250), (100, cap - 150), (100, cap - 99), (0, 0)],
                              arch) == [4, 3, 2, 2]
    assert tile_buffer_counts([(100, 0)], _with(arch, 3)) == [3]
    assert tile_buffer_counts([(100, 0)], _with(arch, 2)) is None  # double buffering


def test_tile_buffers_validated():
    with pytest.raises(ArchError, match="tile_buffers"):
        variant(**{"dram.tile_buffers": 1})
    with pytest.raises(ArchError, match="tile_buffers"):
        variant(**{"dram.tile_buffers": 9})


def _fnet(arch):
    x = np.random.default_rng(3).standard_normal((256, 64)).astype(np.float32)
    y, res, _ = run_fnet_attention(x, arch)
    want = np.real(np.fft.fft2(x.astype(np.float64)))
    assert np.allclose(y, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
    assert res.cycles >= res.roofline_cycles
    return res


def test_fnet_256_on_mlx_with_three_slots():
    mlx = load_arch("arch_configs/mlx_4x4.yaml")
    assert mlx.dram.tile_buffers == 3
    three, two = _fnet(mlx), _fnet(_with(mlx, 2))
    # the DMA no longer waits for a tile's loads to land before the next tile's, nor for the
    # array to free a half of the double buffer: fewer cycles the array waits for DRAM
    assert three.stall_cycles_dram < two.stall_cycles_dram
    assert three.cycles < two.cycles
    assert three.roofline_cycles == two.roofline_cycles
    assert three.roofline_cycles / three.cycles >= 0.9 > two.roofline_cycles / two.cycles
    assert three.dram_bytes_read == two.dram_bytes_read


def test_array_programs_on_mlx_with_three_slots():
    """The array programs' system model (`pe_array.simulate._buffers`): window attention's
    kernels run ahead of the DMA latency too; values unchanged, never below the roofline."""
    mlx = load_arch("arch_configs/mlx_4x4.yaml")
    kw = {"pattern": "window", "seq": 128, "dim": 32}
    three = dataflow.simulate("attention", arch=mlx, **kw)
    two = dataflow.simulate("attention", arch=_with(mlx, 2), **kw)
    assert three.values_match_reference and two.values_match_reference
    assert two.roofline_cycles == three.roofline_cycles <= three.cycles < two.cycles
    assert three.dram_bytes_read == two.dram_bytes_read


def test_default_preset_keeps_double_buffering(monkeypatch):
    for preset in ("default", "systolic_32x32"):
        assert load_arch(f"arch_configs/{preset}.yaml").dram.tile_buffers == 2
    # with 2 no caller hands `run_system` slots: the double-buffered schedule, as before the
    # parameter (bench_roofline on default.yaml: every row's cycles unchanged)
    from dataflow.pe_array import system

    seen = []
    real = system.run_system
    monkeypatch.setattr(system, "run_system", lambda *a, **k: seen.append(
        k.get("buffers", a[3] if len(a) > 3 else None)) or real(*a, **k))
    default = load_arch("arch_configs/default.yaml")
    res = dataflow.simulate("attention", arch=default, pattern="window", seq=128, dim=32)
    assert res.values_match_reference and seen == [None]
