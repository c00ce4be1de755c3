"""Gold tests of the semantics both engines import (dataflow/pe_array/semantics.py).

Both engines share these rules, so the engine-equality tests cannot see a bug in them; these
tests can. Every expected value is written by hand (SAM's gold streams, STYLE.md), never
computed by the code under test. Where rounding decides the outcome the float32 values are
chosen so that the wrong order or a wider intermediate gives a different answer:

- 2**24 = 16777216 is where float32's spacing becomes 2, so 2**24 + 1 is a tie that rounds to
  even (back to 2**24) and 2**24 + 3 rounds up to 16777220;
- (1 + 2**-12)**2 = 1 + 2**-11 + 2**-24 rounds (tie to even) to 1 + 2**-11 in float32, so a
  fused multiply-add and the rounded multiply then add differ in the last term.
"""

from __future__ import annotations

import numpy as np
import pytest

from dataflow.dfg.ops import Op
from dataflow.pe_array.semantics import (
    ACC_IDENTITY,
    ACC_UFUNC,
    apply_op,
    commit,
    commit_order,
)
from dataflow.testing import assert_close

F32 = np.float32
TWO_24 = 16777216.0  # 2**24: from here on float32 holds only even integers
ONE_PLUS = 1.000244140625  # 1 + 2**-12, exact in float32


def exact(actual, expected, dtype=F32) -> None:
    """Bit-for-bit: same shape, same dtype, zero tolerance."""
    assert_close(actual, np.asarray(expected, dtype=dtype), rtol=0.0, atol=0.0, dtype=dtype)


# -- arithmetic: one case per opcode (op, inputs, constant, expected), all in float32 --------

GOLD = [
    # the constant itself, in the array's dtype
    ("const", Op.CONST, [], 2.5, 2.5),
    # float32 rounding of the product (1 + 2**-11, not 1.000488340854645)
    ("mul", Op.MUL, [[ONE_PLUS, 2.0], [ONE_PLUS, 3.0]], 0.0, [1.00048828125, 6.0]),
    # one float32 add: 2**24 + 1 ties back to 2**24
    ("add", Op.ADD, [[TWO_24, 2.0], [1.0, 3.0]], 0.0, [TWO_24, 5.0]),
    ("sub", Op.SUB, [[5.0, 1.0], [3.0, 4.0]], 0.0, [2.0, -3.0]),
    ("mac", Op.MAC, [[2.0], [3.0], [10.0]], 1.0, [16.0]),
    # rounded multiply, then rounded add: 2**-11; a fused one would give 2**-11 + 2**-24
    ("mac-unfused", Op.MAC, [[ONE_PLUS], [ONE_PLUS], [-1.0]], 1.0, [0.00048828125]),
    # a zero constant is not negative: a*b + c
    ("mac-zero-const", Op.MAC, [[2.0], [3.0], [10.0]], 0.0, [16.0]),
    # negative constant: c - a*b
    ("mac-negated", Op.MAC, [[2.0], [3.0], [10.0]], -1.0, [4.0]),
    ("mac-negated-unfused", Op.MAC, [[ONE_PLUS], [ONE_PLUS], [1.0]], -1.0, [-0.00048828125]),
    ("max", Op.MAX, [[1.0, 5.0, -2.0], [3.0, 2.0, -7.0]], 0.0, [3.0, 5.0, -2.0]),
    ("div", Op.DIV, [[7.0, 1.0], [2.0, 3.0]], 0.0, [3.5, 0.3333333432674408]),
    # the sign of the butterfly output sits in the constant
    ("bfly-upper", Op.BFLY, [[5.0], [3.0]], 1.0, [8.0]),
    ("bfly-lower", Op.BFLY, [[5.0], [3.0]], -1.0, [2.0]),
    # lane order 2**24 + 1 + 1 + 1, every add a tie back to 2**24; reversed order gives
    # 16777220, pairwise (2**24 + 1) + (1 + 1) gives 16777218, a float64 sum 16777220
    ("vsum-lane-order", Op.VSUM, [[TWO_24, 1.0, 1.0, 1.0]], 0.0, [TWO_24]),
    # eight lanes (the default SIMD width), where numpy's own sum switches to eight partial
    # sums: ((2**24 + 1) + (1 + 1)) + ((1 + 1) + (1 + 1)) = 16777222; lane order keeps 2**24
    ("vsum-eight-lanes", Op.VSUM, [[TWO_24] + [1.0] * 7], 0.0, [TWO_24]),
]


