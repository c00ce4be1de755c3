"""UST tensors as the generic lowering's plain level descriptions (`dataflow.dfg.index`).

The lowering (layer 2) never sees a `Tensor`: this translates a tensor's format (its level
types and expressions) and storage (pos, crd, val) into a `TensorLevels`, or None when a level
is one the generic lowering does not iterate (loose_compressed, delta, structured, symbols,
slices), so the caller falls back to converting the tensor (to CSR). `generic_matmul` routes a
sparse-times-dense product whose format the generic lowering runs faster than CSR (measured)
to that lowering.
"""

from __future__ import annotations

import numpy as np

from dataflow.dfg.graph import DFGError, Program
from dataflow.dfg.index.lower import CONCORDANT
from dataflow.dfg.index.program import index_program
from dataflow.dfg.index.tensors import Level, LevelExpr, LevelKind, TensorLevels
from dataflow.dfg.index.tensors import dense as dense_levels
from dataflow.dfg.lower import run_passes
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


def _diagonal(levels: tuple[Level, ...]) -> bool:
    """A diagonal format: the offsets (a + b or a - b) compressed, then a range level."""
    return len(levels) == 2 and levels[0].kind is LevelKind.COMPRESSED and \
        levels[0].expr.op in ("+", "-") and levels[1].kind is LevelKind.RANGE


def _block_rows(levels: tuple[Level, ...]) -> bool:
    """Block sparse row: dense block rows, compressed block columns, the block inside dense."""
    kinds = [lv.kind for lv in levels]
    ops = [(lv.expr.dim, lv.expr.op) for lv in levels]
    return kinds == [LevelKind.DENSE, LevelKind.COMPRESSED, LevelKind.DENSE, LevelKind.DENSE] \
        and ops[:2] == [(0, "/"), (1, "/")] and {o for _, o in ops[2:]} == {"%"}


#: the statement of a sparse-times-dense product on the generic path
SPMM_STATEMENT = "C[i,j] += A[i,k] * B[k,j]"


def _rows_as_range(t: TensorLevels) -> TensorLevels:
    """A diagonal tensor whose range level runs over the columns (scipy's DIA: data[d, j] =
    A[j - offset, j]) re-laid with the range over the rows (data[d, i] = A[i, i + offset]),
    the same diagonals: so the output rows are the loop, not a coordinate computed from the
    offset (which would run past the edges at the filler). Zeros stay where they were stored."""
    (m, n), off = t.shape, t.level_crd(0)
    old = np.asarray(t.val).reshape(len(off), n)
    new = np.zeros((len(off), m), old.dtype)
    sign = 1 if t.levels[0].expr.op == "-" else -1  # j - i = off, or i + j = off
    for d, o in enumerate(off):
        i = np.arange(m)
        j = i + o if sign == 1 else o - i
        ok = (j >= 0) & (j < n)
        new[d, i[ok]] = old[d, j[ok]]
    rng = Level(LevelKind.RANGE, LevelExpr(0), m)
    return TensorLevels(t.shape, (t.levels[0], rng), t.pos, t.crd, new.ravel(), t.buffer)


def generic_matmul(a: Tensor, b: np.ndarray, dtype=np.float32) -> Program | None:
    """The program of a @ b (dense `b`) lowered from A's own format, for the formats on which
    the generic lowering measured at least as fast as converting A to CSR
    (benchmarks/bench_generic_lowering.py): a diagonal format times a vector (its range level
    is the vector loop, the diagonals outermost: TACO's concordant order) and block sparse
    rows. None for everything else (the caller converts to CSR)."""
    levels = tensor_levels(a)
    (m, k), n = a.shape, b.shape[1]
    # a diagonal format wins where its rows are the vector loop: a matrix-vector product (with
    # more columns, C's row vector moves every iteration, and CSR's accumulates along the row)
    if levels is None or not (_diagonal(levels.levels) and n == 1 or _block_rows(levels.levels)):
        return None
    if _diagonal(levels.levels) and levels.levels[1].expr.dim == 1:
        levels = _rows_as_range(levels)
    tensors = {"A": levels, "B": dense_levels((k, n), val=np.asarray(b))}
    order = CONCORDANT if _diagonal(levels.levels) else None
    kind = "dia" if _diagonal(levels.levels) else "bsr"
    try:
        prog = index_program(SPMM_STATEMENT, tensors, order=order, name=f"spmm_{kind}",
                             program_name=f"spmm_{kind}_{m}x{k}x{n}_stored{len(a.val)}",
                             dtype=dtype, macs=int(np.count_nonzero(a.val)) * n)
    except DFGError:
        return None  # e.g. DIAJ: its filler reaches rows past the edges; CSR has none
    return run_passes(prog)
