"""The check every engine test shares: the reference stepper and the fast engine agree."""

from __future__ import annotations

import numpy as np

from dataflow.pe_array.simulate import run_array, simulate_mapping


def assert_engines_identical(mapping):
    """Both engines on `mapping`: every counter of every kernel and tile, the whole SimResult
    and the output values bit for bit. Returns the fast engine's result."""
    refs, fasts = run_array(mapping, "reference"), run_array(mapping, "fast")
    for r, f in zip(refs, fasts):
        assert r.same_as(f) == [], f"kernel {r.kernel}: {r.same_as(f)} differ"
    r1, r2 = simulate_mapping(mapping, "reference"), simulate_mapping(mapping, "fast")
    assert r1.to_dict() | {"engine": 0} == r2.to_dict() | {"engine": 0}
    assert np.array_equal(r1.output, r2.output)
    return r2


def assert_within_roofline(res, arch):
    """Never fewer cycles than the roofline allows: MACs / peak, DRAM bytes / bandwidth, and
    the compute plus reconfiguration cycles."""
    assert res.cycles >= res.macs / res.peak_macs_per_cycle
    assert res.cycles >= res.dram_bytes / arch.dram.bytes_per_cycle
    assert res.cycles >= res.compute_cycles + res.stall_cycles_reconfiguration
