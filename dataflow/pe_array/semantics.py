"""What both engines must agree on about values: arithmetic and SPM write-back.

This module is the one home of those rules; `reference.py` and `fast.py` import it and never
each other, and `tests/test_semantics.py` checks it against hand-written outcomes, so two engines
that share it still check something independent (SAM's gold tests, STYLE.md).

Arithmetic (`apply_op`), in the array's dtype: MAC is a rounded multiply followed by a rounded
add (no fused rounding), so results do not depend on whether a backend has FMA. A MAC whose
instruction constant is negative subtracts the product (c - a*b, the negate bit of an FMA
unit's fnmadd; the negation is exact).

Operands (`operands`): a mul or macc with `Node.lane` set takes lane `lane` of input 0 and
broadcasts it to every lane (the column operand of an outer product).

Write-back (`ACC_UFUNC`, `ACC_IDENTITY`, `stored_value`, `commit_order`, `commit`):
- acc and scatter_acc add their input, macc adds its inputs' product (one rounded multiply,
  then the rounded add of the accumulation), accmax takes the maximum; a PE's accumulation
  register starts at the op's identity (0 for the adds, -inf for accmax) and combines with
  the same ufunc;
- store and scatter overwrite;
- SPM updates commit in (cycle, iteration, node id) order, the lanes of one vector access in
  lane order;
- repeated addresses in one commit: the accumulating ops apply every update one after another
  in that order (each a rounded add, so the order fixes the float32 result); the overwriting
  ops keep the last.
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from dataflow.dfg.graph import Node
from dataflow.dfg.ops import Op

#: How an accumulating op combines, in its PE's register and in the SPM read-modify-write.
ACC_UFUNC = MappingProxyType({Op.ACC: np.add, Op.ACC_MAX: np.maximum, Op.SCATTER_ACC: np.add,
                              Op.MACC: np.add})
#: The starting value of an accumulating op's register (the identity of its ufunc).
ACC_IDENTITY = MappingProxyType({Op.ACC: 0.0, Op.ACC_MAX: -np.inf, Op.SCATTER_ACC: 0.0,
                                 Op.MACC: 0.0})


def operands(node: Node, args: list) -> list:
    """The node's input values as its op uses them: with `node.lane` set, input 0 becomes that
    lane of its vector (kept as a one-lane axis, so it broadcasts over the other's lanes).
    Values are arrays whose last axis is the lanes (the fast engine's (iterations, lanes), the
    reference engine's (lanes,))."""
    if node.lane is None:
        return args
    first = np.asarray(args[0])
    return [first[..., node.lane:node.lane + 1], *args[1:]]


def stored_value(node: Node, args: list, dtype) -> np.ndarray:
    """What a writing node sends each iteration (to the SPM, or into its accumulation
    register): macc its inputs' product (rounded once), the other ops their last input (a
    scatter's or scatter_acc's first is its index)."""
    if node.op is Op.MACC:
        a, b = (np.asarray(x, dtype=dtype) for x in operands(node, args))
        return a * b
    return args[-1]


def apply_op(op: Op, args: list[np.ndarray], dtype, const: float = 0.0) -> np.ndarray:
    """Value of arithmetic node `op` on its input values (scalars, or arrays whose last axis is
    the SIMD lanes); `const` is the instruction's constant (CONST's value, MAC's negate flag as
    its sign, BFLY's sign)."""
    if op is Op.CONST:
        return np.asarray(const, dtype=dtype)
    if op is Op.ROUTE:
        return args[0]
    a = [np.asarray(x, dtype=dtype) for x in args]
    if op is Op.MUL:
        return a[0] * a[1]
    if op is Op.ADD:
        return a[0] + a[1]
    if op is Op.SUB:
        return a[0] - a[1]
    if op is Op.MAC:
        return a[2] - (a[0] * a[1]) if const < 0 else (a[0] * a[1]) + a[2]
    if op is Op.MAX:
        return np.maximum(a[0], a[1])
    if op is Op.EXP:
        return np.exp(a[0])
    if op is Op.BFLY:
        # the butterfly unit's add/subtract half (FABNet's butterfly engine): a + s*b with the
        # sign s = +1 (upper output) or -1 (lower output) held in the instruction's constant;
        # s is +-1, so s*b is exact and the result is one rounded add
        return a[0] + np.asarray(const, dtype=dtype) * a[1]
    if op is Op.DIV:
        return a[0] / a[1]
    if op is Op.VSUM:
        # lanes summed in lane order (one rounding per add), the same in both engines: the
        # fast engine passes (iterations, lanes), the reference one (lanes,)
        s = a[0][..., 0]
        for lane in range(1, a[0].shape[-1]):
            s = s + a[0][..., lane]
        return s[..., None]
    raise NotImplementedError(f"no arithmetic semantics for {op.value}")


def commit_order(cycle, iteration, node) -> np.ndarray:
    """Positions of SPM updates in the order they commit: by issue cycle, then iteration, then
    node id (equal-length sequences of ints, one entry per update; ties keep their order)."""
    return np.lexsort((np.asarray(node), np.asarray(iteration), np.asarray(cycle)))


def commit(op: Op, buf: np.ndarray, addr: np.ndarray, vals: np.ndarray) -> None:
    """Apply the writes of memory op `op` to buffer `buf` (in place) in the given order: word
    addresses `addr`, values `vals` (one per address). ACC and SCATTER_ACC add every value
    (repeated addresses one after another), ACC_MAX takes the maximum, STORE and SCATTER
    overwrite (the last write to a word wins)."""
    if op.accumulates:
        ACC_UFUNC[op].at(buf, addr, vals.astype(buf.dtype))
    else:
        _, last = np.unique(addr[::-1], return_index=True)
        last = len(addr) - 1 - last
        buf[addr[last]] = vals[last].astype(buf.dtype)
