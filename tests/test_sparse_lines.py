"""Line-aware schedules of the sparse kernels (docs/conventions.md#sparse-line-model): the
lane-sum blocking of SDDMM-like bodies and the line-aware copy delays of the modulo schedule.
Values equal numpy, the two engines agree, cycles never below the roofline, and each effect
goes the expected way."""

import dataclasses

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


def _elementwise(m=64, n=128, seed=0):
    """C = A * B elementwise, row-major: each copy's chunk starts a whole number of lines
    along, so plain copies read A and B on one line pair in lock step."""
    from dataflow.dfg.graph import Program
    from dataflow.dfg.index.lower import index_kernel
    from dataflow.dfg.index.tensors import dense

    kern = index_kernel("C[i,j] = A[i,j] * B[i,j]",
                        {"A": dense((m, n)), "B": dense((m, n)), "C": dense((m, n))}, name="ew")
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n), dtype=np.float32)
    b = rng.standard_normal((m, n), dtype=np.float32)
    prog = Program(name="ew", kernels=(kern,), inputs=(("A", a.ravel()), ("B", b.ravel())),
                   outputs=(("C", (m, n)),), dtype="float32", macs=m * n)
    return prog, a * b


def line_scheduled_elementwise():
    """(program, want, plain mapping, line-aware mapping) of `_elementwise` with 4 copies."""
    from dataflow.mapper.map import map_kernel
    from dataflow.mapper.mapping import Mapping
    from dataflow.plan.retime import line_copies

    prog, want = _elementwise()
    km = map_kernel(prog.kernels[0], DEFAULT, copies=4)
    lined = line_copies(km, DEFAULT)
    return (prog, want, Mapping(program=prog, arch=DEFAULT, kernels=(km,)),
            Mapping(program=prog, arch=DEFAULT, kernels=(lined,)))


def test_line_aware_delays_remove_the_conflicts_of_a_dense_kernel():
    from dataflow.plan.line_schedule import LINE_NOTE, line_aware_delays, table_stalls

    prog, want, plain, lined = line_scheduled_elementwise()
    km, lk = plain.kernels[0], lined.kernels[0]
    assert LINE_NOTE in lk.notes and any(line_aware_delays(km, DEFAULT))
    before, after = simulate_mapping(plain), assert_engines_identical(lined)
    # the table counts the first tile exactly as the engine does
    first = [simulate_mapping(m).kernels[0].tiles[0].stall_cycles_spm_conflict
             for m in (plain, lined)]
    assert [table_stalls(km, DEFAULT), table_stalls(lk, DEFAULT)] == first
    assert before.stall_cycles_spm_conflict > 0 and after.stall_cycles_spm_conflict == 0
    for res in (before, after):
        assert np.array_equal(np.asarray(res.output).reshape(want.shape), want)
        assert res.cycles >= res.roofline_cycles


def test_line_aware_delays_spread_spare_ports_for_gathers():
    """CSR SpMM: the gathers' lines are data; the table leaves them fewer port-full
    (cycle, line)s, and the first tile stalls less than with every copy undelayed."""
    from dataflow.dfg.lower import lower_spmm_csr
    from dataflow.mapper.map import map_kernel
    from dataflow.plan.compile import KernelSchedule, apply_kernel_schedule
    from dataflow.plan.line_schedule import LineTable
    from dataflow.plan.retime import align_gathers, line_copies

    rng = np.random.default_rng(0)
    a = sp.random(512, 512, density=0.02, format="csr", dtype=np.float32, random_state=rng)
    b = rng.standard_normal((512, 64), dtype=np.float32)
    prog = lower_spmm_csr((512, 512), a.indptr, a.indices, a.data, b)
    body = apply_kernel_schedule(prog.kernels[0], KernelSchedule(fuse=True, vector_blocks=8))
    km = align_gathers(map_kernel(body, DEFAULT, copies=3), DEFAULT)
    lined = line_copies(km, DEFAULT)
    full = [LineTable(k, DEFAULT).score([0] * k.copies, k.copies)[1] for k in (km, lined)]
    assert full[1] < full[0]

    def first_tile(k):  # the nonzeros in their given order (`sample_cycles` orders them)
        from dataflow.pe_array.fast_run import run_kernel_fast

        first = dataclasses.replace(k, tiles=k.tiles[:1])
        return run_kernel_fast(first, DEFAULT, prog.input_map, prog.dtype).tiles[0].compute_cycles
    assert first_tile(lined) < first_tile(km)


def test_an_array_without_vsum_runs_the_scores_as_scalar_accumulations():
    """The attention's score kernel (a `vsum` per vector) on an array with no lane-sum unit:
    the vector loop made scalar, each lane a multiply-accumulate, values as numpy."""
    from dataflow.plan.kernel_schedule import apply_kernel_schedule
    from tests.archs import variant

    no_vsum = variant(**{"pe_array.functional_units": [
        {"name": "lsu", "ops": ["load", "store", "gather", "scatter", "acc", "accmax",
                                "scatter_acc"], "latency_cycles": 1, "issue_interval_cycles": 1},
        {"name": "alu", "ops": ["add", "sub", "max", "route", "const"], "latency_cycles": 1,
         "issue_interval_cycles": 1},
        {"name": "mul", "ops": ["mul", "mac", "macc"], "latency_cycles": 2,
         "issue_interval_cycles": 1},
        {"name": "sfu", "ops": ["exp", "div"], "latency_cycles": 4, "issue_interval_cycles": 1}]})
    kern = sddmm_csr_vector_kernel(3, 16, 4, np.array([0, 2, 3, 5]), 8)
    scalar = transform.devectorise_reduction(kern)
    assert scalar.vector_var is None and all(n.op is not Op.VSUM for n in scalar.nodes)
    cands = kernel_candidates(kern, no_vsum)
    # every candidate does without vsum: lanes made scalar, or each lane sum done by
    # lane-selecting multiplies (docs/conventions.md#lane-select-sums)
    assert cands[0].devectorise and all(c.devectorise or c.lane_select for c in cands)
    assert any(c.lane_select for c in cands)
    for c in cands:
        body = apply_kernel_schedule(kern, c)
        assert all(n.op is not Op.VSUM for n in body.nodes)
    import dataflow

    res = dataflow.simulate("attention", arch=DEFAULT, pattern="window", seq=32, dim=16)
    got = dataflow.simulate("attention", arch=no_vsum, pattern="window", seq=32, dim=16)
    assert res.values_match_reference and got.values_match_reference
    assert got.cycles >= got.roofline_cycles
    np.testing.assert_allclose(got.output, res.output, rtol=1e-4, atol=1e-5)
