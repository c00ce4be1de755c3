"""Plain descriptions of a tensor's storage levels, as the generic lowering reads them.

The frontend's `TensorFormat` (layer 6) is translated into these (layer 2) by the frontend; the
lowering never sees a `Tensor`. A level stores one level coordinate, a function of the tensor's
dimensions (`LevelExpr`: a dimension, `d / c`, `d % c`, or `a + b` / `a - b` of two), in one of
four ways (`LevelKind`, the UST / MLIR level types the lowering turns into loops):

- dense (also a batch level): every coordinate 0 .. size-1 under each parent position; the
  position is parent * size + coordinate;
- range: like dense, over its dimension's extent (a diagonal format's rows);
- compressed: the coordinates `crd[pos[parent] .. pos[parent+1]]`, positions in that range;
- singleton: one coordinate `crd[parent]` per parent position, the position is the parent's.

A value sits at the last level's position: `val[position]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from dataflow.dfg.graph import DFGError


class LevelKind(str, Enum):
    DENSE = "dense"
    RANGE = "range"
    COMPRESSED = "compressed"
    SINGLETON = "singleton"

    @property
    def enumerates(self) -> bool:
        """Every coordinate of the level's size, no arrays (dense, range)."""
        return self in (LevelKind.DENSE, LevelKind.RANGE)


@dataclass(frozen=True)
class LevelExpr:
    """The level coordinate as a function of dimensions: dimension `dim` alone (`op` ""),
    `dim / arg` or `dim % arg` (a block grid and the offset inside a block), or `dim + arg` /
    `dim - arg` with `arg` another dimension (a diagonal: j - i)."""

    dim: int
    op: str = ""
    arg: int = 0

    def __post_init__(self):
        if self.op not in ("", "/", "%", "+", "-"):
            raise DFGError(f"level expression op {self.op!r}: one of '', '/', '%', '+', '-'")
        if self.op in ("/", "%") and self.arg < 1:
            raise DFGError(f"level expression d{self.dim} {self.op} {self.arg}: a block size "
                           "is at least 1")

    @property
    def dims(self) -> tuple[int, ...]:
        return (self.dim, self.arg) if self.op in ("+", "-") else (self.dim,)


@dataclass(frozen=True)
class Level:
    """One storage level: its kind, its expression, and the coordinates it spans: `size` of
    them from `lo` (negative for a j - i level)."""

    kind: LevelKind
    expr: LevelExpr
    size: int
    lo: int = 0


@dataclass(frozen=True, eq=False)
class TensorLevels:
    """A tensor as levels and arrays: `pos[k]` / `crd[k]` for level k (None where the level
    stores none), `val` its stored values (None for an output). `buffer` names the values'
    buffer (default: the tensor's name, with `_val` when a level stores coordinates)."""

    shape: tuple[int, ...]
    levels: tuple[Level, ...]
    pos: tuple[np.ndarray | None, ...] = ()
    crd: tuple[np.ndarray | None, ...] = ()
    val: np.ndarray | None = None
    buffer: str | None = None

    @property
    def sparse(self) -> bool:
        return any(not lv.kind.enumerates for lv in self.levels)

    def level_pos(self, k: int) -> np.ndarray:
        p = self.pos[k] if k < len(self.pos) else None
        if p is None:
            raise DFGError(f"compressed level {k} needs its pos array")
        return np.asarray(p, dtype=np.int64)

    def level_crd(self, k: int) -> np.ndarray:
        c = self.crd[k] if k < len(self.crd) else None
        if c is None:
            raise DFGError(f"level {k} ({self.levels[k].kind.value}) needs its crd array")
        return np.asarray(c, dtype=np.int64)

    @property
    def stored(self) -> int:
        """Positions of the last level: the number of values stored."""
        count = 1
        for k, lv in enumerate(self.levels):
            if lv.kind.enumerates:
                count *= lv.size
            elif lv.kind is LevelKind.COMPRESSED:
                count = int(self.level_pos(k)[-1])
        return count


def dense(shape: Sequence[int], order: Sequence[int] | None = None,
          val: np.ndarray | None = None, buffer: str | None = None) -> TensorLevels:
    """A dense tensor whose levels are its dimensions in `order` (default row-major)."""
    shape = tuple(int(n) for n in shape)
    order = tuple(range(len(shape))) if order is None else tuple(order)
    if sorted(order) != list(range(len(shape))):
        raise DFGError(f"dense level order {order} is not a permutation of {len(shape)} dims")
    levels = tuple(Level(LevelKind.DENSE, LevelExpr(d), shape[d]) for d in order)
    return TensorLevels(shape, levels, val=val, buffer=buffer)


def csr(shape: Sequence[int], pos=None, crd=None, val=None, buffer: str | None = None
        ) -> TensorLevels:
    """A CSR matrix: dense rows, compressed columns (no arrays: an output's format)."""
    m, n = (int(x) for x in shape)
    levels = (Level(LevelKind.DENSE, LevelExpr(0), m), Level(LevelKind.COMPRESSED, LevelExpr(1), n))
    return TensorLevels((m, n), levels, (None, None if pos is None else np.asarray(pos, np.int64)),
                        (None, None if crd is None else np.asarray(crd, np.int64)), val, buffer)