@pytest.mark.parametrize("op, args, const, expected", [g[1:] for g in GOLD],
                         ids=[g[0] for g in GOLD])
def test_arithmetic_gold(op, args, const, expected):
    exact(apply_op(op, [np.asarray(a, dtype=np.float64) for a in args], F32, const), expected)


def test_exp_is_the_float32_exponential():
    out = apply_op(Op.EXP, [np.asarray([0.0, 1.0])], F32)
    exact(out[:1], [1.0])
    # e in float32 is 2.71828174591064453125; allow one unit in the last place (2**-22)
    assert_close(out[1:], np.asarray([2.7182817459106445], F32), rtol=1e-7, atol=0.0, dtype=F32)


def test_vsum_over_iterations_and_lanes():
    """The fast engine passes (iterations, lanes): one sum per row, in lane order."""
    rows = np.asarray([[TWO_24, 1.0, 1.0, 1.0],   # 2**24 each step: 16777216
                       [1.0, 1.0, 1.0, TWO_24]])  # 3 + 2**24 = 16777219, a tie: 16777220
    exact(apply_op(Op.VSUM, [rows], F32), [[16777216.0], [16777220.0]])


def test_route_passes_its_input_unchanged():
    """A routed index stays an integer (no cast to the array's dtype)."""
    idx = np.asarray([3, 7], dtype=np.int64)
    exact(apply_op(Op.ROUTE, [idx], F32), [3, 7], dtype=np.int64)


def test_memory_ops_have_no_arithmetic():
    with pytest.raises(NotImplementedError, match="load"):
        apply_op(Op.LOAD, [], F32)


def test_every_arithmetic_op_has_a_gold_case():
    covered = {g[1] for g in GOLD} | {Op.EXP, Op.ROUTE}
    assert covered == {op for op in Op if not op.is_memory}


# -- write-back ----------------------------------------------------------------------------


def test_accumulating_ops_combine_and_start_from_their_identity():
    assert set(ACC_UFUNC) == set(ACC_IDENTITY) == {op for op in Op if op.accumulates}
    assert ACC_IDENTITY[Op.ACC] == 0.0 and ACC_IDENTITY[Op.SCATTER_ACC] == 0.0
    assert ACC_IDENTITY[Op.ACC_MAX] == -np.inf
    # a register after one value: an accmax of negatives must not keep a zero start
    reg = {op: np.full(2, ACC_IDENTITY[op], F32) for op in ACC_IDENTITY}
    exact(ACC_UFUNC[Op.ACC_MAX](reg[Op.ACC_MAX], F32([-5.0, -7.0])), [-5.0, -7.0])
    exact(ACC_UFUNC[Op.ACC](reg[Op.ACC], F32([-5.0, -7.0])), [-5.0, -7.0])
    exact(ACC_UFUNC[Op.ACC](F32([2.0]), F32([3.0])), [5.0])
    exact(ACC_UFUNC[Op.SCATTER_ACC](F32([2.0]), F32([3.0])), [5.0])
    exact(ACC_UFUNC[Op.ACC_MAX](F32([2.0]), F32([3.0])), [3.0])


def _commit(op, buf, addr, vals):
    buf = np.asarray(buf, dtype=F32)
    commit(op, buf, np.asarray(addr, dtype=np.int64), np.asarray(vals, dtype=F32))
    return buf


def test_acc_adds():
    exact(_commit(Op.ACC, [1.0, 2.0, 3.0], [0, 2], [10.0, 20.0]), [11.0, 2.0, 23.0])


def test_acc_adds_every_repeat_of_an_address():
    exact(_commit(Op.ACC, [0.0, 0.0], [1, 1, 1], [1.0, 2.0, 3.0]), [0.0, 6.0])


