"""A row maximum without an `accmax` unit (docs/conventions.md#row-maximum-without-accmax):
`dfg.row_max.lower_row_max` replaces the softmax's max-accumulate by max doublings, chosen by
the compiler only on an array that lacks the unit (the MLX preset). Values equal to the
accmax's, bit for bit; cycles never below the roofline; other presets unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dataflow
from dataflow.arch import load_arch
from dataflow.attention.api import make_inputs
from dataflow.attention.lower import lower_attention, softmax_max_kernel
from dataflow.attention.lower_dia import lower_attention_dia
from dataflow.dfg.graph import Addr, Buffer, BufferRole, Kernel, Loop, Node, Program
from dataflow.dfg.ops import Op
from dataflow.dfg.row_max import CHUNK, has_accmax, lower_row_max
from dataflow.mapper.map import map_kernel
from dataflow.mapper.mapping import MappingError
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan.compile import choose_schedule, compile_program
from tests.conftest import ARCH_DIR

MLX = ARCH_DIR / "mlx_4x4.yaml"


def _row_max_program(pos: np.ndarray, s: np.ndarray, made: bool = False) -> Program:
    """rowmax of S's rows; `made`: S copied from an input X by an earlier kernel (so the
    values get spare words and the first level is a chunked vector loop)."""
    m = len(pos) - 1
    kernel = softmax_max_kernel(m, pos)
    if not made:
        return Program(name="rowmax", kernels=(kernel,), inputs=(("S", s),),
                       outputs=(("rowmax", (m,)),))
    n = len(s)
    copy = Kernel(name="copy", loops=(Loop("e", n),), buffers=(
        Buffer("X", n), Buffer("S", n, BufferRole.OUTPUT)), nodes=(
        Node(0, Op.LOAD, buffer="X", addr=Addr((("e", 1),))),
        Node(1, Op.STORE, (0,), buffer="S", addr=Addr((("e", 1),)))))
    return Program(name="rowmax", kernels=(copy, kernel), inputs=(("X", s),),
                   outputs=(("rowmax", (m,)),))


def _ragged(seed: int = 0):
    """Rows of 0, 1, 2, 3, 5, 8, 17 and 40 entries, shuffled, with -inf and ties among them."""
    rng = np.random.default_rng(seed)
    lengths = rng.permutation([0, 1, 2, 3, 5, 8, 17, 40, 0, 9, 16, 1])
    pos = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    s = rng.standard_normal(int(pos[-1])).astype(np.float32)
    s[3] = -np.inf
    s[7] = s[8] = 2.5  # a tie
    return pos, s


def _want(pos, s):
    return np.array([s[a:b].max() if b > a else -np.inf for a, b in zip(pos[:-1], pos[1:])],
                    dtype=np.float32)


@pytest.mark.parametrize("made", [False, True])
@pytest.mark.parametrize("arch", ["default", "mlx_4x4"])
def test_doubling_gives_the_row_maximum_bit_for_bit(arch, made):
    pos, s = _ragged()
    prog = lower_row_max(_row_max_program(pos, s, made))
    assert not has_accmax(prog)
    names = [k.name for k in prog.kernels][made:]
    first = prog.kernels[made]
    assert (first.vector_var is not None) == made  # chunks when S has spare words
    if made:
        assert {k.buffer_map["S"].size for k in prog.kernels if "S" in k.buffer_map} == {
            -(-len(s) // CHUNK) * CHUNK + 1}
    # longest row 40: levels 1..5; rows of 1, 2-3, 4-7, 8-15, 16-31, 32-63 entries
    assert names[:5] == [f"softmax_max.level{t}" for t in range(1, 6)]
    assert names[5:] == [f"softmax_max.rows{k}" for k in range(6)]
    res = simulate_mapping(compile_program(prog, load_arch(ARCH_DIR / f"{arch}.yaml")))
    np.testing.assert_array_equal(np.asarray(res.output), _want(pos, s))  # -inf where empty
    assert res.cycles >= res.roofline_cycles


def test_nan_propagates_as_through_the_accumulation():
    pos, s = _ragged(1)
    s[int(pos[np.argmax(np.diff(pos))]) + 5] = np.nan  # inside the longest row
    res = simulate_mapping(compile_program(lower_row_max(_row_max_program(pos, s)),
                                           load_arch(MLX)))
    np.testing.assert_array_equal(np.asarray(res.output), _want(pos, s))


def test_mlx_has_no_accmax_unit_and_the_compiler_lowers_it():
    """Without the transform the MLX preset refuses the softmax; the compiler applies it there
    and records it in the schedule, so a plan bound to new values applies it again."""
    arch = load_arch(MLX)
    x = make_inputs("window", 48, 16)
    prog = lower_attention(x["q"], x["k"], x["v"], x["pos"], x["crd"], lanes=8)
    with pytest.raises(MappingError, match="accmax"):
        map_kernel(prog.kernels[1], arch)  # softmax_max
    mapping, sched = choose_schedule(prog, arch)
    assert sched is not None and sched.row_max
    assert not has_accmax(mapping.program)
    assert all(k.name != "softmax_max" for k in mapping.program.kernels)


def test_default_preset_keeps_its_accmax_schedule():
    """default.yaml runs accmax: the program is mapped as lowered, four kernels."""
    x = make_inputs("window", 48, 16)
    prog = lower_attention(x["q"], x["k"], x["v"], x["pos"], x["crd"], lanes=8)
    mapping, sched = choose_schedule(prog, load_arch(ARCH_DIR / "default.yaml"))
    assert sched is None or not sched.row_max
    assert [k.kernel.name for k in mapping.kernels] == [k.name for k in prog.kernels]
    assert any(n.op is Op.ACC_MAX for n in mapping.program.kernels[1].nodes)


@pytest.mark.parametrize("pattern", ["window", "bigbird", "butterfly"])
def test_attention_runs_on_mlx(pattern):
    # the CSR lowering's accmax (bigbird's block lowering has its own levels:
    # tests/test_attention_block.py)
    r = dataflow.simulate("attention", arch=MLX, pattern=pattern, seq=64, dim=16,
                          lowering="csr")
    assert r.values_match_reference
    assert r.cycles >= r.roofline_cycles
    names = [k.kernel for k in r.kernels]
    if pattern == "butterfly":  # rows of one width: one row-body softmax kernel, no levels
        # (docs/conventions.md#row-softmax, tests/test_attention_row_softmax.py)
        assert "softmax" in names and not any(n.startswith("softmax_max") for n in names)
        return
    assert "softmax_max" not in names and any(n.startswith("softmax_max.") for n in names)


def test_a_computed_value_is_stored_first():
    """The DIA lowering's max takes s + bias: a prelude kernel stores it, then the doublings."""
    x = make_inputs("window", 32, 16)
    prog = lower_attention_dia(x["q"], x["k"], x["v"], x["pos"], x["crd"], lanes=8)
    low = lower_row_max(prog)
    names = [k.name for k in low.kernels]
    i = names.index("softmax_max.values")
    assert names[i + 1].startswith("softmax_max.level")
    res = simulate_mapping(compile_program(prog, load_arch(MLX)))
    ref = dataflow.attention.reference.attention_reference(
        x["q"], x["k"], x["v"], x["pos"], x["crd"])
    got = np.asarray(res.output).reshape(ref.shape)
    assert np.allclose(got, ref, rtol=1e-5, atol=1e-5 * math.sqrt(16))
