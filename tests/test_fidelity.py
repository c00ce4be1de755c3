"""Fidelity (validation ladder steps 1-2) on generated programs.

- The reference stepper and the fast engine give identical results — every counter, every
  tile, output values bit for bit, and the whole SimResult — on 60 random programs (random
  DFG bodies, dense or CSR-sparse loops, gathers, one- and two-kernel programs) spread over
  seven architecture presets, plus matmuls whose sparse operand arrives in five UST formats,
  plus PIT's 1x64 program (SCATTER_ACC) on every preset, plus random programs on multi-issue
  PEs (`pe_array.issue_width` > 1: the mlx_4x4 preset and a 2 x 2 array at width 3).
- Cycles are never below the roofline bound max(MACs / peak, DRAM bytes / bandwidth).
- With ports to spare (no SPM conflict possible) every tile takes exactly the closed form
  (W - 1) * II + L, W = ceil(iterations / copies).
"""

import math

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.dfg.domain import num_iterations
from dataflow.mapper import map_program
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.testing import assert_close
from dataflow.ust_frontend import NamedFormats, Tensor
from dataflow.ust_frontend.ops import as_tensor, lower_matmul, matmul_reference
from tests.archs import FIDELITY_PRESETS as PRESETS
from tests.archs import fidelity_arch as arch
from tests.archs import variant
from tests.engine_checks import assert_engines_identical
from tests.engine_checks import assert_within_roofline as _roofline
from tests.programs import random_program

SEEDS = range(60)


@pytest.mark.parametrize("seed", SEEDS)
def test_engines_identical_on_random_programs(seed):
    name = list(PRESETS)[seed % len(PRESETS)]
    prog = random_program(seed)
    mapping = map_program(prog, arch(name))
    res = assert_engines_identical(mapping)
    _roofline(res, arch(name))


#: multi-issue PEs (docs/architecture.md#issue-width): the mlx_4x4 preset (issue_width 4) and
#: a 2 x 2 array at width 3, where several ops share a (PE, slot)
MULTI_ISSUE = ("mlx_4x4", "2x2-w3")


def _multi_issue_arch(name):
    if name == "mlx_4x4":
        from dataflow.arch import load_arch
        from tests.conftest import ARCH_DIR

        return load_arch(ARCH_DIR / "mlx_4x4.yaml")
    return variant(**{"pe_array.rows": 2, "pe_array.cols": 2, "pe_array.issue_width": 3})


@pytest.mark.parametrize("seed", range(1, 60, 5))
def test_engines_identical_on_random_programs_multi_issue(seed):
    """The random programs on multi-issue PEs: identical counters, values and SimResult."""
    name = MULTI_ISSUE[seed % len(MULTI_ISSUE)]
    a = _multi_issue_arch(name)
    assert a.pe_array.issue_width > 1
    res = assert_engines_identical(map_program(random_program(seed), a))
    _roofline(res, a)
    assert res.pe_utilization <= 1.0


@pytest.mark.parametrize("seed", range(0, 60, 4))
def test_engines_identical_on_held_loads(seed):
    """The random programs with every load that does not move with the innermost loop held
    (docs/conventions.md#held-loads): identical counters, values and SimResult; never more
    SPM reads than as lowered, and fewer where a load is held over iterations."""
    import dataclasses

    from dataflow.dfg.transform import hold_invariant_loads

    name = list(PRESETS)[seed % len(PRESETS)]
    prog = random_program(seed)
    lanes = arch(name).pe_array.simd_lanes
    held = dataclasses.replace(prog, kernels=tuple(hold_invariant_loads(k, lanes)
                                                   for k in prog.kernels))
    res = assert_engines_identical(map_program(held, arch(name)))
    _roofline(res, arch(name))
    plain = simulate_mapping(map_program(prog, arch(name)))
    assert np.array_equal(np.asarray(res.output), np.asarray(plain.output))
    assert res.spm_reads <= plain.spm_reads
    if any(n.hold for k in held.kernels for n in k.nodes) and seed in HOLDS_LESS:
        assert res.spm_reads < plain.spm_reads


#: corpus seeds whose held program reads the SPM less than as lowered (a load held over
#: more than one iteration of a copy)
HOLDS_LESS = (0, 4, 8, 12, 16)


FORMATS = {
    "COO": NamedFormats.COO, "CSR": NamedFormats.CSR, "CSC": NamedFormats.CSC,
    "DCSR": NamedFormats.DCSR, "BSR2x2": NamedFormats.BSR(2, 2),
}


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("preset", ["default", "2x2-1port"])
def test_engines_identical_on_formats(fmt, preset):
    rng = np.random.default_rng(len(fmt))
    a = sp.random(12, 10, density=0.3, format="csr", dtype=np.float32, random_state=rng)
    a.sort_indices()
    ta = Tensor.from_package(a, tensor_format=FORMATS[fmt])
    tb = as_tensor(rng.standard_normal((10, 9), dtype=np.float32))
    mapping = map_program(lower_matmul(ta, tb), arch(preset))
    res = assert_engines_identical(mapping)
    assert_close(res.output, matmul_reference(ta, tb))
    _roofline(res, arch(preset))


@pytest.mark.parametrize("preset", list(PRESETS))
def test_engines_identical_on_scatter_acc_programs(preset):
    """PIT's 1x64 program (index build, SRead gathers, SCATTER_ACC into C over two panels,
    gather-fetch DMA) on every preset: identical counters, values and SimResult."""
    from dataflow.dynamic import make_dynamic_operands
    from dataflow.dynamic.lower import lower_dynamic_spmm

    a, b = make_dynamic_operands(8, 128, 8, 0.6, "element", seed=len(preset))
    prog, _ = lower_dynamic_spmm(a, b, "1x64", panel_rows=4)
    res = assert_engines_identical(map_program(prog, arch(preset)))
    assert_close(res.output, (a.astype(np.float64) @ b).astype(np.float32))
    _roofline(res, arch(preset))


@pytest.mark.parametrize("seed", range(0, 60, 6))
def test_conflict_free_tiles_equal_the_closed_form(seed):
    roomy = variant(**{"spm.lines": 64, "spm.read_ports_per_line": 16,
                       "spm.write_ports_per_line": 16, "spm.capacity_words_per_line": 4096})
    prog = random_program(seed)
    mapping = map_program(prog, roomy)
    res = simulate_mapping(mapping)
    assert res.stall_cycles_spm_conflict == 0
    for km, kr in zip(mapping.kernels, res.kernels):
        lanes = roomy.pe_array.simd_lanes
        total = 0
        for _tile, tr in zip(km.tiles, kr.tiles):
            n = num_iterations(km.kernel, lanes) if len(km.tiles) == 1 else tr.iterations
            waves = math.ceil(n / km.copies)
            expected = (waves - 1) * km.ii + km.schedule_length if n else 0
            assert tr.compute_cycles == expected
            total += tr.iterations
        assert total == num_iterations(km.kernel, lanes)
