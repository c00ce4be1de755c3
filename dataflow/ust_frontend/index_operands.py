"""UST tensors as the generic lowering's plain level descriptions (`dataflow.dfg.index`).

The lowering (layer 2) never sees a `Tensor`: this translates a tensor's format (its level
types and expressions) and storage (pos, crd, val) into a `TensorLevels`, or None when a level
is one the generic lowering does not iterate (loose_compressed, delta, structured, symbols,
slices), so the caller falls back to converting the tensor (to CSR).
"""

from __future__ import annotations

import numpy as np

from dataflow.dfg.index.tensors import Level, LevelExpr, LevelKind, TensorLevels
from dataflow.ust_frontend.levels import BinOp, Const, Dim, LevelFormat
from dataflow.ust_frontend.tensor import Tensor

_KINDS = {
    LevelFormat.DENSE: LevelKind.DENSE,
    LevelFormat.BATCH: LevelKind.DENSE,
    LevelFormat.RANGE: LevelKind.RANGE,
    LevelFormat.COMPRESSED: LevelKind.COMPRESSED,
    LevelFormat.SINGLETON: LevelKind.SINGLETON,
}


def _expr(expr, dims: dict[str, int]) -> LevelExpr | None:
    """A level expression the lowering reads: d, d / c, d % c, a + b, a - b."""
    if isinstance(expr, Dim):
        return LevelExpr(dims[expr.name])
    if not isinstance(expr, BinOp) or not isinstance(expr.lhs, Dim):
        return None
    if expr.op in ("/", "%") and isinstance(expr.rhs, Const):
        return LevelExpr(dims[expr.lhs.name], expr.op, expr.rhs.value)
    if expr.op in ("+", "-") and isinstance(expr.rhs, Dim):
        return LevelExpr(dims[expr.lhs.name], expr.op, dims[expr.rhs.name])
    return None


def tensor_levels(t: Tensor, buffer: str | None = None,
                  val: np.ndarray | None = None) -> TensorLevels | None:
    """`t` as levels and arrays (`val`: replacement values, e.g. a prolog's), or None when a
    level is not one the generic lowering iterates."""
    fmt = t.tensor_format
    if fmt.symbols or fmt.slices:
        return None
    dims = {d: k for k, d in enumerate(fmt.dims)}
    levels = []
    for spec, (lo, hi) in zip(fmt.levels, fmt.level_bounds(t.shape)):
        kind, expr = _KINDS.get(spec.type.format), _expr(spec.expr, dims)
        if kind is None or expr is None:
            return None
        levels.append(Level(kind, expr, hi - lo, lo))
    rng = range(t.num_levels)
    return TensorLevels(tuple(t.shape), tuple(levels), tuple(t.pos(k) for k in rng),
                        tuple(t.crd(k) for k in rng), np.asarray(t.val if val is None else val),
                        buffer)
