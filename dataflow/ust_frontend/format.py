"""``TensorFormat``: a validated map from dimensions to storage levels."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dataflow.errors import UserError

from .levels import Dim, LevelFormat, LevelSpec, bounds, evaluate, rename_expr
from .parser import parse_format
from .rules import validate


class TensorFormat:
    """A universal sparse tensor format, e.g. ``TensorFormat("(i, j) -> (i : dense, j : compressed)")``.

    Immutable and hashable. Two formats are equal when they differ only in the names of their
    dimensions (``(i, j) -> (i : dense, j : compressed)`` equals ``(r, c) -> (r : dense,
    c : compressed)``); ``name`` (e.g. "CSR") is a label and takes no part in equality.

    Args:
        dims: the format string, or a sequence of dimension names (or ``Dim``).
        levels: with dimension names, a sequence of ``LevelSpec``.
        name: an optional label.
    """

    __slots__ = ("dims", "levels", "name")

    def __init__(self, dims: str | Sequence[str | Dim],
                 levels: Sequence[LevelSpec] | None = None, *, name: str | None = None):
        if isinstance(dims, str):
            if levels is not None:
                raise TypeError("give either a format string or dims and levels, not both")
            parsed = parse_format(dims)
            validate(parsed.dims, parsed.levels, dims)
            dim_nodes, level_specs = parsed.dims, parsed.levels
        else:
            dim_nodes = tuple(d if isinstance(d, Dim) else Dim(str(d)) for d in dims)
            level_specs = tuple(levels or ())
            for spec in level_specs:
                if not isinstance(spec, LevelSpec):
                    raise TypeError(f"levels must be LevelSpec objects, got {spec!r}")
            validate(dim_nodes, level_specs, _render(dim_nodes, level_specs))
        object.__setattr__(self, "dims", tuple(d.name for d in dim_nodes))
        object.__setattr__(self, "levels", tuple(level_specs))
        object.__setattr__(self, "name", name)

    @classmethod
    def parse(cls, source: str, *, name: str | None = None) -> TensorFormat:
        """Parse a UST or MLIR (``#sparse_tensor.encoding<{ map = ... }>``) format string."""
        return cls(source, name=name)

    def __setattr__(self, key, value):
        raise AttributeError("TensorFormat is immutable")

    def __reduce__(self):
        return (_rebuild, (str(self), self.name))

    # -- text --------------------------------------------------------------------------------
    def __str__(self) -> str:
        return _render([Dim(d) for d in self.dims], self.levels)

    def __repr__(self) -> str:
        label = f", name={self.name!r}" if self.name else ""
        return f"TensorFormat({str(self)!r}{label})"

    # -- identity ----------------------------------------------------------------------------
    def _key(self):
        mapping = {d: f"d{k}" for k, d in enumerate(self.dims)}
        return (len(self.dims),
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
        """Extent of each level: ``a ± b`` -> na + nb - 1, ``i / c`` -> ceil(n / c), ``i % c`` -> c."""
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


def _render(dims: Sequence[Dim], levels: Sequence[LevelSpec]) -> str:
    return (f"({', '.join(d.name for d in dims)}) -> "
            f"({', '.join(str(s) for s in levels)})")


def _rebuild(source: str, name: str | None) -> TensorFormat:
    return TensorFormat(source, name=name)


def as_format(tensor_format: TensorFormat | str) -> TensorFormat:
    """Accept a TensorFormat or a format string."""
    if isinstance(tensor_format, TensorFormat):
        return tensor_format
    if isinstance(tensor_format, str):
        return TensorFormat(tensor_format)
    raise TypeError(f"expected a TensorFormat or a format string, got {tensor_format!r}")


__all__ = ["TensorFormat", "as_format"]
