"""The SDDMM on an array without a lane-sum unit (the MLX preset): lane sums as lane-selecting
multiplies (docs/conventions.md#lane-select-sums) and the row-blocked lane partials
(docs/conventions.md#row-blocked-lane-partials). Values equal numpy, the fast engine equals the
reference stepper, cycles never below the roofline, and the compiler's new schedule runs in
fewer cycles than the lane-partials schedule it replaces."""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp

from dataflow.arch import load_arch
from dataflow.dfg import transform
from dataflow.dfg.block_partials import applies, block_partial_sums
from dataflow.dfg.lane_partials import lane_partial_sums
from dataflow.dfg.lane_select import lane_select_sums
from dataflow.dfg.lower_sddmm import lower_sddmm_csr
from dataflow.dfg.ops import Op
from dataflow.mapper import map_program
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan import compile as plan_compile
from tests.conftest import ARCH_DIR
from tests.engine_checks import assert_engines_identical

MLX = load_arch(ARCH_DIR / "mlx_4x4.yaml")
PARTIAL_ROWS = plan_compile._partial_row_candidates


def _operands(m=16, n=64, k=32, density=0.15, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    mask = sp.random(m, n, density=density, format="csr", dtype=np.float32, random_state=rng)
    pos, crd, val = mask.indptr, mask.indices, mask.data
    want = (a.astype(np.float64) @ b)[sp.csr_matrix((val, crd, pos)).nonzero()] * val
    return lower_sddmm_csr(a, b, pos, crd, val), want


def test_lane_select_sums_replace_the_lane_sum_and_engines_agree():
    """The row-blocked tree body (k = 32: 4 chunks) with its lane sum as 8 lane-selecting
    multiplies by the mask value and a tree of 7 adds: no vsum, one acc into C, the row of A
    held; values equal numpy on the MLX preset, both engines identical."""
    prog, want = _operands()
    base = transform.vectorise_reduction(transform.split(prog.kernels[0], "kk", 8), "kki")
    tree = transform.block_lane_sums(base, "kko", 4, tree=True)
    body = transform.hold_invariant_loads(lane_select_sums(tree, 8), 8)
    ops = [n.op for n in body.nodes]
    assert Op.VSUM not in ops and ops.count(Op.ACC) == 1
    lane_muls = [n for n in body.nodes if n.op is Op.MUL and n.lane is not None]
    assert sorted(n.lane for n in lane_muls) == list(range(8))
    assert {body.nodes[n.inputs[1]].buffer for n in lane_muls} == {"M_val"}
    assert sum(n.hold for n in body.nodes) == 4  # the row of A
    res = assert_engines_identical(map_program(dataclasses.replace(prog, kernels=(body,)), MLX))
    assert np.allclose(np.asarray(res.output), want, rtol=1e-4, atol=1e-4)
    assert res.cycles >= res.roofline_cycles


def test_store_once_only_where_each_word_is_written_once():
    """The blocked body's accumulation into C[p] (one write a nonzero) becomes a store; the
    unblocked kernel's (the chunk loop of 4 still moving) and the lane partials' stay."""
    from dataflow.dfg.lane_select import store_once

    prog, _ = _operands()
    base = transform.vectorise_reduction(transform.split(prog.kernels[0], "kk", 8), "kki")
    assert store_once(base) is base
    blocked = store_once(lane_select_sums(transform.block_lane_sums(base, "kko", 4, tree=True),
                                          8))
    assert [n.op for n in blocked.nodes if n.op.writes_spm] == [Op.STORE]
    k1 = lane_partial_sums(prog, 8).kernels[0]
    assert store_once(k1) is k1  # accumulated over the chunk loop


def test_block_partial_sums_merge_the_chunks_and_engines_agree():
    """The lane partials' vector kernel with its chunk loop in one body: 4 products as 2 muls
    and 2 macs, one add, one acc per nonzero; the program's values equal numpy, engines
    identical."""
    prog, want = _operands()
    split = lane_partial_sums(prog, 8)
    k1 = split.kernels[0]
    assert applies(k1) and not applies(split.kernels[1])
    body = transform.hold_invariant_loads(block_partial_sums(k1, k1.loops[-2].var, 4), 8)
    ops = [n.op for n in body.nodes]
    assert (ops.count(Op.MUL), ops.count(Op.MAC), ops.count(Op.ADD), ops.count(Op.ACC)) \
        == (2, 2, 1, 1)
    prog2 = dataclasses.replace(split, kernels=(body, *split.kernels[1:]))
    res = assert_engines_identical(map_program(prog2, MLX))
    assert np.allclose(np.asarray(res.output), want, rtol=1e-4, atol=1e-4)
    assert res.cycles >= res.roofline_cycles


def test_mlx_sddmm_picks_lane_select_faster_than_lane_partials(tmp_path, monkeypatch):
    """`choose_schedule` on the MLX preset compiles the SDDMM as one kernel with lane-select
    sums (not split into lane partials); both engines agree on the chosen mapping, values
    equal numpy, cycles above the roofline and below the lane-partials schedule that was
    chosen before."""
    from dataflow.cachefiles import ENV_VAR, BoundedCache
    from dataflow.plan import retime

    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    monkeypatch.setattr(retime, "CHOICES", BoundedCache(16))
    prog, want = _operands(m=48, n=256, k=64, density=0.04)
    mapping, sched = plan_compile.choose_schedule(prog, MLX)
    assert not sched.lane_partials and sched.kernels[0].lane_select
    assert [km.kernel.name for km in mapping.kernels] == ["sddmm_csr"]
    # each result written once: a store, no accumulation (`lane_select.store_once`)
    writes = [n for n in mapping.kernels[0].kernel.nodes if n.op.writes_spm]
    assert [(n.op, n.buffer) for n in writes] == [(Op.STORE, "C_val")]
    res = assert_engines_identical(mapping)  # as chosen: copies sharing PEs, line order
    assert np.allclose(np.asarray(res.output), want, rtol=1e-4, atol=1e-4)
    assert res.cycles >= res.roofline_cycles
    # the old schedule: lane partials, their vector kernel one chunk an iteration
    monkeypatch.setattr(plan_compile, "lane_select_candidates", lambda *args: [])
    monkeypatch.setattr(plan_compile, "_partial_row_candidates", lambda *args: [])
    monkeypatch.setattr(retime, "CHOICES", BoundedCache(16))
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "old"))
    old, old_sched = plan_compile.choose_schedule(prog, MLX)
    assert old_sched.lane_partials
    old_res = simulate_mapping(old)
    assert res.cycles < old_res.cycles
    # the row-blocked partials alone already beat it
    monkeypatch.setattr(plan_compile, "_partial_row_candidates", PARTIAL_ROWS)
    monkeypatch.setattr(retime, "CHOICES", BoundedCache(16))
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "rows"))
    rows, rows_sched = plan_compile.choose_schedule(prog, MLX)
    assert rows_sched.lane_partials and rows_sched.kernels[0].sum_blocks == 8
    rows_res = simulate_mapping(rows)
    assert np.allclose(np.asarray(rows_res.output), want, rtol=1e-4, atol=1e-4)
    assert res.cycles < rows_res.cycles < old_res.cycles


def test_a_vector_kernel_with_lane_sums_gets_lane_select_candidates():
    """A kernel already vectorised (its lane sums present) on the MLX preset: the candidates
    apply to it as it is (not to its devectorised form) and leave no lane sum."""
    from dataflow.dfg.lower_sddmm import sddmm_csr_vector_kernel

    kern = sddmm_csr_vector_kernel(4, 32, 16, np.array([0, 3, 5, 5, 9]), 8)
    cands = [c for c in plan_compile.kernel_candidates(kern, MLX) if c.lane_select]
    assert cands and not any(c.devectorise or c.reduce_lanes for c in cands)
    for c in cands:
        body = plan_compile.apply_kernel_schedule(kern, c)
        assert not any(n.op is Op.VSUM for n in body.nodes)
