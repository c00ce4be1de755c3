"""Level types and level expressions of the UST format language.

A level is ``expr : type``. Expressions form a small immutable tree (``Dim``, ``Const``,
``Sym``, ``BinOp``);
a type is a ``LevelType`` (format kind, properties and parameters). Columns of the
source text ride along for error messages but never take part in equality or hashing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from .errors import FormatError

#: Deepest expression tree accepted (parser and programmatic formats alike); far above any
#: real format, low enough that the recursive walks over a tree never reach Python's limit.
MAX_EXPR_DEPTH = 64
#: Most nodes in one level expression.
MAX_EXPR_NODES = 128
#: Deepest nesting of parentheses the parser accepts.
MAX_PAREN_DEPTH = 32


class LevelFormat(enum.Enum):
    """The kind of storage a level uses (names follow nvmath-python and MLIR)."""

    DENSE = "dense"
    BATCH = "batch"
    COMPRESSED = "compressed"
    LOOSE_COMPRESSED = "loose_compressed"
    SINGLETON = "singleton"
    RANGE = "range"
    DELTA = "delta"
    STRUCTURED = "structured"


class LevelProperty(enum.Enum):
    """A property of a coordinate-storing level (names follow nvmath-python and MLIR)."""

    NONUNIQUE = "nonunique"
    UNORDERED = "unordered"
    NONORDERED = "unordered"  # MLIR's spelling; an alias of UNORDERED
    SOA = "soa"


#: Levels that enumerate every coordinate of their extent and store no arrays.
ENUMERATING = frozenset({LevelFormat.DENSE, LevelFormat.BATCH, LevelFormat.RANGE})
#: Levels that store coordinates and so may carry the unique / ordered properties.
COORDINATE_STORING = frozenset({LevelFormat.COMPRESSED, LevelFormat.LOOSE_COMPRESSED,
                                LevelFormat.SINGLETON, LevelFormat.DELTA})
#: Levels that own a segment of children per parent position (a `pos` array).
SEGMENTED = frozenset({LevelFormat.COMPRESSED, LevelFormat.LOOSE_COMPRESSED, LevelFormat.DELTA})


@dataclass(frozen=True)
class LevelType:
    """Format kind + properties + parameters of one level.

    ``params`` is ``(bits,)`` for delta and ``(n, m)`` for structured, ``()`` otherwise.
    ``soa`` (MLIR's structure-of-arrays flag for singleton levels) is kept only so that MLIR
    spellings round-trip; storage here is always one array per level.
    """

    format: LevelFormat
    unique: bool = True
    ordered: bool = True
    params: tuple[int, ...] = ()
    soa: bool = False

    def __str__(self) -> str:
        return self.spelled(mlir=False)

    def spelled(self, mlir: bool) -> str:
        """The type as text; ``mlir=True`` writes MLIR's ``nonordered``."""
        fmt = self.format
        if fmt is LevelFormat.DELTA:
            head = f"delta({self.params[0]})"
        elif fmt is LevelFormat.STRUCTURED:
            head = f"structured[{self.params[0]}, {self.params[1]}]"
        else:
            head = fmt.value
        props = []
        if not self.unique:
            props.append("nonunique")
        if not self.ordered:
            props.append("nonordered" if mlir else "unordered")
        if self.soa:
            props.append("soa")
        return f"{head}({', '.join(props)})" if props else head

    @property
    def stores_pos(self) -> bool:
        return self.format in SEGMENTED

    @property
    def stores_crd(self) -> bool:
        return self.format in COORDINATE_STORING or self.format is LevelFormat.STRUCTURED


# --------------------------------------------------------------------------------------------
# Level expressions


@dataclass(frozen=True)
class Dim:
    """A dimension variable."""

    name: str
    column: int | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Const:
    """An integer constant (only valid as the right operand of ``/`` and ``%``)."""

    value: int
    column: int | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Sym:
    """A symbol (MLIR's ``[s0]``): a size unknown to the format, only a factor of ``*``."""

    name: str
    column: int | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class BinOp:
    """``lhs op rhs`` with op one of ``+ - * / %`` (``/`` is floor division)."""

    op: str
    lhs: LevelExpr
    rhs: LevelExpr
    column: int | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return spell_expr(self, mlir=False)


LevelExpr = Dim | Const | Sym | BinOp

_MLIR_OPS = {"/": "floordiv", "%": "mod"}


def spell_expr(expr: LevelExpr, mlir: bool, names: dict[str, str] | None = None) -> str:
    """An expression as text: UST spelling (``/``, ``%``) or MLIR's (``floordiv``, ``mod``),
    with names replaced through ``names`` when given. Every operand that is itself an
    operation is parenthesised, so the text reads the same under either precedence."""
    if isinstance(expr, (Dim, Sym)):
        return names.get(expr.name, expr.name) if names else expr.name
    if isinstance(expr, Const):
        return str(expr.value)

    def side(e: LevelExpr) -> str:
        text = spell_expr(e, mlir, names)
        return f"({text})" if isinstance(e, BinOp) else text

    op = _MLIR_OPS.get(expr.op, expr.op) if mlir else expr.op
    return f"{side(expr.lhs)} {op} {side(expr.rhs)}"


def expr_shape(expr) -> tuple[int, int]:
    """(depth, node count) of an expression tree, walked without recursion."""
    depth, nodes, stack = 0, 0, [(expr, 1)]
    while stack:
        node, level = stack.pop()
        nodes += 1
        depth = max(depth, level)
        if isinstance(node, BinOp) and depth <= MAX_EXPR_DEPTH:
            stack += [(node.lhs, level + 1), (node.rhs, level + 1)]
    return depth, nodes


def expr_symbols(expr: LevelExpr) -> tuple[str, ...]:
    """Symbol names used by an expression, left to right."""
    if isinstance(expr, Sym):
        return (expr.name,)
    if isinstance(expr, BinOp):
        return expr_symbols(expr.lhs) + expr_symbols(expr.rhs)
    return ()


def expr_dims(expr: LevelExpr) -> tuple[str, ...]:
    """Dimension names used by an expression, left to right."""
    if isinstance(expr, Dim):
        return (expr.name,)
    if isinstance(expr, BinOp):
        return expr_dims(expr.lhs) + expr_dims(expr.rhs)
    return ()


def rename_expr(expr: LevelExpr, mapping: dict[str, str]) -> LevelExpr:
    if isinstance(expr, Dim):
        return Dim(mapping[expr.name])
    if isinstance(expr, Sym):
        return Sym(mapping.get(expr.name, expr.name))
    if isinstance(expr, BinOp):
        return BinOp(expr.op, rename_expr(expr.lhs, mapping), rename_expr(expr.rhs, mapping))
    return Const(expr.value)


def evaluate(expr: LevelExpr, coords: dict[str, np.ndarray]) -> np.ndarray:
    """Level coordinates of an expression, vectorised over arrays of dimension coordinates."""
    if isinstance(expr, Dim):
        return np.asarray(coords[expr.name])
    if isinstance(expr, Const):
        return np.asarray(expr.value)
    if isinstance(expr, Sym):
        raise _symbolic(expr)
    lhs, rhs = evaluate(expr.lhs, coords), evaluate(expr.rhs, coords)
    if expr.op == "+":
        return lhs + rhs
    if expr.op == "-":
        return lhs - rhs
    if expr.op == "*":
        return lhs * rhs
    if expr.op == "/":
        return lhs // rhs
    return lhs % rhs


def bounds(expr: LevelExpr, extents: dict[str, int]) -> tuple[int, int]:
    """Half-open range [lo, hi) of an expression's values for the given dimension extents.

    ``a + b`` spans ``[0, na + nb - 1)``, ``b - a`` spans ``[-(na - 1), nb)`` (so its size is
    ``na + nb - 1`` and offsets may be negative), ``i / c`` spans ``[0, ceil(n / c))``,
    ``i % c`` spans ``[0, c)``.
    """
    if isinstance(expr, Dim):
        return 0, extents[expr.name]
    if isinstance(expr, Const):
        return expr.value, expr.value + 1
    if isinstance(expr, Sym):
        raise _symbolic(expr)
    llo, lhi = bounds(expr.lhs, extents)
    rlo, rhi = bounds(expr.rhs, extents)
    if expr.op == "+":
        return llo + rlo, lhi + rhi - 1
    if expr.op == "-":
        return llo - (rhi - 1), lhi - rlo
    if expr.op == "*":  # validated: non-negative operands
        return llo * rlo, (lhi - 1) * (rhi - 1) + 1
    if expr.op == "/":
        c = expr.rhs.value  # validated: rhs is a positive constant
        return llo // c, -(-lhi // c)
    return 0, expr.rhs.value


def _symbolic(expr: Sym) -> FormatError:
    return FormatError("symbolic-size", f"symbol {expr.name!r} has no value: a format with "
                       "symbols describes storage but cannot size or index it")


@dataclass(frozen=True)
class DimSlice:
    """MLIR's dimension slice ``#sparse_tensor<slice(offset, size, stride)>``; None is ``?``."""

    offset: int | None
    size: int | None
    stride: int | None

    def __str__(self) -> str:
        parts = ("?" if v is None else str(v) for v in (self.offset, self.size, self.stride))
        return f"#sparse_tensor<slice({', '.join(parts)})>"


@dataclass(frozen=True)
class LevelSpec:
    """One level: ``expr : type``."""

    expr: LevelExpr
    type: LevelType
    column: int | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.expr} : {self.type}"

    @property
    def format(self) -> LevelFormat:
        return self.type.format
