"""The compiler's schedule transformations (dataflow/dfg/transform.py) and the GEMM schedule
search (dataflow/plan/compile.py), docs/conventions.md#register-blocking.

Each transformation: values unchanged (both engines, bit for bit against each other, and
against numpy), cycles never below the roofline, and its effect in the direction expected.
"""

import dataclasses

import numpy as np
import pytest

from dataflow.arch import load_arch
from dataflow.dfg import layout, transform
from dataflow.dfg.graph import Addr, DFGError, Kernel, Loop, Node
from dataflow.dfg.lower import lower_gemm
from dataflow.dfg.ops import Op
from dataflow.mapper import map_program
from dataflow.pe_array.semantics import operands, stored_value
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan.compile import choose_schedule
from dataflow.plan.gemm_schedule import (
    GemmSchedule,
    apply_gemm_schedule,
    compile_gemm,
    gemm_candidates,
)
from dataflow.plan.retime import stagger_flushes
from tests.archs import variant
from tests.conftest import ARCH_DIR
from tests.engine_checks import assert_engines_identical

DEFAULT = load_arch(ARCH_DIR / "default.yaml")


def _gemm(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    return a, b, lower_gemm(a, b)


def _run(program, arch=DEFAULT, engines=("fast",)):
    mapping = map_program(program, arch)
    results = [simulate_mapping(mapping, engine=e) for e in engines]
    return mapping, results


def _check_values(res, a, b):
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = np.asarray(res.output).reshape(want.shape)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4)


def _above_roofline(res):
    assert res.cycles >= res.roofline_cycles
    assert res.fraction_of_roofline <= 1.0


# --- semantics of the new op and operand forms --------------------------------------------------

def test_macc_stores_the_rounded_product_and_lane_selection_broadcasts():
    node = Node(2, Op.MACC, (0, 1), buffer="C", addr=Addr((("j", 1),)), lane=2)
    a = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)  # (iterations, lanes)
    b = np.array([[10.0, 20.0, 30.0, 40.0]], np.float32)
    assert operands(node, [a, b])[0].tolist() == [[3.0]]
    assert stored_value(node, [a, b], np.float32).tolist() == [[30.0, 60.0, 90.0, 120.0]]
    plain = dataclasses.replace(node, lane=None)
    assert stored_value(plain, [a, b], np.float32).tolist() == [[10.0, 40.0, 90.0, 160.0]]


def _tiny_kernel(nodes, vector_var="j"):
    return Kernel(name="t", loops=(Loop("i", 2), Loop("j", 8)), nodes=nodes,
                  buffers=(_buf("A", 64), _buf("C", 64, "output")), vector_var=vector_var)


def _buf(name, size, role="input"):
    from dataflow.dfg.graph import Buffer
    return Buffer(name, size, role)


def test_verify_refuses_lanes_on_other_ops_and_spans_on_other_accesses():
    load = Node(0, Op.LOAD, buffer="A", addr=Addr((("i", 8),), span=8))
    bad_lane = Node(1, Op.ADD, (0, 0), lane=1)
    store = Node(2, Op.STORE, (1,), buffer="C", addr=Addr((("i", 8), ("j", 1))))
    with pytest.raises(DFGError, match="select a lane"):
        _tiny_kernel((load, bad_lane, store)).verify()
    ok = _tiny_kernel((load, Node(1, Op.MUL, (0, 0), lane=1), store))
    ok.verify()
    span_store = Node(2, Op.STORE, (1,), buffer="C", addr=Addr((("i", 8),), span=8))
    with pytest.raises(DFGError, match="span"):
        _tiny_kernel((load, Node(1, Op.MUL, (0, 0), lane=1), span_store)).verify()


# --- each transformation ------------------------------------------------------------------------

def test_fuse_multiply_accumulate_merges_mul_into_acc():
    a, b, prog = _gemm(16, 24, 32)
    fused = transform.fuse_multiply_accumulate(prog.kernels[0])
    assert [n.op for n in fused.nodes] == [Op.LOAD, Op.LOAD, Op.MACC]
    assert fused.carried == ((2, 2, 1),)
    p2 = dataclasses.replace(prog, kernels=(fused,))
    m_plain, (plain,) = _run(prog)
    m_fused, _ = _run(p2)
    res = assert_engines_identical(m_fused)
    _check_values(res, a, b)
    _above_roofline(res)
    # one PE fewer per copy (here the SPM ports, two reads per copy, cap the copies at 16
    # either way): the same throughput from three quarters of the PEs, no slower
    fk, pk = m_fused.kernels[0], m_plain.kernels[0]
    assert len(fk.placements) / fk.copies == len(pk.placements) / pk.copies - 1
    assert fk.copies / fk.ii >= pk.copies / pk.ii
    assert res.cycles <= plain.cycles


