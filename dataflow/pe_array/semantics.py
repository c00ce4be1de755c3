"""What each arithmetic opcode computes, in the array's dtype (shared by both engines).

MAC is a rounded multiply followed by a rounded add (no fused rounding), so results do not
depend on whether a backend has FMA. A MAC whose instruction constant is negative subtracts the
product (c - a*b, the negate bit of an FMA unit's fnmadd; the negation is exact).
"""

from __future__ import annotations

import numpy as np

from dataflow.dfg.ops import Op


def apply_op(op: Op, args: list[np.ndarray], dtype, const: float = 0.0) -> np.ndarray:
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

