"""The line-aware order of a static sparse operand's nonzeros and the pitch of its gathered rows
(docs/conventions.md#gather-lines): values equal numpy, the two engines agree, cycles never below
the roofline, fewer SPM conflicts than the nonzeros in their given order, and the table counts
the stalls as the engine does."""

import dataclasses

import numpy as np
import scipy.sparse as sp

from dataflow.arch import load_arch
from dataflow.dfg.lower import lower_spmm_csr
from dataflow.mapper.mapping import Mapping
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan import gather_greedy, gather_lines, gather_pads, nonzero_choice
from dataflow.plan.compile import apply_schedule, choose_schedule
from dataflow.testing import values_match
from tests.conftest import ARCH_DIR
from tests.engine_checks import assert_engines_identical

DEFAULT = load_arch(ARCH_DIR / "default.yaml")


def _spmm(m=128, k=128, n=64, density=0.15, seed=0):
    rng = np.random.default_rng(seed)
    a = sp.random(m, k, density=density, format="csr", dtype=np.float32, random_state=rng)
    b = rng.standard_normal((k, n), dtype=np.float32)
    prog = lower_spmm_csr((m, k), a.indptr, a.indices, a.data, b)
    return prog, a, (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


def _as_given(mapping: Mapping, program) -> Mapping:
    """`mapping` over `program` padded as the schedule says, nonzeros in their given order."""
    padded = gather_pads.apply_pads(program, gather_pads.gather_pads(program, DEFAULT))
    return dataclasses.replace(mapping, program=dataclasses.replace(
        mapping.program, inputs=padded.inputs, output_order=()))


def test_spmm_nonzeros_ordered_within_rows_values_engines_and_fewer_conflicts():
    prog, a, want = _spmm()
    mapping, sched = choose_schedule(prog, DEFAULT)
    # B's rows of 64 words (8 SPM rows, two start lines on 16 interleaved lines) at a pitch
    # of 9 SPM rows: a row starts on any line
    assert sched.pads == (("B", 8),)
    ins = mapping.program.input_map
    assert ins["B"].size == a.shape[1] * 72
    # a permutation within each row: every row holds the same (column, value) pairs
    pos = a.indptr
    assert not np.array_equal(ins["A_crd"], a.indices)
    for i in range(a.shape[0]):
        got = sorted(zip(ins["A_crd"][pos[i]:pos[i + 1]], ins["A_val"][pos[i]:pos[i + 1]]))
        assert got == sorted(zip(a.indices[pos[i]:pos[i + 1]], a.data[pos[i]:pos[i + 1]]))
    res = assert_engines_identical(mapping)
    out = np.asarray(res.output).reshape(want.shape)
    assert values_match(out, want)
    assert res.cycles >= res.roofline_cycles
    given = simulate_mapping(_as_given(mapping, prog))
    assert values_match(np.asarray(given.output).reshape(want.shape), want)
    assert res.stall_cycles_spm_conflict < given.stall_cycles_spm_conflict
    # the roofline is the operands' (the pad words stay on chip: the DMA moves B's 64 columns)
    assert res.roofline_cycles == given.roofline_cycles


def test_the_table_counts_the_stalls_of_its_order_as_the_engine_does(monkeypatch):
    # the plain kernel (the unrolled one: tests/test_nonzero_unroll.py)
    monkeypatch.setattr(nonzero_choice, "UNROLLS", ())
    prog, _, _ = _spmm(m=96, k=96, density=0.2, seed=1)
    mapping, _ = choose_schedule(prog, DEFAULT)
    given = _as_given(mapping, prog)
    km = mapping.kernels[0]
    o = gather_lines.orderable(km.kernel, given.program)
    perm, stalls = gather_lines._permutation(km, DEFAULT, o, given.program.input_map,
                                             gather_lines.RUN_SWAPS)
    assert np.array_equal(np.sort(perm), np.arange(len(perm)))
    engine = simulate_mapping(mapping).stall_cycles_spm_conflict
    # exactly, but for two gathers of one row in one cycle, which the table counts twice
    # and the engine once (the line broadcasts the row): an upper bound, and a close one
    assert engine <= stalls <= engine * 1.02 + 2


def test_a_plan_bound_to_new_values_is_padded_and_ordered_again():
    """apply_schedule pads the gathered rows; binding orders the nonzeros of the new values
    (the plan's pattern), so the frontend's planned runs get both."""
    prog, a, want = _spmm(seed=2)
    mapping, sched = choose_schedule(prog, DEFAULT)
    again = apply_schedule(prog, sched, DEFAULT)
    assert again.input_map["B"].size == mapping.program.input_map["B"].size
    bound = gather_lines.line_order(Mapping(program=again, arch=DEFAULT,
                                            kernels=mapping.kernels))
    for name, x in mapping.program.inputs:
        assert np.array_equal(bound.program.input_map[name], x)
    res = simulate_mapping(bound)
    assert values_match(np.asarray(res.output).reshape(want.shape), want)


def test_an_sddmm_output_written_at_the_positions_is_read_back_in_the_nonzeros_order():
    """An SDDMM stores each nonzero's result at its position: the program reads its output back
    through the order (`Program.output_order`); values as numpy, engines identical, fewer
    conflicts than the nonzeros in their given order; the chunks of one nonzero (loops inside
    the sparse one) are placed together."""
    from dataflow.dfg.lower_sddmm import lower_sddmm_csr

    rng = np.random.default_rng(0)
    a = rng.standard_normal((96, 64), dtype=np.float32)
    b = rng.standard_normal((64, 96), dtype=np.float32)
    mask = sp.random(96, 96, density=0.2, format="csr", dtype=np.float32, random_state=rng)
    want = (a.astype(np.float64) @ b)[mask.nonzero()] * mask.data
    prog = lower_sddmm_csr(a, b, mask.indptr, mask.indices, mask.data)
    mapping, sched = choose_schedule(prog, DEFAULT)
    assert sched.pads == (("BT", 8),)
    assert [name for name, _ in mapping.program.output_order] == ["C_val"]
    res = assert_engines_identical(mapping)
    assert values_match(np.asarray(res.output).ravel(), want)
    assert res.cycles >= res.roofline_cycles
    given = simulate_mapping(_as_given(mapping, prog))
    assert values_match(np.asarray(given.output).ravel(), want)
    assert res.stall_cycles_spm_conflict < given.stall_cycles_spm_conflict


def test_attention_mask_read_by_every_kernel_gets_one_order_for_all():
    """Attention's mask is read by every kernel (scores, softmax, PV): no kernel is orderable
    alone, but one order serves them all (`shared_order`); the order with the fewest stalls
    over the gathering kernels is kept. Values as in the given order (numpy's, checked by the
    attention tests), engines identical, a permutation within rows, no more conflicts."""
    from dataflow.attention.lower import lower_attention

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((48, 64), dtype=np.float32) for _ in range(3))
    mask = sp.random(48, 48, density=0.4, format="csr", dtype=np.float32, random_state=rng)
    prog = lower_attention(q, k, v, mask.indptr, mask.indices)
    assert all(gather_lines.orderable(kern, prog) is None for kern in prog.kernels)
    permuted, outs, gathering = gather_lines.shared_order(prog)
    assert permuted == ("M_crd",) and outs == () and set(gathering) == {"sddmm", "spmm"}
    assert dict(gather_pads.gather_pads(prog, DEFAULT)) == {"K": 8, "V": 8}
    mapping, _ = choose_schedule(prog, DEFAULT)
    crd, pos = mapping.program.input_map["M_crd"], mask.indptr
    assert not np.array_equal(crd, mask.indices)
    for i in range(48):
        assert sorted(crd[pos[i]:pos[i + 1]]) == sorted(mask.indices[pos[i]:pos[i + 1]])
    res = assert_engines_identical(mapping)
    given = simulate_mapping(_as_given(mapping, prog))
    assert values_match(np.asarray(res.output), np.asarray(given.output))
    assert res.cycles >= res.roofline_cycles
    assert res.stall_cycles_spm_conflict <= given.stall_cycles_spm_conflict * 1.02


