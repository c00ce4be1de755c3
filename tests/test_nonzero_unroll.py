"""The CSR nonzero unroll (docs/conventions.md#nonzero-unroll): rows padded to multiples of u,
u nonzeros an iteration, the values and columns read as one row each and every gather taking
its lane of the columns. Values equal numpy, the fast engine equals the reference stepper,
cycles never below the roofline, the reads per nonzero are as counted, the line-aware order
still applies, and on the MLX preset the compiler's choice runs faster than the plain one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.arch import load_arch
from dataflow.dfg import transform
from dataflow.dfg.graph import Addr, DFGError, Node
from dataflow.dfg.lower import lower_spmm_csr
from dataflow.dfg.nonzero_unroll import pad_rows, shape, unroll_nonzeros
from dataflow.dfg.ops import Op
from dataflow.mapper import map_program
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan import compile as plan_compile
from dataflow.plan import gather_lines, gather_pads
from tests.conftest import ARCH_DIR
from tests.engine_checks import assert_engines_identical

MLX = load_arch(ARCH_DIR / "mlx_4x4.yaml")


def _spmm(m=24, k=96, n=32, density=0.12, seed=0):
    rng = np.random.default_rng(seed)
    a = sp.random(m, k, density=density, format="csr", dtype=np.float32, random_state=rng)
    a.indptr[3] = a.indptr[2]  # an empty row (its nonzeros moved to the next)
    b = rng.standard_normal((k, n), dtype=np.float32)
    prog = lower_spmm_csr(a.shape, a.indptr.astype(np.int64), a.indices.astype(np.int64),
                          a.data, b)
    dense = sp.csr_matrix((a.data, a.indices, a.indptr), shape=a.shape).toarray()
    return prog, dense.astype(np.float64) @ b


def test_pad_rows_pads_each_row_to_a_multiple_of_u():
    pos = np.array([0, 3, 3, 8, 9])
    src, pos_u = pad_rows(pos, 4)
    assert list(pos_u) == [0, 1, 1, 3, 4]
    assert list(src) == [0, 1, 2, -1, 3, 4, 5, 6, 7, -1, -1, -1, 8, -1, -1, -1]


@pytest.mark.parametrize("u, tree", [(2, True), (4, True), (4, False), (8, False)])
def test_unrolled_spmm_values_and_both_engines(u, tree):
    """Pads hold value 0 at the row's last column; the body reads one row of values and one
    of columns per u nonzeros, each gather selecting its lane; values equal numpy and both
    engines agree, cycles at or above the roofline."""
    prog, want = _spmm()
    q = unroll_nonzeros(prog, u, tree)
    k = q.kernels[0]
    rows = [n for n in k.nodes if n.op is Op.LOAD]
    assert len(rows) == 2 and all(n.addr.span == u for n in rows)
    gathers = [n for n in k.nodes if n.op is Op.GATHER]
    assert sorted(g.lane for g in gathers) == list(range(u))
    pos = prog.kernels[0].domain["A_pos"]
    src, _ = pad_rows(pos, u)
    val, crd = q.input_map["A_val"], q.input_map["A_crd"]
    assert (val[src < 0] == 0).all() and len(val) % u == 0
    # a pad's column is its row's last real one
    row = np.repeat(np.arange(len(pos) - 1), np.diff(pad_rows(pos, u)[1]) * u)
    assert (crd[src < 0] == prog.input_map["A_crd"][pos[1:][row[src < 0]] - 1]).all()
    body = transform.fuse_multiply_accumulate(k)
    accs = [n for n in body.nodes if n.op.accumulates]
    assert len(accs) == (1 if tree else u)
    res = assert_engines_identical(map_program(dataclasses.replace(q, kernels=(body,)), MLX))
    assert np.allclose(np.asarray(res.output).reshape(want.shape), want, rtol=1e-4, atol=1e-4)
    assert res.cycles >= res.roofline_cycles


def test_load_store_ops_per_nonzero():
    """With the vector loop in 4 blocks (32 columns): plain, 6 load/store ops a nonzero (value,
    column, 4 gathers); unrolled by 2 with the tree, (2 + 8 + 4) / 2 = 7 issue slots but 5 SPM
    reads (the 4 accs read the SPM only at a row's end); unrolled by 4 without it, 18 / 4."""
    prog, _ = _spmm()

    def lsu(p, **kw):
        body = plan_compile.apply_kernel_schedule(
            p.kernels[0], plan_compile.KernelSchedule(fuse=True, vector_blocks=4, **kw))
        ops = [n.op for n in body.nodes]
        reads = sum(o in (Op.LOAD, Op.GATHER) for o in ops)
        return sum(o in (Op.LOAD, Op.GATHER, Op.ACC) for o in ops), reads
    assert lsu(prog) == (6, 6)
    assert lsu(unroll_nonzeros(prog, 2, True)) == (14, 10)
    assert lsu(unroll_nonzeros(prog, 4, False)) == (18, 18)


def test_gather_lane_needs_a_row_load():
    prog, _ = _spmm()
    k = prog.kernels[0]
    bad = tuple(dataclasses.replace(n, lane=1) if n.op is Op.GATHER else n for n in k.nodes)
    with pytest.raises(DFGError, match="row load"):
        dataclasses.replace(k, nodes=bad).verify()
    mul = next(n for n in k.nodes if n.op is Op.MUL)
    assert Node(0, Op.GATHER, (0,), "B", Addr((), 0, 1), lane=0).op.selects_lane
    assert mul.op.selects_lane


def test_shape_refuses_what_it_cannot_pad():
    """A non-finite gathered operand is not unrolled by the compiler (0 * inf); a kernel with
    no sparse innermost loop has no shape."""
    from dataflow.dfg.lower import lower_gemm
    from dataflow.plan.nonzero_choice import applies
    assert shape(lower_gemm(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32))) is None
    prog, _ = _spmm()
    b = prog.input_map["B"].copy()
    b[5] = np.inf
    inf = dataclasses.replace(prog, inputs=tuple((n, b if n == "B" else x)
                                                 for n, x in prog.inputs))
    assert applies(prog, MLX) and not applies(inf, MLX)


