"""Timing against closed forms and bounds (validation ladder step 2)."""

import math

import numpy as np
import pytest

import dataflow
from dataflow.dfg.lower import lower_gemm
from dataflow.mapper import map_program
from dataflow.pe_array.simulate import simulate_mapping
from tests.archs import variant


@pytest.mark.parametrize("workload, dims", [("gemm", (32, 16, 64)), ("spmm", (64, 64, 32)),
                                            ("gemm", (7, 9, 5))])
def test_cycles_never_below_roofline(default_arch, workload, dims):
    m, k, n = dims
    r = dataflow.simulate(workload, arch=default_arch, m=m, k=k, n=n, density=0.2)
    compute_bound = r.macs / r.peak_macs_per_cycle
    dram_bound = r.dram_bytes / default_arch.dram.bytes_per_cycle
    assert r.cycles >= max(compute_bound, dram_bound)
    assert r.cycles >= r.compute_cycles + r.stall_cycles_reconfiguration
    assert r.values_match_reference


def test_conflict_free_steady_state_equals_closed_form():
    """With ports to spare no access ever waits: each tile takes exactly (W - 1) * II + L."""
    arch = variant(**{"spm.lines": 64, "spm.read_ports_per_line": 8,
                      "spm.write_ports_per_line": 8, "spm.capacity_words_per_line": 4096})
    rng = np.random.default_rng(0)
    m, k, n = 24, 10, 16
    prog = lower_gemm(rng.standard_normal((m, k), dtype=np.float32),
                      rng.standard_normal((k, n), dtype=np.float32))
    mapping = map_program(prog, arch)
    km = mapping.kernels[0]
    res = simulate_mapping(mapping)
    assert res.stall_cycles_spm_conflict == 0
    lanes = arch.pe_array.simd_lanes
    for tile, tr in zip(km.tiles, res.kernels[0].tiles):
        n_iter = (tile.hi - tile.lo) * math.ceil(n / lanes) * k
        waves = math.ceil(n_iter / km.copies)
        assert tr.iterations == n_iter
        assert tr.compute_cycles == (waves - 1) * km.ii + km.schedule_length


def test_dram_bound_when_bandwidth_is_tiny():
    """Starve DRAM: the total approaches bytes / bandwidth and the stalls say why."""
    arch = variant(**{"dram.bytes_per_cycle": 0.5})
    r = dataflow.simulate("gemm", arch=arch, m=16, k=16, n=16)
    assert r.cycles >= r.dram_bytes / 0.5
    assert r.stall_cycles_dram > r.compute_cycles


def test_spmm_cycles_track_density(default_arch):
    lo = dataflow.simulate("spmm", arch=default_arch, m=64, k=64, n=16, density=0.05)
    hi = dataflow.simulate("spmm", arch=default_arch, m=64, k=64, n=16, density=0.4)
    assert hi.macs > 4 * lo.macs
    assert hi.compute_cycles > 2 * lo.compute_cycles


def test_systolic_compute_cycles_closed_form(systolic_arch):
    from dataflow.pe_array.systolic import closed_form_cycles

    rng = np.random.default_rng(0)
    for df in ("os", "ws", "is"):
        a = rng.standard_normal((70, 40), dtype=np.float32)
        b = rng.standard_normal((40, 90), dtype=np.float32)
        r = simulate_mapping(map_program(lower_gemm(a, b), systolic_arch, dataflow=df))
        assert r.compute_cycles == closed_form_cycles(df, 70, 90, 40, 32, 32)
        assert r.compute_cycles + 1 >= r.macs / (32 * 32)