def test_the_greedy_in_python_and_compiled_agree(monkeypatch):
    """A small job orders in Python (numba not loaded: start-up); both give one order."""
    prog, _, _ = _spmm(m=64, k=64, density=0.2, seed=3)
    mapping, _ = choose_schedule(prog, DEFAULT)
    given = _as_given(mapping, prog)
    km = mapping.kernels[0]
    o = gather_lines.orderable(km.kernel, given.program)
    got = []
    for runner in (gather_greedy._PY_ORDER, gather_greedy._jit()):
        monkeypatch.setattr(gather_lines, "_runner", lambda work, r=runner: r)
        got.append(gather_lines._permutation(km, DEFAULT, o, given.program.input_map))
    assert np.array_equal(got[0][0], got[1][0]) and got[0][1] == got[1][1]


def test_line_orders_are_kept_on_disk_across_processes_and_a_damaged_file_is_rebuilt(
        tmp_path, monkeypatch):
    """A warm process reads the order back instead of running the greedy (the default job's
    start-up, issue 14); the file's name does not depend on the process's hash seed; a
    damaged file is deleted and rebuilt, and the order is the same."""
    import os
    import subprocess
    import sys

    monkeypatch.setenv("DATAFLOW_CACHE_DIR", str(tmp_path))
    prog, _, _ = _spmm(seed=3)
    mapping, _ = choose_schedule(prog, DEFAULT)
    # planning orders every candidate program it measures (the nonzero unroll's too,
    # docs/conventions.md#nonzero-unroll): only the order written below is counted
    for f in (tmp_path / "line_orders").glob("*.order"):
        f.unlink()
    gather_lines._ORDERS.clear()
    first = gather_lines.line_order(_as_given(mapping, prog))
    files = list((tmp_path / "line_orders").glob("*.order"))
    assert len(files) == 1
    calls = []
    monkeypatch.setattr(gather_lines, "_steps", lambda m: calls.append(m) or [])
    gather_lines._ORDERS.clear()
    again = gather_lines.line_order(_as_given(mapping, prog))
    assert not calls  # read back, not recomputed
    assert np.array_equal(again.program.input_map["A_crd"], first.program.input_map["A_crd"])
    files[0].write_bytes(files[0].read_bytes()[:-7] + b"garbage")
    gather_lines._ORDERS.clear()
    monkeypatch.undo()
    monkeypatch.setenv("DATAFLOW_CACHE_DIR", str(tmp_path))
    rebuilt = gather_lines.line_order(_as_given(mapping, prog))
    assert np.array_equal(rebuilt.program.input_map["A_crd"], first.program.input_map["A_crd"])
    assert files[0].exists()  # written again
    code = ("import numpy as np, scipy.sparse as sp, pickle, sys\n"
            "from tests.test_gather_lines import _spmm, _as_given, DEFAULT\n"
            "from dataflow.plan.compile import choose_schedule\n"
            "from dataflow.plan import gather_lines\n"
            "p, _, _ = _spmm(seed=3); m, _ = choose_schedule(p, DEFAULT)\n"
            "print(gather_lines._orders_file(_as_given(m, p), 'x')[1])\n")
    names = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=str(ARCH_DIR.parent),
                            env={**os.environ, "PYTHONHASHSEED": seed}).stdout
             for seed in ("1", "2")}
    assert len(names) == 1
