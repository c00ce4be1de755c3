"""Held loads (docs/conventions.md#held-loads): a load whose address does not move with the
innermost loop keeps its value in the PE's register and reads the SPM again only when the
address changes. Values equal numpy, cycles never below the roofline, the fast engine equals
the reference stepper, and a held kernel reads the SPM less than the same kernel un-held."""

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.arch import resolve_arch
from dataflow.dfg import transform
from dataflow.dfg.graph import Addr, Buffer, BufferRole, DFGError, Kernel, Loop, Node, Program
from dataflow.dfg.lower_sddmm import lower_sddmm_csr
from dataflow.dfg.ops import Op
from dataflow.mapper import map_program
from tests.engine_checks import assert_engines_identical

DEFAULT = resolve_arch("arch_configs/default.yaml")


def _row_times_column(hold: bool) -> Program:
    """C[i, j] = A[i] * B[i, j] over 3 x 4: A[i] is invariant over the innermost loop j."""
    nodes = (Node(0, Op.LOAD, buffer="A", addr=Addr((("i", 1),)), hold=hold),
             Node(1, Op.LOAD, buffer="B", addr=Addr((("i", 4), ("j", 1)))),
             Node(2, Op.MUL, (0, 1)),
             Node(3, Op.STORE, (2,), buffer="C", addr=Addr((("i", 4), ("j", 1)))))
    kern = Kernel("row_times_column", (Loop("i", 3), Loop("j", 4)), nodes,
                  (Buffer("A", 3), Buffer("B", 12), Buffer("C", 12, BufferRole.OUTPUT)))
    a = np.arange(1, 4, dtype=np.float32)
    b = np.arange(12, dtype=np.float32)
    return Program("row_times_column", (kern,), (("A", a), ("B", b)), (("C", (12,)),))


def test_a_held_load_reads_once_per_address_on_one_copy():
    """One copy, 12 iterations: the held A[i] is read 3 times (once per i), B 12 times; the
    same kernel un-held reads A 12 times. Values equal, both engines agree."""
    want = (np.arange(1, 4)[:, None] * np.arange(12).reshape(3, 4)).ravel()
    got = {}
    for hold in (False, True):
        res = assert_engines_identical(map_program(_row_times_column(hold), DEFAULT, copies=1))
        assert np.array_equal(np.asarray(res.output), want)
        assert res.cycles >= res.roofline_cycles
        got[hold] = res.spm_reads
    assert got[False] == 24 and got[True] == 15


def test_hold_invariant_loads_marks_what_does_not_move_with_the_innermost_loop():
    kern = _row_times_column(False).kernels[0]
    held = transform.hold_invariant_loads(kern)
    assert [n.hold for n in held.nodes] == [True, False, False, False]
    assert "held" in str(held.nodes[0])
    # only a load is held
    bad = dataclasses.replace(kern, nodes=(kern.nodes[0], dataclasses.replace(
        kern.nodes[1], op=Op.GATHER, hold=True), *kern.nodes[2:]))
    with pytest.raises(DFGError):
        bad.verify()
    # j of extent 1 does not move: i is the innermost moving loop, and A moves with it
    one = dataclasses.replace(kern, loops=(Loop("i", 3), Loop("j", 1)))
    assert transform.innermost_moving_loop(one) == "i"
    assert transform.hold_invariant_loads(one) is one


