"""A vectorised reduction without a lane-sum unit (docs/conventions.md#lane-partial-sums):
`dfg.lane_partials` splits it into a vector kernel into lane partials and a lane-sum kernel,
chosen only on an array without `vsum` (the MLX preset). Values within fp32 tolerances of
numpy, cycles above the roofline, fewer cycles than the scalar (devectorised) reduction."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.arch import load_arch
from dataflow.dfg.lane_partials import applies, lane_partial_kernels
from dataflow.dfg.lower_sddmm import lower_sddmm_csr, sddmm_csr_vector_kernel
from dataflow.dfg.ops import Op
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan.compile import choose_schedule
from dataflow.testing import values_match
from dataflow.ust_frontend.sddmm_op import Sddmm
from tests.conftest import ARCH_DIR

MLX = ARCH_DIR / "mlx_4x4.yaml"


def _operands(m=24, n=40, k=32, density=0.2, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    mask = sp.random(m, n, density=density, format="csr", dtype=np.float32, random_state=rng)
    return a, b, mask


def test_the_split_is_a_vector_accumulation_and_a_lane_sum():
    pos = np.array([0, 6, 9, 9, 19])  # 19 results: two whole vectors and 3 more
    k1, k2, k3 = lane_partial_kernels(sddmm_csr_vector_kernel(4, 32, 9, pos, 8), 8)
    assert not any(n.op is Op.VSUM for n in k1.nodes)
    acc = next(n for n in k1.nodes if n.op is Op.ACC)
    assert acc.buffer == "C_val_lanes" and acc.addr.coef("l") == 1 and acc.addr.coef("p") == 8
    assert k2.vector_var == "ei" and len(k2.nodes) == 16  # 8 rows, 7 adds, one acc
    assert [lp.extent for lp in k2.loops] == [2, 8]
    assert [lp.extent for lp in k3.loops] == [3, 8] and k3.vector_var is None
    assert k2.nodes[3].addr.coef("ei") == 8 and k2.nodes[3].addr.const == 3  # partial 3
    assert k3.buffer_map["C_val"].size == 19 and k3.buffer_map["C_val_lanes"].size == 152
    assert not applies(k2, 8) and not applies(k3, 8)  # not applied twice


def test_the_default_preset_keeps_its_lane_sums():
    a, b, mask = _operands()
    prog = lower_sddmm_csr(a, b, mask.indptr, mask.indices, mask.data)
    mapping, sched = choose_schedule(prog, load_arch(ARCH_DIR / "default.yaml"))
    assert sched is None or not sched.lane_partials
    assert [km.kernel.name for km in mapping.kernels] == ["sddmm_csr"]


def test_mlx_sddmm_values_and_cycles(monkeypatch):
    """The lane-partials path (the frontend SDDMM now compiles to one kernel with lane-select
    sums, docs/conventions.md#lane-select-sums: those candidates off here)."""
    from dataflow.plan import compile as plan_compile

    monkeypatch.setattr(plan_compile, "lane_select_candidates", lambda *args: [])
    arch = load_arch(MLX)
    a, b, mask = _operands()
    op = Sddmm(a, b, mask)
    op.plan(arch=arch, backend="sim", cache=False)
    assert op._plan.schedule is not None and op._plan.schedule.lane_partials
    assert values_match(op.execute("sim").entries()[1], op.execute("numpy").entries()[1])
    res = op.last_result
    assert [k.kernel for k in res.kernels][:2] == ["sddmm_csr", "sddmm_csr.lanes"]
    assert res.cycles >= res.roofline_cycles
    # the scalar reduction it replaces: one term per iteration
    prog = lower_sddmm_csr(a, b, mask.indptr, mask.indices, mask.data)
    from dataflow.plan.compile import _compile_kernels

    scalar, _ = _compile_kernels(prog, arch, {})
    assert res.compute_cycles < simulate_mapping(scalar).compute_cycles


@pytest.mark.parametrize("k", [20, 8])
def test_a_reduction_that_does_not_split_stays_as_it_is(k):
    """k not a multiple of the lanes, or one vector only: the scalar kernel, as before."""
    a, b, mask = _operands(k=k)
    prog = lower_sddmm_csr(a, b, mask.indptr, mask.indices, mask.data)
    mapping, sched = choose_schedule(prog, load_arch(MLX))
    assert sched is None or not sched.lane_partials
    res = simulate_mapping(mapping)
    want = Sddmm(a, b, mask).execute("numpy").entries()[1]
    assert values_match(np.asarray(res.output).ravel(), want)


def test_the_mask_value_is_multiplied_once_after_the_lane_sum():
    """The SDDMM's every term is multiplied by M[p], the result's own word: the vector kernel
    accumulates A * B alone and the lane-sum kernels multiply each result once."""
    a, b, mask = _operands(n=40, k=32)
    prog = lower_sddmm_csr(a, b, mask.indptr, mask.indices, mask.data)
    k1, *sums = lane_partial_kernels(prog.kernels[0], 8)
    assert "M_val" not in k1.buffer_map and sum(n.op is Op.MUL for n in k1.nodes) == 1
    for k in sums:
        assert "M_val" in k.buffer_map and any(n.op is Op.MUL for n in k.nodes)
    assert len(sums[0].nodes) == 18  # 8 rows, 7 adds, the mask's row, a mul, the acc
