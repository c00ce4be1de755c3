"""The attention's folds (docs/conventions.md#attention-fold): the normalisation in the PV
SpMM (four kernels, the row sum held) and, after the held-row SDDMM, the row maximum in the
scores' kernel (`transform.fuse_row_max`). Values equal the reference, fast engine equals the
reference stepper, and the folded program runs in fewer cycles."""

import dataclasses

import numpy as np
import pytest

from dataflow.arch import resolve_arch
from dataflow.attention.api import make_inputs
from dataflow.attention.lower import lower_attention
from dataflow.attention.reference import attention_reference
from dataflow.dfg import transform
from dataflow.dfg.ops import Op
from dataflow.mapper import map_program
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan.compile import KernelSchedule, apply_kernel_schedule
from dataflow.testing import assert_close
from tests.engine_checks import assert_engines_identical

DEFAULT = resolve_arch("arch_configs/default.yaml")


def _attention(seq=48, dim=64):
    x = make_inputs("window", seq, dim, 0)
    prog = lower_attention(x["q"], x["k"], x["v"], x["pos"], x["crd"], lanes=8)
    return prog, attention_reference(x["q"], x["k"], x["v"], x["pos"], x["crd"])


def test_normalisation_is_the_spmms_with_its_row_sum_held():
    prog, want = _attention()
    assert [k.name for k in prog.kernels] == ["sddmm", "softmax_max", "softmax_exp", "spmm"]
    spmm = prog.kernels[-1]
    assert [n.op for n in spmm.nodes].count(Op.DIV) == 1
    held = transform.hold_invariant_loads(spmm, 8)
    assert [n.buffer for n in held.nodes if n.hold] == ["rowsum"]
    res = assert_engines_identical(map_program(
        dataclasses.replace(prog, kernels=(*prog.kernels[:-1], held)), DEFAULT))
    assert_close(np.asarray(res.output).reshape(want.shape), want)


def test_row_max_folds_into_the_held_row_scores_only():
    """As lowered (the scores in chunks: a partial sum per iteration) nothing folds; with the
    whole reduction in one body the row maximum joins the scores' kernel: one kernel fewer,
    the same maximum, the same output, both engines equal, fewer cycles."""
    prog, want = _attention()
    assert transform.fuse_row_max(prog, 8) is prog
    blocked = apply_kernel_schedule(prog.kernels[0], KernelSchedule(sum_blocks=8, hold=8))
    whole = dataclasses.replace(prog, kernels=(blocked, *prog.kernels[1:]))
    fused = transform.fuse_row_max(whole, 8)
    assert [k.name for k in fused.kernels] == ["sddmm", "softmax_exp", "spmm"]
    assert [n.op for n in fused.kernels[0].nodes].count(Op.ACC_MAX) == 1
    res = assert_engines_identical(map_program(fused, DEFAULT))
    assert_close(np.asarray(res.output).reshape(want.shape), want)
    two = simulate_mapping(map_program(whole, DEFAULT))
    assert np.array_equal(np.asarray(res.output), np.asarray(two.output))
    assert res.cycles < two.cycles
    assert res.cycles >= res.roofline_cycles


def test_compiler_folds_the_row_max_and_keeps_the_plan(tmp_path, monkeypatch):
    """`choose_schedule` on the default array (accmax) folds the row max after choosing the
    held-row scores; `apply_schedule` replays it on a program lowered again."""
    from dataflow.cachefiles import ENV_VAR, BoundedCache
    from dataflow.plan import compile as plan_compile
    from dataflow.plan import retime

    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    monkeypatch.setattr(retime, "CHOICES", BoundedCache(16))
    prog, want = _attention(seq=96)
    mapping, sched = plan_compile.choose_schedule(prog, DEFAULT)
    if not sched.row_max_fused:
        pytest.fail(f"row max not folded: {sched}")
    assert [km.kernel.name for km in mapping.kernels] == ["sddmm", "softmax_exp", "spmm"]
    again = plan_compile.apply_schedule(prog, sched, DEFAULT)
    assert [str(k) for k in again.kernels] == [str(km.kernel) for km in mapping.kernels]
    res = simulate_mapping(mapping)
    assert_close(np.asarray(res.output).reshape(want.shape), want)
    assert res.cycles >= res.roofline_cycles