def _sddmm_blocked(hold: bool, m=24, n=40, k=64, density=0.2, seed=0):
    """An SDDMM with the reduction vectorised and all its chunks blocked into one body, so
    the row of A (8 vector loads) is invariant over the nonzeros p of its row."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    mask = sp.random(m, n, density=density, format="csr", dtype=np.float32, random_state=rng)
    want = (a.astype(np.float64) @ b)[mask.nonzero()] * mask.data
    prog = lower_sddmm_csr(a, b, mask.indptr, mask.indices, mask.data)
    kern = prog.kernels[0]
    split = transform.split(kern, kern.loops[-1].var, 8)
    body = transform.vectorise_reduction(split, split.loops[-1].var)
    body = transform.block_lane_sums(body, body.loops[-2].var, k // 8)
    if hold:
        body = transform.hold_invariant_loads(body, 8)
        assert sum(nd.hold for nd in body.nodes) == k // 8  # the row of A
    return dataclasses.replace(prog, kernels=(body,)), want


def test_sddmm_row_of_a_is_held_with_fewer_reads_and_engines_equal():
    got = {}
    for hold in (False, True):
        prog, want = _sddmm_blocked(hold)
        res = assert_engines_identical(map_program(prog, DEFAULT))
        assert np.allclose(np.asarray(res.output), want, rtol=1e-4, atol=1e-4)
        assert res.cycles >= res.roofline_cycles
        got[hold] = res
    assert got[True].spm_reads < got[False].spm_reads
    assert got[True].cycles <= got[False].cycles


def _operands(m=24, n=40, k=64, density=0.2, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    mask = sp.random(m, n, density=density, format="csr", dtype=np.float32, random_state=rng)
    return a, b, mask.indptr, mask.indices, mask.data


def test_block_lane_sums_as_a_tree_pairs_the_products_and_scales_once():
    """The tree: 4 muls and 4 macs in pairs, 3 adds, one lane sum and the mask value once
    after it (the chain scales every product's first operand: 4 nodes more); values equal."""
    a, b, pos, crd, val = _operands()
    want = (a.astype(np.float64) @ b)[sp.csr_matrix((val, crd, pos)).nonzero()] * val
    prog = lower_sddmm_csr(a, b, pos, crd, val)
    base = transform.vectorise_reduction(transform.split(prog.kernels[0], "kk", 8), "kki")
    tree = transform.block_lane_sums(base, "kko", 8, tree=True)
    chain = transform.block_lane_sums(base, "kko", 8)
    ops = [n.op for n in tree.nodes]
    assert (ops.count(Op.MUL), ops.count(Op.MAC), ops.count(Op.ADD)) == (5, 4, 3)
    assert ops.count(Op.VSUM) == 1 and len(tree.nodes) == len(chain.nodes) - 4
    held = dataclasses.replace(prog, kernels=(transform.hold_invariant_loads(tree, 8),))
    res = assert_engines_identical(map_program(held, DEFAULT))
    assert np.allclose(np.asarray(res.output), want, rtol=1e-4, atol=1e-4)


def test_late_sources_shorten_register_lifetimes_to_map_at_ii_1():
    """The tree body with the row of A held: one copy maps at II 1 only with source loads
    issued late (early, a load's value waits on its consumer's PE for the gathers and the
    products before it, past the register file)."""
    from dataflow.mapper.map import map_kernel
    from dataflow.mapper.mapping import MappingError
    from dataflow.plan.compile import KernelSchedule, apply_kernel_schedule

    a, b, pos, crd, val = _operands(m=64, n=256, density=0.05)
    prog = lower_sddmm_csr(a, b, pos, crd, val)
    sched = KernelSchedule(reduce_lanes=8, sum_blocks=8, sum_tree=True, hold=8)
    body = apply_kernel_schedule(prog.kernels[0], sched)
    late = map_kernel(body, DEFAULT, copies=1, late_sources=True, max_ii_slack=0)
    assert late.ii == 1
    with pytest.raises(MappingError, match="registers"):
        map_kernel(body, DEFAULT, copies=1, max_ii_slack=0)


def test_sddmm_compiles_to_the_held_row_schedule_faster_than_without(tmp_path, monkeypatch):
    """`choose_schedule` picks a held-row schedule for the SDDMM (the row of A held, the whole
    reduction in one body); values equal numpy, both engines agree, never below the roofline,
    and fewer compute cycles than the best schedule without held rows."""
    from dataflow.cachefiles import ENV_VAR, BoundedCache
    from dataflow.pe_array.simulate import simulate_mapping
    from dataflow.plan import compile as plan_compile
    from dataflow.plan import retime

    monkeypatch.setenv(ENV_VAR, str(tmp_path))  # no schedule chosen earlier
    monkeypatch.setattr(retime, "CHOICES", BoundedCache(16))

    a, b, pos, crd, val = _operands(m=128, n=512, density=0.03)
    want = (a.astype(np.float64) @ b)[sp.csr_matrix((val, crd, pos)).nonzero()] * val
    prog = lower_sddmm_csr(a, b, pos, crd, val)
    mapping, sched = plan_compile.choose_schedule(prog, DEFAULT)
    assert sched.kernels[0].hold and sched.kernels[0].sum_blocks == 8
    assert mapping.program.output_order  # a fused macc into C still lets the rows be ordered
    res = assert_engines_identical(mapping)
    assert np.allclose(np.asarray(res.output), want, rtol=1e-4, atol=1e-4)
    assert res.cycles >= res.roofline_cycles
    monkeypatch.setattr(plan_compile, "_held_row_candidates", lambda *args: [])
    monkeypatch.setattr(retime, "CHOICES", BoundedCache(16))
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "without"))
    without, sched = plan_compile.choose_schedule(prog, DEFAULT)
    assert not sched.kernels[0].late_sources  # no held-row schedule
    assert res.compute_cycles < simulate_mapping(without).compute_cycles