def test_unroll_and_jam_shares_the_loads_that_do_not_depend_on_the_loop():
    a, b, prog = _gemm(16, 8, 16)
    kern = transform.fuse_multiply_accumulate(prog.kernels[0])
    blocked = transform.unroll_and_jam(kern, "i", 4, inner=True)
    loads = [n for n in blocked.nodes if n.op is Op.LOAD]
    maccs = [n for n in blocked.nodes if n.op is Op.MACC]
    assert len(maccs) == 4 and len(loads) == 5  # four rows of A, one shared row of B
    assert dict((lp.var, lp.extent) for lp in blocked.loops)["i"] == 4
    blocked_prog = dataclasses.replace(prog, kernels=(blocked,))
    res = assert_engines_identical(map_program(blocked_prog, DEFAULT))
    _check_values(res, a, b)
    outer = transform.unroll_and_jam(blocked, "j", 2, inner=False)
    assert sum(n.op is Op.MACC for n in outer.nodes) == 8
    outer_prog = dataclasses.replace(prog, kernels=(outer,))
    res = assert_engines_identical(map_program(outer_prog, DEFAULT))
    _check_values(res, a, b)


def test_unroll_and_jam_refuses_what_it_cannot_split():
    _, _, prog = _gemm(12, 8, 16)
    with pytest.raises(DFGError, match="not a multiple"):
        transform.unroll_and_jam(prog.kernels[0], "i", 8)
    with pytest.raises(DFGError, match="vector loop"):
        transform.unroll_and_jam(prog.kernels[0], "j", 2, inner=True)


def test_packed_panels_turn_eight_scalar_loads_into_one_row_load():
    a, b, prog = _gemm(16, 8, 16)
    sched = GemmSchedule(8, 1, pack_b=False, fuse=True)
    out = apply_gemm_schedule(prog, sched, 8)
    kern = out.kernels[0]
    spans = [n for n in kern.nodes if n.addr is not None and n.addr.span]
    assert len(spans) == 1 and spans[0].addr.span == 8
    assert sorted(n.lane for n in kern.nodes if n.op is Op.MACC) == list(range(8))
    # A's data is permuted into panels: element (r, c) at (r // 8) * 8k + c * 8 + r % 8
    packed = out.input_map["A"]
    assert packed[1 * 8 * 8 + 3 * 8 + 5] == a[8 + 5, 3]
    mapping = map_program(out, DEFAULT)
    res = assert_engines_identical(mapping)
    _check_values(res, a, b)
    _above_roofline(res)
    # one SPM row read brings eight rows' operands: far fewer reads than the unblocked body
    a, b, prog = _gemm(64, 32, 64)
    _, (blocked,) = _run(apply_gemm_schedule(prog, sched, 8))
    _, (plain,) = _run(prog)
    assert blocked.spm_reads < plain.spm_reads / 2


def test_column_panels_spread_the_b_stream_over_the_lines():
    """Unpacked, B's rows for one vector block sit n / 8 rows apart -- on one line when that is
    a multiple of the lines -- so six copies pile onto a few lines; packed, each copy walks
    through the lines in step and no line ever sees more accesses than it has ports."""
    a, b, prog = _gemm(96, 128, 128)
    unpacked = apply_gemm_schedule(prog, GemmSchedule(8, 1, pack_b=False, fuse=True), 8)
    packed = apply_gemm_schedule(prog, GemmSchedule(8, 1, pack_b=True, fuse=True), 8)
    _, (r_unpacked,) = _run(unpacked)
    m_packed, (r_packed,) = _run(packed)
    assert r_packed.stall_cycles_spm_conflict < r_unpacked.stall_cycles_spm_conflict
    _check_values(r_packed, a, b)
    small = apply_gemm_schedule(_gemm(16, 8, 16)[2], GemmSchedule(8, 1, True, True), 8)
    assert_engines_identical(map_program(small, DEFAULT))


def test_staggered_flushes_stay_legal_and_never_add_conflicts():
    a, b, prog = _gemm(96, 64, 128)
    out = apply_gemm_schedule(prog, GemmSchedule(8, 1, pack_b=True, fuse=True), 8)
    mapping = map_program(out, DEFAULT)
    km = mapping.kernels[0]
    moved = stagger_flushes(km, DEFAULT)
    times = {}
    for p in moved.placements:
        if km.kernel.nodes[p.node].op is Op.MACC:
            times.setdefault(p.copy, []).append(p.time)
    assert all(len(set(t)) == len(t) for t in times.values())
    before = simulate_mapping(mapping)
    after = simulate_mapping(dataclasses.replace(mapping, kernels=(moved,)))
    assert after.stall_cycles_spm_conflict < before.stall_cycles_spm_conflict
    _check_values(after, a, b)


# --- the search --------------------------------------------------------------------------------

