"""Line-aware schedules of the sparse kernels (docs/conventions.md#sparse-line-model): the
lane-sum blocking of SDDMM-like bodies and the line-aware copy delays of the modulo schedule.
Values equal numpy, the two engines agree, cycles never below the roofline, and each effect
goes the expected way."""

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.arch import load_arch
from dataflow.dfg import transform
from dataflow.dfg.graph import DFGError
from dataflow.dfg.lower_sddmm import lower_sddmm_csr, sddmm_csr_vector_kernel
from dataflow.dfg.ops import Op
from dataflow.mapper import map_program
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan.compile import choose_schedule, kernel_candidates
from tests.conftest import ARCH_DIR
from tests.engine_checks import assert_engines_identical

DEFAULT = load_arch(ARCH_DIR / "default.yaml")


def _sddmm(m=24, n=20, k=32, density=0.3, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    mask = sp.random(m, n, density=density, format="csr", dtype=np.float32, random_state=rng)
    want = (a.astype(np.float64) @ b)[mask.nonzero()] * mask.data
    return lower_sddmm_csr(a, b, mask.indptr, mask.indices, mask.data), want


def test_block_lane_sums_merges_the_chain_into_macs_and_one_sum():
    pos = np.array([0, 2, 3, 5])
    kern = sddmm_csr_vector_kernel(3, 64, 4, pos, 8)
    blocked = transform.block_lane_sums(kern, "c", 4)
    ops = [n.op for n in blocked.nodes]
    assert ops.count(Op.VSUM) == 1 and ops.count(Op.ACC) == 1
    assert ops.count(Op.MAC) == 3 and ops.count(Op.MUL) == 1
    assert ops.count(Op.GATHER) == 4 and ops.count(Op.LOAD) == 5  # the index, 4 rows of A
    assert next(lp for lp in blocked.loops if lp.var == "c").extent == 2
    with pytest.raises(DFGError):
        transform.block_lane_sums(kern, "c", 3)  # 8 chunks do not split by 3


def test_sddmm_is_vectorised_and_blocked_with_values_and_engines_equal():
    prog, want = _sddmm()
    cands = kernel_candidates(prog.kernels[0], DEFAULT)
    assert any(c.reduce_lanes == 8 and c.sum_blocks > 1 for c in cands)
    mapping, sched = choose_schedule(prog, DEFAULT)
    assert sched is not None and sched.kernels[0].reduce_lanes == 8
    res = assert_engines_identical(mapping)
    assert np.allclose(np.asarray(res.output), want, rtol=1e-4, atol=1e-4)
    assert res.cycles >= res.roofline_cycles
    plain = simulate_mapping(map_program(prog, DEFAULT))
    # 8 MACs a vector instead of one a cycle (the whole run is DRAM-bound at this size)
    assert res.compute_cycles * 2 < plain.compute_cycles
