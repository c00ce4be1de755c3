"""FNet's passes on mlx_4x4 (docs/conventions.md#fnet-pass-boundaries): a residency's
intermediates in two SPM slots (one residency for the 1024-point sequence pass), a later
residency's tables loaded while the one before runs, and stage bodies scheduled with late
source loads and harder link negotiation where that lowers their II."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import dataflow.plan.orchestrate as orchestrate
from dataflow.arch import load_arch
from dataflow.butterfly.ops import run_fnet_attention
from dataflow.butterfly.simulate import TABLES, _first_loads, back_to_back, simulate_orchestrated
from dataflow.dfg.lower import live_kernel
from dataflow.dfg.lower_butterfly import ButterflySpec, group_kernel, lower_butterfly, split_stages
from dataflow.mapper.map import map_kernel
from dataflow.plan.orchestrate import map_butterfly, plan_orchestration, round_trips
from dataflow.plan.stage_mapping import _harder_links, _late_sources


@pytest.fixture(scope="module")
def mlx():
    return load_arch("arch_configs/mlx_4x4.yaml")


def _fnet(seq, dim, arch):
    x = np.random.default_rng(3).standard_normal((seq, dim)).astype(np.float32)
    y, res, runs = run_fnet_attention(x, arch)
    want = np.real(np.fft.fft2(x.astype(np.float64)))
    assert np.allclose(y, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
    assert res.cycles >= res.roofline_cycles
    return res, runs


def test_sequence_pass_of_1024_in_one_residency(mlx, monkeypatch):
    spec = ButterflySpec(n=1024, batch=64, lanes=8, kind="fft", bitrev_input=True,
                         real_output=True)
    assert round_trips(spec, mlx, "multilayer") == 1
    one, runs = _fnet(1024, 64, mlx)
    assert [len(r.system) for r in runs] == [1, 1]
    # without the ping-pong slots the SPM holds two of its four kernels: two residencies, the
    # intermediate's DRAM round trip, more cycles
    monkeypatch.setattr(orchestrate, "INTERMEDIATE_SLOTS", 10 ** 9)
    two, runs = _fnet(1024, 64, mlx)
    assert [len(r.system) for r in runs] == [1, 2]
    assert one.dram_bytes_read < two.dram_bytes_read and one.cycles < two.cycles


def test_later_tables_load_during_the_pass_before(mlx):
    res, (r1, r2) = _fnet(256, 64, mlx)
    tiles = [(f"p{j}.{n}", ts) for j, r in enumerate((r1, r2)) for n, ts in r.system]
    assert TABLES in _first_loads(tiles, mlx, [*r1.occupied, *r2.occupied])[1]
    # no room known for the pass before: the tables load after the configuration, later
    without = back_to_back([dataclasses.replace(r1, occupied=()), r2], mlx)
    assert res.cycles == back_to_back([r1, r2], mlx)[0] < without[0]


def test_late_sources_and_harder_links_lower_the_ii_and_engines_agree(mlx):
    spec = ButterflySpec(n=256, batch=8, lanes=8, kind="fft", bitrev_input=True,
                         real_output=True, skew_lines=8)
    groups = split_stages(spec.stages, 3)
    body = live_kernel(group_kernel(spec, groups[1], len(groups), 1))
    plain = map_kernel(body, mlx, max_tile_rows=1)
    late = _late_sources(body, mlx, 1, plain)
    assert plain.ii > plain.mii and late.ii < plain.ii
    # links over capacity at the MII with the default effort; 6 attempts of up to 60
    # PathFinder iterations map it there (II 5 -> 4 -> 3)
    assert late.ii > late.mii
    hard = _harder_links(body, mlx, 1, late)
    assert hard.ii == hard.mii < late.ii and hard.copies == late.copies
    # the sequence pass mapped with it: both engines agree, values as numpy
    x = (np.random.default_rng(4).standard_normal((8, 256))
         + 1j * np.random.default_rng(5).standard_normal((8, 256))).astype(np.complex64)
    spec = dataclasses.replace(spec, skew_lines=0)
    plan = plan_orchestration(spec, mlx, "multilayer", 3)
    spec = dataclasses.replace(spec, skew_lines=plan.choice.skew_lines,
                               skew_perm=plan.choice.skew_perm, skew_flip=plan.choice.skew_flip)
    om = map_butterfly(lower_butterfly(spec, plan.groups, x), spec, mlx, plan)
    assert om.mapping.kernels[1].ii == hard.ii
    fast, slow = simulate_orchestrated(om, "fast"), simulate_orchestrated(om, "reference")
    assert fast.result.to_dict() | {"engine": 0, "wall_seconds": 0} == \
        slow.result.to_dict() | {"engine": 0, "wall_seconds": 0}


def test_dram_bound_pass_takes_smaller_striped_tiles(mlx, monkeypatch):
    res, (r1, _) = _fnet(1024, 64, mlx)
    # pass 1 (the hidden FFT, DRAM bound): 4 token blocks a tile, the fewest whose 8 KB input
    # still streams over both channels, instead of 16
    assert len(r1.system[0][1]) == 32
    assert min(n for t in r1.system[0][1] for _, _, n in t.dram_transfers if n > 1024) >= 8192
    monkeypatch.setattr(orchestrate, "striped_rows", lambda spec, arch, rows, kms: rows)
    big, (b1, _) = _fnet(1024, 64, mlx)
    assert len(b1.system[0][1]) == 8 and res.cycles < big.cycles