def test_candidates_respect_the_shape_and_the_array():
    _, _, prog = _gemm(12, 8, 24)  # m = 12: rows 4, 2, 1; n / 8 = 3 vectors: cols 1 or 3
    cands = gemm_candidates(prog, DEFAULT)
    assert cands[0].plain
    assert {c.rows for c in cands[1:]} <= {4, 2, 1}
    assert {c.cols for c in cands[1:]} <= {1, 3}
    no_macc = variant(**{"pe_array.functional_units": [
        {"name": "lsu", "ops": ["load", "store", "gather", "scatter", "acc", "accmax",
                                "scatter_acc"], "latency_cycles": 1,
         "issue_interval_cycles": 1},
        {"name": "alu", "ops": ["add", "sub", "max", "route", "const"], "latency_cycles": 1,
         "issue_interval_cycles": 1},
        {"name": "mul", "ops": ["mul", "mac"], "latency_cycles": 2,
         "issue_interval_cycles": 1}]})
    assert not any(c.fuse for c in gemm_candidates(prog, no_macc))


def test_the_search_beats_the_plain_kernel_and_keeps_values():
    a, b, prog = _gemm(64, 64, 64)
    mapping, sched = compile_gemm(prog, DEFAULT)
    assert not sched.plain and sched.fuse
    res = simulate_mapping(mapping)
    _check_values(res, a, b)
    _above_roofline(res)
    _, (plain,) = _run(prog)
    assert res.cycles < plain.cycles / 2
    assert any("schedule:" in n for n in mapping.kernels[0].notes)


def test_an_architecture_without_macc_still_blocks_with_unfused_products():
    a, b, prog = _gemm(32, 16, 32)
    no_macc = variant(**{"pe_array.functional_units": [
        {"name": "lsu", "ops": ["load", "store", "acc"], "latency_cycles": 1,
         "issue_interval_cycles": 1},
        {"name": "alu", "ops": ["add", "sub", "max", "route", "const"], "latency_cycles": 1,
         "issue_interval_cycles": 1},
        {"name": "mul", "ops": ["mul", "mac"], "latency_cycles": 2,
         "issue_interval_cycles": 1}]})
    mapping, sched = choose_schedule(prog, no_macc)
    assert sched is None or not sched.gemm.fuse
    res = simulate_mapping(mapping)
    _check_values(res, a, b)
    assert all(n.op is not Op.MACC for n in mapping.kernels[0].kernel.nodes)


def test_the_frontend_plan_reapplies_the_schedule_to_new_values():
    from dataflow.ust_frontend.ops import as_tensor, matmul
    rng = np.random.default_rng(3)
    b = rng.standard_normal((32, 32), dtype=np.float32)
    for seed in (0, 1):  # the second call binds the cached plan to new values
        a = np.random.default_rng(seed).standard_normal((32, 32), dtype=np.float32)
        got = np.asarray(matmul(as_tensor(a), as_tensor(b), backend="sim").to_dense())
        assert np.allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_choices_and_mappings_are_kept_on_disk_and_a_damaged_file_is_ignored(tmp_path,
                                                                             monkeypatch):
    from dataflow.plan import retime

    monkeypatch.setenv("DATAFLOW_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(retime, "CHOICES", retime.BoundedCache(8))
    a, b, prog = _gemm(64, 32, 64)
    first, sched = compile_gemm(prog, DEFAULT)
    files = sorted(p.suffix for p in (tmp_path / "schedules").iterdir())
    assert files == [".json", ".mapping"]
    retime.CHOICES.clear()  # a new process: only the files remain
    again, sched2 = compile_gemm(prog, DEFAULT)
    assert sched2 == sched and "chosen earlier" in again.kernels[0].notes[-1]
    assert simulate_mapping(again).cycles == simulate_mapping(first).cycles
    for p in (tmp_path / "schedules").iterdir():  # one flipped byte in each
        blob = bytearray(p.read_bytes())
        blob[-3] ^= 0xFF
        p.write_bytes(bytes(blob))
    retime.CHOICES.clear()
    rebuilt, sched3 = compile_gemm(prog, DEFAULT)
    assert sched3 == sched and "best of" in rebuilt.kernels[0].notes[-1]
    res = simulate_mapping(rebuilt)
    _check_values(res, a, b)
    assert res.cycles == simulate_mapping(first).cycles


def test_padded_rows_keep_the_values():
    a, b, prog = _gemm(16, 16, 64)
    padded = layout.pad_rows(prog, "B", 16, 64, 8)
    assert padded.input_map["B"].size == 16 * 72
    assert padded.input_map["B"][72 + 3] == b[1, 3] and padded.input_map["B"][64] == 0
    res = assert_engines_identical(map_program(padded, DEFAULT))
    _check_values(res, a, b)
    with pytest.raises(DFGError, match="negative"):
        layout.pad_rows(prog, "B", 16, 64, -1)
