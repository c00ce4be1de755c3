"""Semantic rules of the UST format language, checked left to right over the levels.

Each violation raises ``FormatError`` with a short rule name and the column of the offending
level (or dimension). The rules follow nvmath-python's validation and MLIR's verifier.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import FormatError
from .levels import COORDINATE_STORING, BinOp, Const, Dim, LevelFormat, LevelSpec

_SINGLETON_PARENTS = frozenset({LevelFormat.COMPRESSED, LevelFormat.LOOSE_COMPRESSED,
                                LevelFormat.SINGLETON, LevelFormat.DELTA})


def validate(dims: Sequence[Dim], levels: Sequence[LevelSpec], source: str | None = None):
    """Raise FormatError on the first broken rule; return None for a valid format."""
    walk = _Walk(dims, levels, source)
    for index, level in enumerate(levels):
        text = f"level {index} ({level})"
        walk.level_type(index, level, text)
        walk.level_expr(index, level, text)
    walk.all_closed()


class _Walk:
    """The left-to-right walk over the levels: what each dimension was used for so far, and
    which '+'/'-' and '/' levels still wait for their range and '%' partners."""

    def __init__(self, dims: Sequence[Dim], levels: Sequence[LevelSpec], source: str | None):
        self.dims, self.levels, self.source = dims, levels, source
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

    # -- level expression rules ----------------------------------------------------------
    def level_expr(self, index: int, level: LevelSpec, text: str) -> None:
        expr, col = level.expr, level.column
        if isinstance(expr, Const):
            self.fail("constant-level", f"{text}: a level expression needs a dimension", col)
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