def test_line_order_applies_to_the_unrolled_kernel():
    """`gather_lines.orderable` takes the unrolled kernel (each lane a slot), the order keeps
    the values and the B rows get their pitch."""
    prog, want = _spmm(m=64, k=256, n=32, density=0.08)
    q = unroll_nonzeros(prog, 2, True)
    o = gather_lines.orderable(q.kernels[0], q)
    assert o is not None and o.unroll == 2 and set(o.buffers) == {"A_val", "A_crd"}
    assert gather_pads.gather_pads(q, MLX)
    mapping, sched = plan_compile._compile_kernels(q, MLX, {})
    res = simulate_mapping(mapping)
    assert np.allclose(np.asarray(res.output).reshape(want.shape), want, rtol=1e-4, atol=1e-4)
    assert any(o is not None for o in [gather_lines.orderable(mapping.kernels[0].kernel,
                                                              mapping.program)])


def test_mlx_spmm_runs_faster_unrolled():
    """On mlx_4x4 a 4096 x 2048 x 32 SpMM at 1 % (one sub-program of the 4096^2 x 64 split):
    the compiler chooses the unroll by 2, which runs in fewer cycles than the schedule it
    would pick without it, and `apply_schedule` re-applies it."""
    prog, want = _spmm(m=4096, k=2048, n=32, density=0.01, seed=3)
    base, _ = plan_compile._compile_kernels(prog, MLX, {})
    mapping, sched = plan_compile.choose_schedule(prog, MLX)
    assert sched is not None and sched.nonzero_unroll == 2
    plain, unrolled = simulate_mapping(base), simulate_mapping(mapping)
    assert unrolled.cycles < 0.95 * plain.cycles
    assert unrolled.cycles >= unrolled.roofline_cycles
    assert np.allclose(np.asarray(unrolled.output).reshape(want.shape), want,
                       rtol=1e-4, atol=1e-4)
    again = plan_compile.apply_schedule(prog, sched, MLX)
    assert again.kernels[0].loops[-1].pos == "A_pos_by2"


def test_the_table_counts_the_unrolled_stalls_as_the_engine_does():
    """The line table over (iteration, lane) slots counts the SPM conflict stalls of its order
    as the engine does (an upper bound: two gathers of one row in one cycle count twice)."""
    prog, _ = _spmm(m=96, k=96, n=32, density=0.2, seed=1)
    q = unroll_nonzeros(prog, 2, True)
    mapping, sched = plan_compile._compile_kernels(q, MLX, {})
    given = gather_pads.apply_pads(q, sched.pads)
    given_map = dataclasses.replace(mapping, program=dataclasses.replace(
        mapping.program, inputs=given.inputs, output_order=()))
    km = mapping.kernels[0]
    o = gather_lines.orderable(km.kernel, given_map.program)
    perm, stalls = gather_lines._permutation(km, MLX, o, given_map.program.input_map,
                                             gather_lines.RUN_SWAPS)
    assert np.array_equal(np.sort(perm), np.arange(len(perm)))
    engine = simulate_mapping(mapping).stall_cycles_spm_conflict
    assert engine <= stalls <= engine * 1.02 + 2


def test_pads_are_not_compulsory_bytes():
    """The roofline of the unrolled program counts A's real words, not its pads: the same
    compute and DRAM floors as the plain program, though the DMA moves the pads too."""
    prog, _ = _spmm()
    q = unroll_nonzeros(prog, 4, True)
    assert q.input_map["A_val"].size > prog.input_map["A_val"].size
    plain = simulate_mapping(map_program(prog, MLX), "fast")
    padded = simulate_mapping(map_program(q, MLX), "fast")
    assert padded.dram_bytes > plain.dram_bytes  # the pads do cross DRAM
    assert padded.roofline_cycles == pytest.approx(plain.roofline_cycles)
    assert padded.to_dict()["roofline"] == plain.to_dict()["roofline"]


def test_the_summary_tells_issued_from_useful_macs():
    """The pads' MACs are issued but not useful: the summary names both where they differ, and
    one count where they agree."""
    from dataflow.cli.simulate_command import _macs_text

    prog, _ = _spmm()
    q = unroll_nonzeros(prog, 4, True)
    padded = simulate_mapping(map_program(q, MLX), "fast")
    plain = simulate_mapping(map_program(prog, MLX), "fast")
    assert padded.macs > prog.macs == plain.macs
    assert _macs_text(padded) == f"{padded.macs:,} MACs issued, {prog.macs:,} useful"
    assert _macs_text(plain) == f"{plain.macs:,} MACs"
