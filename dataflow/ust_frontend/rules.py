"""Semantic rules of the UST format language, checked left to right over the levels.

Each violation raises ``FormatError`` with a short rule name and the column of the offending
level (or dimension). The rules follow nvmath-python's validation and MLIR's verifier.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .errors import FormatError
from .levels import (
    COORDINATE_STORING,
    MAX_EXPR_DEPTH,
    MAX_EXPR_NODES,
    BinOp,
    Const,
    Dim,
    LevelExpr,
    LevelFormat,
    LevelSpec,
    Sym,
    evaluate,
    expr_shape,
    expr_symbols,
)

_SINGLETON_PARENTS = frozenset({LevelFormat.COMPRESSED, LevelFormat.LOOSE_COMPRESSED,
                                LevelFormat.SINGLETON, LevelFormat.DELTA})


#: Coordinates tried per dimension when checking MLIR's dimension bindings.
_BINDING_SAMPLES = 13


def validate(dims: Sequence[Dim], levels: Sequence[LevelSpec], source: str | None = None,
             symbols: Sequence[Sym] = ()):
    """Raise FormatError on the first broken rule; return None for a valid format."""
    for index, level in enumerate(levels):
        depth, nodes = expr_shape(level.expr)
        if depth > MAX_EXPR_DEPTH or nodes > MAX_EXPR_NODES:
            raise FormatError(rule="too-complex", detail=f"level {index}: expression too "
                              f"complex (at most depth {MAX_EXPR_DEPTH} and {MAX_EXPR_NODES} "
                              "nodes)", source=source, column=level.column)
    walk = _Walk(dims, levels, source, symbols)
    for index, level in enumerate(levels):
        text = f"level {index} ({level})"
        walk.level_type(index, level, text)
        walk.level_expr(index, level, text)
    walk.all_closed()


def check_bindings(dims: Sequence[Dim], levels: Sequence[LevelSpec],
                   bindings: Sequence[LevelExpr | None], level_vars: Sequence[Dim],
                   source: str | None = None):
    """MLIR's dimension bindings (``{l0, l1} (i = l0 * 2 + l1) -> ...``) must invert the levels:
    checked on a grid of sample coordinates (formats with symbols are not checked)."""
    if not any(b is not None for b in bindings) or any(
            expr_symbols(s.expr) for s in levels):
        return
    axes = np.meshgrid(*[np.arange(_BINDING_SAMPLES)] * len(dims), indexing="ij")
    coords = {d.name: a.ravel() for d, a in zip(dims, axes)}
    lvl = {v.name: evaluate(s.expr, coords) for v, s in zip(level_vars, levels)}
    for dim, binding in zip(dims, bindings):
        if binding is not None and not np.array_equal(evaluate(binding, lvl), coords[dim.name]):
            raise FormatError(rule="binding-mismatch", detail=f"the binding of dimension "
                              f"{dim.name!r} does not invert the level expressions",
                              source=source, column=dim.column)


class _Walk:
    """The left-to-right walk over the levels: what each dimension was used for so far, and
    which '+'/'-' and '/' levels still wait for their range and '%' partners."""

    def __init__(self, dims: Sequence[Dim], levels: Sequence[LevelSpec], source: str | None,
                 symbols: Sequence[Sym] = ()):
        self.dims, self.levels, self.source = dims, levels, source
        self.symbols = {s.name for s in symbols}
        self.names: dict[str, Dim] = {}
        for dim in dims:
            if dim.name in self.names:
                self.fail("duplicate-dimension", f"dimension {dim.name!r} is declared twice",
                          dim.column)
            self.names[dim.name] = dim
        self.used: dict[str, str] = {}  # dim -> how it was used first ("plain", "addsub", ...)
        self.open_addsub: dict[int, tuple[str, str]] = {}  # level index -> its two dimensions
        self.open_div: dict[str, tuple[int, int]] = {}  # dim -> (constant, level index)
        self.seen_non_batch = False
        self.soa: tuple[int, bool] | None = None  # (first singleton level, its soa flag)

    def fail(self, rule: str, detail: str, column: int | None):
        raise FormatError(rule, detail, self.source, column)

    def declared(self, expr: Dim, where: LevelSpec):
        if expr.name not in self.names:
            self.fail("undeclared-dimension", f"level uses {expr.name!r}, which is not among the "
                      f"dimensions ({', '.join(self.names) or 'none'})",
                      expr.column or where.column)

    # -- level type rules ----------------------------------------------------------------
    def level_type(self, index: int, level: LevelSpec, text: str) -> None:
        ltype, col = level.type, level.column
        fmt = ltype.format
        if fmt not in COORDINATE_STORING and (not ltype.unique or not ltype.ordered
                                              or ltype.soa):
            self.fail("level-properties", f"{text}: only compressed, loose_compressed, singleton "
                      f"and delta levels take properties", col)
        if ltype.soa and fmt is not LevelFormat.SINGLETON:
            self.fail("soa-singleton", f"{text}: only singleton levels take 'soa'", col)
        if fmt is LevelFormat.SINGLETON:
            if self.soa is None:
                self.soa = (index, ltype.soa)
            elif self.soa[1] != ltype.soa:
                self.fail("soa-mixed", f"{text}: singleton levels must all be soa or all not "
                          f"(level {self.soa[0]} differs)", col)
        self.batch_order(index, level, text)
        if fmt is LevelFormat.SINGLETON and (
                index == 0 or self.levels[index - 1].type.format not in _SINGLETON_PARENTS):
            self.fail("singleton-parent", f"{text}: a singleton level must follow a compressed, "
                      "loose_compressed, delta or singleton level", col)
        if fmt is LevelFormat.DELTA and not 0 < ltype.params[0] <= 64:
            self.fail("delta-bits", f"{text}: delta needs a bit width in 1..64", col)
        if fmt is LevelFormat.STRUCTURED:
            self.structured(index, level, text)

    def batch_order(self, index: int, level: LevelSpec, text: str) -> None:
        expr, fmt, col, dims = level.expr, level.type.format, level.column, self.dims
        if fmt is LevelFormat.BATCH:
            if self.seen_non_batch:
                self.fail("batch-outermost", f"{text}: batch levels must all come before any "
                          "other level", col)
            if not (isinstance(expr, Dim) and index < len(dims)
                    and expr.name == dims[index].name):
                self.fail("batch-identity", f"{text}: batch level {index} must be the plain "
                          f"dimension {dims[index].name if index < len(dims) else '?'!r}", col)
        elif not self.seen_non_batch:
            self.seen_non_batch = True
            if index > 0 and fmt is not LevelFormat.DENSE:
                self.fail("batch-then-dense", f"{text}: the first level after the batch levels "
                          "must be dense", col)

    def structured(self, index: int, level: LevelSpec, text: str) -> None:
        expr, col = level.expr, level.column
        n, m = level.type.params
        if not 0 < n <= m:
            self.fail("structured-n-m", f"{text}: structured[n, m] needs 0 < n <= m", col)
        if index != len(self.levels) - 1:
            self.fail("structured-last", f"{text}: a structured level must be the last level",
                      col)
        for earlier in self.levels[:index]:
            if earlier.type.format not in (LevelFormat.DENSE, LevelFormat.BATCH):
                self.fail("structured-after-dense", f"{text}: every level before a structured "
                          f"level must be dense, not {earlier}", earlier.column)
        if isinstance(expr, BinOp) and expr.op == "%" and isinstance(expr.rhs, Const) \
                and expr.rhs.value != m:
            self.fail("structured-block", f"{text}: the modulus {expr.rhs.value} must equal the "
                      f"block size m = {m}", col)
        blocked = expr.lhs.name if isinstance(expr, BinOp) and isinstance(expr.lhs, Dim) else None
        for earlier in self.levels[:index]:
            e = earlier.expr
            if isinstance(e, BinOp) and e.op == "/" and isinstance(e.lhs, Dim) \
                    and e.lhs.name != blocked:
                self.fail("structured-one-block", f"{text}: with a structured level, only its "
                          f"own dimension may be blocked, not {e.lhs.name!r}", earlier.column)

    # -- level expression rules ----------------------------------------------------------
    def level_expr(self, index: int, level: LevelSpec, text: str) -> None:
        expr, col = level.expr, level.column
        if isinstance(expr, Const):
            self.fail("constant-level", f"{text}: a level expression needs a dimension", col)
        if _has_mul(expr):
            self.scaled(level, text)
            return
        if expr_symbols(expr):
            self.fail("symbol-use", f"{text}: a symbol may only be a factor of '*'", col)
        if level.type.format is LevelFormat.RANGE:
            self.range_level(level, text)
        elif isinstance(expr, Dim):
            self.declared(expr, level)
            if expr.name in self.used:
                self.fail("dimension-reused", f"{text}: dimension {expr.name!r} is already used "
                          f"by an earlier level ({self.used[expr.name]})", col)
            self.used[expr.name] = f"level {index}"
        elif expr.op in "+-":
            self.addsub(index, level, text)
        else:
            self.divmod(index, level, text)

    def scaled(self, level: LevelSpec, text: str) -> None:
        """``d * f`` with f a product of positive constants and symbols (MLIR's ELL): the
        level does not consume d, which a later level must still store."""
        expr, col = level.expr, level.column
        factors = _factors(expr.rhs) if isinstance(expr, BinOp) and expr.op == "*" else None
        if not isinstance(expr.lhs, Dim) or factors is None or any(
                isinstance(f, Const) and f.value <= 0 for f in factors):
            self.fail("mul-operands", f"{text}: '*' takes a plain dimension on the left and a "
                      "product of positive constants and symbols on the right", col)
        self.declared(expr.lhs, level)
        for factor in factors:
            if isinstance(factor, Sym) and factor.name not in self.symbols:
                self.fail("symbol-use", f"{text}: symbol {factor.name!r} is not declared",
                          col)

    def range_level(self, level: LevelSpec, text: str) -> None:
        expr, col = level.expr, level.column
        if not isinstance(expr, Dim):
            self.fail("range-operand", f"{text}: a range level takes a plain dimension", col)
        self.declared(expr, level)
        closing = [k for k, pair in self.open_addsub.items() if expr.name in pair]
        if not closing:
            self.fail("range-without-addsub", f"{text}: range applies only to a dimension of "
                      f"an earlier, still open '+' or '-' level", col)
        del self.open_addsub[closing[0]]

    def addsub(self, index: int, level: LevelSpec, text: str) -> None:
        expr, col, used = level.expr, level.column, self.used
        if not (isinstance(expr.lhs, Dim) and isinstance(expr.rhs, Dim)) \
                or expr.lhs.name == expr.rhs.name:
            self.fail("addsub-operands", f"{text}: '{expr.op}' combines exactly two different "
                      "plain dimensions", col)
        for operand in (expr.lhs, expr.rhs):
            self.declared(operand, level)
            if operand.name in used:
                rule = "addsub-reuse" if used[operand.name].startswith("+/-") \
                    else "dimension-reused"
                self.fail(rule, f"{text}: dimension {operand.name!r} is already used by an "
                          f"earlier level ({used[operand.name]})", col)
        for operand in (expr.lhs, expr.rhs):
            used[operand.name] = f"+/- at level {index}"
        self.open_addsub[index] = (expr.lhs.name, expr.rhs.name)

    def divmod(self, index: int, level: LevelSpec, text: str) -> None:
        """A '/' or '%' level."""
        expr, col = level.expr, level.column
        if not (isinstance(expr.lhs, Dim) and isinstance(expr.rhs, Const)):
            self.fail("divmod-operands", f"{text}: '{expr.op}' takes a plain dimension on the "
                      "left and an integer constant on the right", col)
        self.declared(expr.lhs, level)
        name, c = expr.lhs.name, expr.rhs.value
        if c <= 0:
            self.fail("divmod-constant", f"{text}: the constant of '{expr.op}' must be > 0", col)
        if expr.op == "/":
            self.div(index, name, c, text, col)
        else:
            self.mod(name, c, text, col)

    def div(self, index: int, name: str, c: int, text: str, col: int | None) -> None:
        if name in self.open_div or self.used.get(name, "").startswith("/"):
            self.fail("div-reuse", f"{text}: dimension {name!r} is divided more than once", col)
        if name in self.used:
            self.fail("dimension-reused", f"{text}: dimension {name!r} is already used by an "
                      f"earlier level ({self.used[name]})", col)
        self.used[name] = f"/ at level {index}"
        self.open_div[name] = (c, index)

    def mod(self, name: str, c: int, text: str, col: int | None) -> None:
        if name not in self.open_div:
            self.fail("mod-unmatched", f"{text}: '{name} % {c}' needs an earlier "
                      f"'{name} / {c}'", col)
        if self.open_div[name][0] != c:
            self.fail("mod-unmatched", f"{text}: '{name} % {c}' does not match the earlier "
                      f"'{name} / {self.open_div[name][0]}'", col)
        del self.open_div[name]

    # -- after the last level --------------------------------------------------------------
    def all_closed(self) -> None:
        for index in self.open_addsub:
            level = self.levels[index]
            self.fail("addsub-unclosed", f"level {index} ({level}) needs a later range level on "
                      "one of its dimensions", level.column)
        for name, (c, index) in self.open_div.items():
            level = self.levels[index]
            self.fail("div-unmatched", f"level {index} ({level}) needs a later '{name} % {c}' "
                      "level", level.column)
        for dim in self.dims:
            if dim.name not in self.used:
                self.fail("unused-dimension", f"dimension {dim.name!r} is not used by any level",
                          dim.column)


def _has_mul(expr: LevelExpr) -> bool:
    return isinstance(expr, BinOp) and (expr.op == "*" or _has_mul(expr.lhs)
                                        or _has_mul(expr.rhs))


def _factors(expr: LevelExpr) -> list[LevelExpr] | None:
    """The operands of a product of constants and symbols, or None for anything else."""
    if isinstance(expr, (Const, Sym)):
        return [expr]
    if isinstance(expr, BinOp) and expr.op == "*":
        lhs, rhs = _factors(expr.lhs), _factors(expr.rhs)
        return None if lhs is None or rhs is None else lhs + rhs
    return None
