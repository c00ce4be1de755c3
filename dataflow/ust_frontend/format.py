"""``TensorFormat``: a validated map from dimensions to storage levels.

Also the object spelling of nvmath-python: ``Dimension`` objects whose ``//``, ``%``, ``+``
and ``-`` build level expressions, and a dict from level expressions to level formats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dataflow.errors import UserError

from .errors import FormatError, FormatTypeError
from .levels import (
    BinOp,
    Const,
    Dim,
    DimSlice,
    LevelExpr,
    LevelFormat,
    LevelProperty,
    LevelSpec,
    LevelType,
    Sym,
    bounds,
    evaluate,
    rename_expr,
    spell_expr,
)
from .parser import INDEX_WIDTHS, parse_format
from .rules import check_bindings, validate

_INDEX_DTYPES = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}


class Dimension:
    """A named dimension for building formats as objects (nvmath-python's spelling).

    ``i // 2``, ``i % 2``, ``j - i`` and ``i + j`` are level expressions; ``i`` itself is one
    too. Equal when the names are.
    """

    __slots__ = ("dimension_name",)

    def __init__(self, dimension_name: str):
        if not isinstance(dimension_name, str) or not dimension_name.isidentifier():
            raise FormatTypeError("dimension", "a dimension name is an identifier, got "
                                  f"{dimension_name!r}")
        object.__setattr__(self, "dimension_name", dimension_name)

    def __setattr__(self, key, value):
        raise AttributeError("Dimension is immutable")

    @property
    def expr(self) -> Dim:
        return Dim(self.dimension_name)

    def __eq__(self, other) -> bool:
        return isinstance(other, Dimension) and other.dimension_name == self.dimension_name

    def __hash__(self) -> int:
        return hash(("Dimension", self.dimension_name))

    def __repr__(self) -> str:
        return f"Dimension(dimension_name={self.dimension_name!r})"

    def __str__(self) -> str:
        return self.dimension_name

    def __floordiv__(self, c: int) -> BinOp:
        return BinOp("/", self.expr, _const(c))

    def __mod__(self, c: int) -> BinOp:
        return BinOp("%", self.expr, _const(c))

    def __add__(self, other: Dimension) -> BinOp:
        return BinOp("+", self.expr, _operand(other))

    def __sub__(self, other: Dimension) -> BinOp:
        return BinOp("-", self.expr, _operand(other))

    def __mul__(self, c: int) -> BinOp:
        return BinOp("*", self.expr, _const(c))


class TensorFormat:
    """A universal sparse tensor format.

    E.g. ``TensorFormat("(i, j) -> (i : dense, j : compressed)")``.

    Immutable and hashable. Two formats are equal when they differ only in the names of their
    dimensions (``(i, j) -> (i : dense, j : compressed)`` equals ``(r, c) -> (r : dense,
    c : compressed)``); ``name`` (e.g. "CSR") is a label and takes no part in equality.

    MLIR's extras ride along: ``symbols`` (``[s0]``), per-dimension ``slices``, and the index
    widths ``pos_width`` / ``crd_width`` (0: chosen by size), which give ``pos_dtype`` /
    ``crd_dtype``. Symbols and slices take part in equality; the widths, like ``name``, do not.

    Args:
        dims: the format string (UST or MLIR), or a sequence of dimension names, ``Dim`` or
            ``Dimension`` objects.
        levels: with dimensions, a sequence of ``LevelSpec``, or a dict from level expressions
            (``Dimension``, ``i // 2``, ...) to a ``LevelFormat``, a ``LevelType`` or a tuple
            ``(LevelFormat, LevelProperty..., params...)``.
        name: an optional label.
        pos_width, crd_width: index widths in bits (0, 8, 16, 32 or 64); a format string's
            ``posWidth`` / ``crdWidth`` are used when these are not given.
    """

    __slots__ = ("crd_width", "dims", "levels", "name", "pos_width", "slices", "symbols")

    def __init__(self, dims: str | Sequence[str | Dim | Dimension],
                 levels: Sequence[LevelSpec] | Mapping | None = None, *,
                 name: str | None = None, pos_width: int | None = None,
                 crd_width: int | None = None):
        symbols: tuple[Sym, ...] = ()
        slices: tuple[DimSlice | None, ...] = ()
        widths = [0, 0]
        if isinstance(dims, str):
            if levels is not None:
                raise FormatTypeError("arguments", "give either a format string or dims and "
                                      "levels, not both")
            parsed = parse_format(dims)
            validate(parsed.dims, parsed.levels, dims, parsed.symbols)
            check_bindings(parsed.dims, parsed.levels, parsed.bindings, parsed.level_vars, dims)
            dim_nodes, level_specs = parsed.dims, parsed.levels
            symbols, slices = parsed.symbols, parsed.slices
            widths = [parsed.pos_width, parsed.crd_width]
        elif isinstance(dims, (list, tuple)):
            dim_nodes = tuple(_dim_node(d) for d in dims)
            level_specs = _level_specs(levels)
            validate(dim_nodes, level_specs, _render(dim_nodes, level_specs))
        else:
            raise FormatTypeError("arguments", "a format is a format string or a list of "
                                  f"dimensions with levels, got {type(dims).__name__}")
        for k, given in enumerate((pos_width, crd_width)):
            if given is not None:
                if given not in INDEX_WIDTHS:
                    raise FormatError("index-width", f"index width {given!r}: must be one of "
                                      f"{', '.join(map(str, INDEX_WIDTHS))}")
                widths[k] = given
        if not any(slices):
            slices = ()
        for key, value in (("dims", tuple(d.name for d in dim_nodes)),
                           ("levels", tuple(level_specs)), ("name", name),
                           ("symbols", tuple(s.name for s in symbols)), ("slices", slices),
                           ("pos_width", widths[0]), ("crd_width", widths[1])):
            object.__setattr__(self, key, value)

    @classmethod
    def parse(cls, source: str, *, name: str | None = None) -> TensorFormat:
        """Parse a UST or MLIR (``#sparse_tensor.encoding<{ map = ... }>``) format string."""
        return cls(source, name=name)

    def __setattr__(self, key, value):
        raise AttributeError("TensorFormat is immutable")

    def __reduce__(self):
        return (_rebuild, (str(self), self.name, self.pos_width, self.crd_width))

    # -- text --------------------------------------------------------------------------------
    def __str__(self) -> str:
        return _render([Dim(d) for d in self.dims], self.levels, self.symbols, self.slices)

    def __repr__(self) -> str:
        label = f", name={self.name!r}" if self.name else ""
        for key in ("pos_width", "crd_width"):
            if getattr(self, key):
                label += f", {key}={getattr(self, key)}"
        return f"TensorFormat({str(self)!r}{label})"

    def to_mlir(self, encoding: bool = False) -> str:
        """The format in MLIR's spelling: dimensions ``d0, d1, ...``, symbols ``s0, ...``,
        ``floordiv``, ``mod`` and ``nonordered``. With ``encoding=True`` the whole attribute
        ``#sparse_tensor.encoding<{ map = ..., posWidth = ..., crdWidth = ... }>`` (widths
        written when not 0), so the text can be pasted into MLIR."""
        names = {d: f"d{k}" for k, d in enumerate(self.dims)}
        names.update({s: f"s{k}" for k, s in enumerate(self.symbols)})
        head = f"[{', '.join(f's{k}' for k in range(len(self.symbols)))}]" \
            if self.symbols else ""
        dims = ", ".join(f"{names[d]}{_slice_text(self.slices, k)}"
                         for k, d in enumerate(self.dims))
        levels = ", ".join(f"{spell_expr(s.expr, True, names)} : {s.type.spelled(mlir=True)}"
                           for s in self.levels)
        text = f"{head}({dims}) -> ({levels})"
        if not encoding:
            return text
        extra = "".join(f", {key} = {value}" for key, value in (
            ("posWidth", self.pos_width), ("crdWidth", self.crd_width)) if value)
        return f"#sparse_tensor.encoding<{{ map = {text}{extra} }}>"

    # -- identity ----------------------------------------------------------------------------
    def _key(self):
        mapping = {d: f"d{k}" for k, d in enumerate(self.dims)}
        mapping.update({s: f"s{k}" for k, s in enumerate(self.symbols)})
        return (len(self.dims), len(self.symbols), self.slices,
                tuple((rename_expr(s.expr, mapping), s.type) for s in self.levels))

    def __eq__(self, other) -> bool:
        if not isinstance(other, TensorFormat):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    # -- properties --------------------------------------------------------------------------
    @property
    def dimensions(self) -> tuple[str, ...]:
        """nvmath-python's name for ``dims``."""
        return self.dims

    @property
    def num_dimensions(self) -> int:
        return len(self.dims)

    @property
    def num_levels(self) -> int:
        return len(self.levels)

    @property
    def is_identity(self) -> bool:
        """Levels are exactly the dimensions, in order (CSR yes; CSC, BSR, DIA no)."""
        return len(self.levels) == len(self.dims) and all(
            isinstance(s.expr, Dim) and s.expr.name == d for s, d in zip(self.levels, self.dims))

    @property
    def is_dense(self) -> bool:
        """Every level is dense or batch with a plain dimension (a permuted dense array)."""
        return len(self.levels) == len(self.dims) and all(
            isinstance(s.expr, Dim) and s.type.format in (LevelFormat.DENSE, LevelFormat.BATCH)
            for s in self.levels)

    @property
    def pos_dtype(self) -> type[np.signedinteger] | None:
        """The dtype of ``pos`` arrays given by ``posWidth`` (None: chosen by size)."""
        return _INDEX_DTYPES.get(self.pos_width)

    @property
    def crd_dtype(self) -> type[np.signedinteger] | None:
        """The dtype of ``crd`` arrays given by ``crdWidth`` (None: chosen by size)."""
        return _INDEX_DTYPES.get(self.crd_width)

    @property
    def is_ordered(self) -> bool:
        return all(s.type.ordered for s in self.levels)

    @property
    def is_unique(self) -> bool:
        return all(s.type.unique for s in self.levels)

    # -- sizes and index maps ----------------------------------------------------------------
    def _extents(self, shape: Sequence[int]) -> dict[str, int]:
        shape = tuple(int(n) for n in shape)
        if len(shape) != len(self.dims):
            raise UserError(f"shape {shape} has {len(shape)} dimensions but format {self} "
                             f"has {len(self.dims)}")
        return dict(zip(self.dims, shape))

    def level_bounds(self, shape: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """Half-open coordinate range [lo, hi) of each level (lo < 0 for ``j - i`` levels)."""
        extents = self._extents(shape)
        return tuple(bounds(s.expr, extents) for s in self.levels)

    def level_sizes(self, shape: Sequence[int]) -> tuple[int, ...]:
        """Extent of each level: ``a ± b`` -> na + nb - 1, ``i / c`` -> ceil(n / c),
        ``i % c`` -> c."""
        return tuple(hi - lo for lo, hi in self.level_bounds(shape))

    def dim2lvl(self, dim_coords: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Level coordinates of dimension coordinates (vectorised over arrays)."""
        coords = dict(zip(self.dims, (np.asarray(c) for c in dim_coords)))
        return [evaluate(s.expr, coords) for s in self.levels]

    def lvl2dim(self, lvl_coords: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Dimension coordinates of level coordinates (the inverse of ``dim2lvl``)."""
        lvl = [np.asarray(c) for c in lvl_coords]
        out: dict[str, np.ndarray] = {}
        divs: dict[str, int] = {}
        addsubs = []
        ranges = {}
        for k, spec in enumerate(self.levels):
            expr = spec.expr
            if spec.type.format is LevelFormat.RANGE:
                ranges[expr.name] = k
            elif isinstance(expr, Dim):
                out[expr.name] = lvl[k]
            elif expr.op == "*":  # a scaled copy (MLIR's ELL); its dimension has its own level
                continue
            elif expr.op == "/":
                divs[expr.lhs.name] = k
            elif expr.op == "%":
                d = expr.lhs.name
                out[d] = lvl[divs[d]] * expr.rhs.value + lvl[k]
            else:
                addsubs.append((k, expr))
        for k, expr in addsubs:
            a, b = expr.lhs.name, expr.rhs.name
            if a in ranges:
                out[a] = lvl[ranges[a]]
                out[b] = lvl[k] - out[a] if expr.op == "+" else out[a] - lvl[k]
            else:
                out[b] = lvl[ranges[b]]
                out[a] = lvl[k] - out[b] if expr.op == "+" else lvl[k] + out[b]
        return [out[d] for d in self.dims]


def _render(dims: Sequence[Dim], levels: Sequence[LevelSpec], symbols: Sequence[str] = (),
            slices: Sequence[DimSlice | None] = ()) -> str:
    head = f"[{', '.join(symbols)}]" if symbols else ""
    names = ", ".join(f"{d.name}{_slice_text(slices, k)}" for k, d in enumerate(dims))
    return f"{head}({names}) -> ({', '.join(str(s) for s in levels)})"


def _slice_text(slices: Sequence[DimSlice | None], k: int) -> str:
    return f" : {slices[k]}" if k < len(slices) and slices[k] is not None else ""


def _rebuild(source: str, name: str | None, pos_width: int = 0,
             crd_width: int = 0) -> TensorFormat:
    return TensorFormat(source, name=name, pos_width=pos_width, crd_width=crd_width)


# -- the object spelling -------------------------------------------------------------------------


def _const(c) -> Const:
    if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
        raise FormatTypeError("level-expression", f"a block size is an integer, got {c!r}")
    return Const(int(c))


def _operand(other) -> Dim:
    if not isinstance(other, Dimension):
        raise FormatTypeError("level-expression", f"'+' and '-' combine two Dimension "
                              f"objects, got {other!r}")
    return other.expr


def _dim_node(d) -> Dim:
    if isinstance(d, Dim):
        return d
    if isinstance(d, Dimension):
        return d.expr
    if isinstance(d, str):
        return Dim(d)
    raise FormatTypeError("dimension", f"a dimension is a name or a Dimension, got {d!r}")


def _level_specs(levels) -> tuple[LevelSpec, ...]:
    if isinstance(levels, Mapping):
        return tuple(LevelSpec(_level_expr(key), _level_type(value))
                     for key, value in levels.items())
    if not isinstance(levels, (list, tuple)) and levels is not None:
        raise FormatTypeError("levels", "levels are a dict or a list of LevelSpec, got "
                              f"{type(levels).__name__}")
    specs = tuple(levels or ())
    for spec in specs:
        if not isinstance(spec, LevelSpec):
            raise FormatTypeError("levels", f"levels must be LevelSpec objects, got {spec!r}")
    return specs


def _level_expr(key) -> LevelExpr:
    if isinstance(key, Dimension):
        return key.expr
    if isinstance(key, (Dim, BinOp)):
        return key
    raise FormatTypeError("level-expression", "a level key is a Dimension or an expression "
                          f"such as i // 2, got {key!r}")


def _level_type(value) -> LevelType:
    """A LevelFormat, a LevelType, or ``(LevelFormat, LevelProperty..., params...)``."""
    if isinstance(value, LevelType):
        return value
    parts = value if isinstance(value, tuple) else (value,)
    if not parts or not isinstance(parts[0], LevelFormat):
        raise FormatTypeError("level-type", "a level type is a LevelFormat or a tuple "
                              f"(LevelFormat, LevelProperty...), got {value!r}")
    props, params = set(), []
    for part in parts[1:]:
        if isinstance(part, LevelProperty):
            props.add(part)
        elif isinstance(part, (int, np.integer)) and not isinstance(part, bool):
            params.append(int(part))
        elif isinstance(part, tuple) and all(isinstance(p, int) for p in part):
            params.extend(part)
        else:
            raise FormatTypeError("level-type", f"{part!r} is neither a LevelProperty nor an "
                                  "integer parameter")
    return LevelType(parts[0], unique=LevelProperty.NONUNIQUE not in props,
                     ordered=LevelProperty.UNORDERED not in props, params=tuple(params),
                     soa=LevelProperty.SOA in props)


def as_format(tensor_format: TensorFormat | str) -> TensorFormat:
    """Accept a TensorFormat or a format string."""
    if isinstance(tensor_format, TensorFormat):
        return tensor_format
    if isinstance(tensor_format, str):
        return TensorFormat(tensor_format)
    raise FormatTypeError("arguments", "expected a TensorFormat or a format string, got "
                          f"{type(tensor_format).__name__}")


__all__ = ["Dimension", "TensorFormat", "as_format"]
