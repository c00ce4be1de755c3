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

    def fail(rule: str, detail: str, column: int | None):
        raise FormatError(rule, detail, source, column)

    names: dict[str, Dim] = {}
    for dim in dims:
        if dim.name in names:
            fail("duplicate-dimension", f"dimension {dim.name!r} is declared twice", dim.column)
        names[dim.name] = dim

    used: dict[str, str] = {}  # dim -> how it was used first ("plain", "addsub", "div", ...)
    open_addsub: dict[int, tuple[str, str]] = {}  # level index -> its two dimensions
    open_div: dict[str, tuple[int, int]] = {}  # dim -> (constant, level index)
    seen_non_batch = False

    def declared(expr: Dim, where: LevelSpec):
        if expr.name not in names:
            fail("undeclared-dimension", f"level uses {expr.name!r}, which is not among the "
                 f"dimensions ({', '.join(names) or 'none'})", expr.column or where.column)

    for index, level in enumerate(levels):
        expr, ltype, col = level.expr, level.type, level.column
        fmt = ltype.format
        text = f"level {index} ({level})"

        # -- level type rules ------------------------------------------------------------
        if fmt not in COORDINATE_STORING and (not ltype.unique or not ltype.ordered
                                              or ltype.soa):
            fail("level-properties", f"{text}: only compressed, loose_compressed, singleton "
                 f"and delta levels take properties", col)
        if fmt is LevelFormat.BATCH:
            if seen_non_batch:
                fail("batch-outermost", f"{text}: batch levels must all come before any other "
                     "level", col)
            if not (isinstance(expr, Dim) and index < len(dims)
                    and expr.name == dims[index].name):
                fail("batch-identity", f"{text}: batch level {index} must be the plain "
                     f"dimension {dims[index].name if index < len(dims) else '?'!r}", col)
        elif not seen_non_batch:
            seen_non_batch = True
            if index > 0 and fmt is not LevelFormat.DENSE:
                fail("batch-then-dense", f"{text}: the first level after the batch levels "
                     "must be dense", col)
        if fmt is LevelFormat.SINGLETON and (
                index == 0 or levels[index - 1].type.format not in _SINGLETON_PARENTS):
            fail("singleton-parent", f"{text}: a singleton level must follow a compressed, "
                 "loose_compressed, delta or singleton level", col)
        if fmt is LevelFormat.DELTA and not 0 < ltype.params[0] <= 64:
            fail("delta-bits", f"{text}: delta needs a bit width in 1..64", col)
        if fmt is LevelFormat.STRUCTURED:
            n, m = ltype.params
            if not 0 < n <= m:
                fail("structured-n-m", f"{text}: structured[n, m] needs 0 < n <= m", col)
            if index != len(levels) - 1:
                fail("structured-last", f"{text}: a structured level must be the last level",
                     col)
            for earlier in levels[:index]:
                if earlier.type.format not in (LevelFormat.DENSE, LevelFormat.BATCH):
                    fail("structured-after-dense", f"{text}: every level before a structured "
                         f"level must be dense, not {earlier}", earlier.column)
            if isinstance(expr, BinOp) and expr.op == "%" and isinstance(expr.rhs, Const) \
                    and expr.rhs.value != m:
                fail("structured-block", f"{text}: the modulus {expr.rhs.value} must equal the "
                     f"block size m = {m}", col)

        # -- level expression rules ------------------------------------------------------
        if isinstance(expr, Const):
            fail("constant-level", f"{text}: a level expression needs a dimension", col)
        if fmt is LevelFormat.RANGE:
            if not isinstance(expr, Dim):
                fail("range-operand", f"{text}: a range level takes a plain dimension", col)
            declared(expr, level)
            closing = [k for k, pair in open_addsub.items() if expr.name in pair]
            if not closing:
                fail("range-without-addsub", f"{text}: range applies only to a dimension of an "
                     f"earlier, still open '+' or '-' level", col)
            del open_addsub[closing[0]]
            continue
        if isinstance(expr, Dim):
            declared(expr, level)
            if expr.name in used:
                fail("dimension-reused", f"{text}: dimension {expr.name!r} is already used by "
                     f"an earlier level ({used[expr.name]})", col)
            used[expr.name] = f"level {index}"
            continue
        if expr.op in "+-":
            if not (isinstance(expr.lhs, Dim) and isinstance(expr.rhs, Dim)) \
                    or expr.lhs.name == expr.rhs.name:
                fail("addsub-operands", f"{text}: '{expr.op}' combines exactly two different "
                     "plain dimensions", col)
            for operand in (expr.lhs, expr.rhs):
                declared(operand, level)
                if operand.name in used:
                    rule = "addsub-reuse" if used[operand.name].startswith("+/-") \
                        else "dimension-reused"
                    fail(rule, f"{text}: dimension {operand.name!r} is already used by an "
                         f"earlier level ({used[operand.name]})", col)
            for operand in (expr.lhs, expr.rhs):
                used[operand.name] = f"+/- at level {index}"
            open_addsub[index] = (expr.lhs.name, expr.rhs.name)
            continue
        # '/' or '%'
        if not (isinstance(expr.lhs, Dim) and isinstance(expr.rhs, Const)):
            fail("divmod-operands", f"{text}: '{expr.op}' takes a plain dimension on the left "
                 "and an integer constant on the right", col)
        declared(expr.lhs, level)
        name, c = expr.lhs.name, expr.rhs.value
        if c <= 0:
            fail("divmod-constant", f"{text}: the constant of '{expr.op}' must be > 0", col)
        if expr.op == "/":
            if name in open_div or used.get(name, "").startswith("/"):
                fail("div-reuse", f"{text}: dimension {name!r} is divided more than once", col)
            if name in used:
                fail("dimension-reused", f"{text}: dimension {name!r} is already used by an "
                     f"earlier level ({used[name]})", col)
            used[name] = f"/ at level {index}"
            open_div[name] = (c, index)
        else:
            if name not in open_div:
                fail("mod-unmatched", f"{text}: '{name} % {c}' needs an earlier '{name} / {c}'",
                     col)
            if open_div[name][0] != c:
                fail("mod-unmatched", f"{text}: '{name} % {c}' does not match the earlier "
                     f"'{name} / {open_div[name][0]}'", col)
            del open_div[name]

    for index in open_addsub:
        level = levels[index]
        fail("addsub-unclosed", f"level {index} ({level}) needs a later range level on one of "
             "its dimensions", level.column)
    for name, (c, index) in open_div.items():
        level = levels[index]
        fail("div-unmatched", f"level {index} ({level}) needs a later '{name} % {c}' level",
             level.column)
    for dim in dims:
        if dim.name not in used:
            fail("unused-dimension", f"dimension {dim.name!r} is not used by any level",
                 dim.column)