def test_acc_adds_repeats_in_the_given_order():
    # 2**24 + 1 + 1 + 2 one rounded add at a time: 16777216, 16777216, 16777218;
    # reversed it is 16777220, and adding the float64 sum 4 also gives 16777220
    exact(_commit(Op.ACC, [TWO_24], [0, 0, 0], [1.0, 1.0, 2.0]), [16777218.0])


def test_accmax_takes_the_maximum_from_minus_infinity():
    exact(_commit(Op.ACC_MAX, [-np.inf, 3.0], [0, 1, 0], [-2.0, 1.0, -1.0]), [-1.0, 3.0])


def test_store_overwrites():
    exact(_commit(Op.STORE, [1.0, 2.0, 3.0], [0, 2], [9.0, 8.0]), [9.0, 2.0, 8.0])


def test_store_casts_to_the_buffer_dtype():
    buf = np.zeros(1, dtype=F32)
    commit(Op.STORE, buf, np.asarray([0]), np.asarray([0.1]))  # float64 0.1
    exact(buf, [0.10000000149011612])


def test_scatter_keeps_the_last_write_to_a_word():
    exact(_commit(Op.SCATTER, [0.0, 0.0, 0.0], [2, 0, 2], [5.0, 6.0, 7.0]), [6.0, 0.0, 7.0])


def test_scatter_acc_sums_every_lane_on_a_word():
    exact(_commit(Op.SCATTER_ACC, [0.0] * 4, [2, 0, 2, 2], [1.0, 2.0, 4.0, 8.0]),
          [2.0, 0.0, 13.0, 0.0])


def test_commit_order_is_cycle_then_iteration_then_node():
    # (cycle, iteration, node) per update
    updates = [(1, 0, 5), (0, 3, 2), (0, 1, 7), (0, 1, 4)]
    cycle, iteration, node = zip(*updates)
    assert commit_order(cycle, iteration, node).tolist() == [3, 2, 1, 0]


def test_commit_order_keeps_ties_in_issue_order():
    assert commit_order([0, 0, 0], [2, 2, 2], [1, 1, 1]).tolist() == [0, 1, 2]


def _commit_updates(op, buf, updates, together: bool):
    """Commit (cycle, iteration, node, addrs, vals) updates as the engines do: sorted by
    commit_order, lanes in lane order; one commit per update (the reference engine) or one
    over their concatenation (the fast engine batches a node's updates)."""
    cycle, iteration, node, addrs, vals = zip(*updates)
    order = commit_order(cycle, iteration, node)
    buf = np.asarray(buf, dtype=F32)
    if together:
        commit(op, buf, np.concatenate([np.asarray(addrs[i], dtype=np.int64) for i in order]),
               np.concatenate([np.asarray(vals[i], dtype=F32) for i in order]))
        return buf
    for i in order:
        commit(op, buf, np.asarray(addrs[i], dtype=np.int64), np.asarray(vals[i], dtype=F32))
    return buf


@pytest.mark.parametrize("together", [False, True], ids=["one-by-one", "batched"])
def test_scatter_last_wins_in_cycle_iteration_lane_order(together):
    updates = [
        (2, 0, 3, [1, 1], [10.0, 11.0]),  # committed last; its lane 1 is the final write
        (1, 5, 3, [1], [20.0]),           # first
        (1, 7, 3, [1, 0], [30.0, 31.0]),  # second
    ]
    exact(_commit_updates(Op.SCATTER, [0.0] * 4, updates, together), [31.0, 11.0, 0.0, 0.0])


@pytest.mark.parametrize("together", [False, True], ids=["one-by-one", "batched"])
def test_scatter_acc_sums_every_lane_in_commit_order(together):
    updates = [
        (0, 1, 2, [0, 0, 0, 0], [TWO_24, 1.0, 1.0, 1.0]),  # second
        (0, 0, 2, [0], [2.0]),                             # first
    ]
    # 2, then 2 + 2**24 = 16777218, +1 -> 16777219 ties to 16777220, +1 -> 16777221 ties to
    # 16777220, +1 -> 16777220; the other order ends at 2**24 + 2 = 16777218
    exact(_commit_updates(Op.SCATTER_ACC, [0.0], updates, together), [16777220.0])
