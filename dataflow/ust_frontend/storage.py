"""Level-by-level walking and building of UST storage: the core of ``convert``.

``walk`` enumerates the stored entries of any format (level coordinates + position in ``val``)
by descending its levels; ``build`` lays out entries in any format by sorting them on their level
coordinates and creating each level's ``pos`` / ``crd`` in turn. Conversion between any two
formats is ``walk`` -> ``lvl2dim`` -> ``dim2lvl`` -> ``build``; there are no pairwise converters.

Storage conventions (nvmath-python / MLIR):
- dense, batch and range levels store nothing; range enumerates its dimension's full extent.
- compressed and delta store ``pos`` (length parents + 1) and ``crd``; delta's ``crd`` holds the
  gap to the previous coordinate of the segment (the first gap counts from the level's lower
  bound); a gap wider than ``2**bits - 1`` is bridged with explicitly stored zeros.
- loose_compressed stores ``pos`` as [lo, hi) pairs (length 2 * parents); when built here every
  parent owns an equally wide slot range (ELL layout) padded with coordinate 0 / value 0.
- singleton stores ``crd`` aligned with its parent's positions.
- structured[n, m] stores exactly n coordinates (offsets within the group of m) per parent;
  groups with fewer nonzeros are padded with explicit zeros at the lowest free offsets.
- batch levels are stored like dense levels: the arrays of the levels below are global (one
  pos/crd per level across all batches), not MLIR's per-batch arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dataflow.errors import UserError

from .format import TensorFormat
from .levels import ENUMERATING, LevelFormat

_I64 = np.int64


class LayoutError(UserError):
    """The tensor's nonzero pattern cannot be stored in the requested format."""


@dataclass(frozen=True)
class Storage:
    """Per-level arrays (None where a level stores nothing) and the value array."""

    pos: tuple[np.ndarray | None, ...]
    crd: tuple[np.ndarray | None, ...]
    val: np.ndarray


def _segment_positions(start: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of arange(start[k], start[k] + counts[k]) over k."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, _I64)
    offsets = np.cumsum(counts) - counts
    return np.arange(total, dtype=_I64) - np.repeat(offsets - start, counts)


def decode_delta(pos: np.ndarray, gaps: np.ndarray, lo: int = 0) -> np.ndarray:
    """Absolute coordinates of a delta level from its pos array and gap-coded crd."""
    pos = np.asarray(pos, _I64)
    gaps = np.asarray(gaps, _I64)
    running = np.cumsum(gaps)
    starts, counts = pos[:-1], np.diff(pos)
    base = np.zeros(len(counts), _I64)
    nonempty = counts > 0
    base[nonempty] = running[starts[nonempty]] - gaps[starts[nonempty]]
    out = running.copy()
    covered = _segment_positions(starts, counts)
    out[covered] = running[covered] - np.repeat(base, counts) + lo
    return out


def walk(fmt: TensorFormat, shape: Sequence[int], storage: Storage
         ) -> tuple[list[np.ndarray], np.ndarray]:
    """Level coordinates of every stored position, and that position's index into ``val``."""
    level_bounds = fmt.level_bounds(shape)
    parent = np.zeros(1, _I64)
    coords: list[np.ndarray] = []
    for k, spec in enumerate(fmt.levels):
        lo, hi = level_bounds[k]
        kind = spec.type.format
        pos, crd = storage.pos[k], storage.crd[k]
        if kind in ENUMERATING:
            size = hi - lo
            child = (parent[:, None] * size + np.arange(size, dtype=_I64)).ravel()
            coords = [np.repeat(c, size) for c in coords]
            coords.append(np.tile(np.arange(lo, hi, dtype=_I64), len(parent)))
        elif kind is LevelFormat.SINGLETON:
            child = parent
            coords.append(np.asarray(crd, _I64)[parent])
        elif kind is LevelFormat.STRUCTURED:
            n = spec.type.params[0]
            child = (parent[:, None] * n + np.arange(n, dtype=_I64)).ravel()
            coords = [np.repeat(c, n) for c in coords]
            coords.append(np.asarray(crd, _I64)[child] + lo)
        else:
            pos = np.asarray(pos, _I64)
            if kind is LevelFormat.LOOSE_COMPRESSED:
                start, end = pos[2 * parent], pos[2 * parent + 1]
            else:
                start, end = pos[parent], pos[parent + 1]
            counts = end - start
            child = _segment_positions(start, counts)
            owner = np.repeat(np.arange(len(parent)), counts)
            coords = [c[owner] for c in coords]
            if kind is LevelFormat.DELTA:
                coords.append(decode_delta(pos, crd, lo)[child])
            else:
                coords.append(np.asarray(crd, _I64)[child])
        parent = child
    return coords, parent


def entries(fmt: TensorFormat, shape: Sequence[int], storage: Storage, *,
            keep_stored_zeros: bool | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """Dimension coordinates and values of the entries a tensor stores.

    Positions outside the shape (range padding, partial blocks) are dropped. Zeros are dropped
    too, unless every stored value has its own coordinate (last level compressed,
    loose_compressed or singleton): there an explicit zero is part of the sparsity pattern,
    whereas the zeros of dense, range, structured or delta levels are just filler.
    """
    lvl, positions = walk(fmt, shape, storage)
    values = np.asarray(storage.val)[positions]
    dims = [np.asarray(d, _I64) for d in fmt.lvl2dim(lvl)]
    mask = np.ones(len(positions), bool)
    for d, n in zip(dims, shape):
        mask &= (d >= 0) & (d < n)
    if keep_stored_zeros is None:
        keep_stored_zeros = bool(fmt.levels) and fmt.levels[-1].type.format in (
            LevelFormat.COMPRESSED, LevelFormat.LOOSE_COMPRESSED, LevelFormat.SINGLETON)
    if not keep_stored_zeros:
        mask &= values != 0
    return [d[mask] for d in dims], values[mask]


# --------------------------------------------------------------------------------------------
# building


def _sort(lvl: list[np.ndarray], values: np.ndarray):
    if not lvl or len(values) == 0:
        return lvl, values
    order = np.lexsort(lvl[::-1])
    return [c[order] for c in lvl], values[order]


def _pad_delta(fmt, level_bounds, lvl, values):
    """Insert zero entries so that every gap of every delta level fits its bit width."""
    for k, spec in enumerate(fmt.levels):
        if spec.type.format is not LevelFormat.DELTA or len(values) == 0:
            continue
        widest = (1 << spec.type.params[0]) - 1
        lo = level_bounds[k][0]
        new_segment = np.zeros(len(values), bool)
        new_segment[0] = True
        for c in lvl[:k]:
            new_segment[1:] |= c[1:] != c[:-1]
        previous = np.empty(len(values), _I64)
        previous[0] = lo
        previous[1:] = lvl[k][:-1]
        previous[new_segment] = lo
        gaps = lvl[k] - previous
        extra = np.maximum(0, -(-gaps // widest) - 1) if widest > 0 else gaps * 0
        if not extra.any():
            continue
        owner = np.repeat(np.arange(len(values)), extra)
        step = _segment_positions(np.ones(len(extra), _I64), extra)
        pads = [c[owner] for c in lvl[:k]] + [previous[owner] + step * widest]
        pads += [np.full(len(owner), level_bounds[j][0], _I64) for j in range(k + 1, len(lvl))]
        lvl = [np.concatenate([a, b]) for a, b in zip(lvl, pads)]
        values = np.concatenate([values, np.zeros(len(owner), values.dtype)])
        lvl, values = _sort(lvl, values)
    return lvl, values


def build(fmt: TensorFormat, shape: Sequence[int], dim_coords: Sequence[np.ndarray],
          values: np.ndarray, *, index_type=None) -> Storage:
    """Storage of ``fmt`` holding the given entries (duplicates in unique levels are summed)."""
    values = np.asarray(values)
    level_bounds = fmt.level_bounds(shape)
    n = len(values)
    lvl = [np.broadcast_to(np.asarray(c, _I64), (n,)).copy()
           for c in fmt.dim2lvl([np.asarray(d, _I64) for d in dim_coords])]
    lvl, values = _sort(lvl, values)
    lvl, values = _pad_delta(fmt, level_bounds, lvl, values)
    n = len(values)
    parent, nparent = np.zeros(n, _I64), 1
    pos: list[np.ndarray | None] = []
    crd: list[np.ndarray | None] = []
    for k, spec in enumerate(fmt.levels):
        lo, hi = level_bounds[k]
        kind, c = spec.type.format, lvl[k]
        if kind in ENUMERATING:
            parent, nparent = parent * (hi - lo) + (c - lo), nparent * (hi - lo)
            pos.append(None)
            crd.append(None)
        elif kind is LevelFormat.SINGLETON:
            clash = (parent[1:] == parent[:-1]) & (c[1:] != c[:-1])
            if clash.any():
                raise LayoutError(f"level {k} ({spec}) is singleton, but its parent position "
                                  f"{parent[1:][clash][0]} holds several coordinates")
            out = np.zeros(nparent, _I64)
            out[parent] = c
            pos.append(None)
            crd.append(out)
        elif kind is LevelFormat.STRUCTURED:
            return _build_structured(spec, k, lo, parent, nparent, c, values, pos, crd,
                                     index_type, fmt)
        else:
            first = np.ones(n, bool)
            if spec.type.unique:
                first[1:] = (parent[1:] != parent[:-1]) | (c[1:] != c[:-1])
            child = np.cumsum(first) - 1
            owner, coord = parent[first], c[first]
            counts = np.bincount(owner, minlength=nparent).astype(_I64)
            starts = np.cumsum(counts) - counts
            if kind is LevelFormat.LOOSE_COMPRESSED:
                width = int(counts.max()) if nparent and counts.size else 0
                slot = np.arange(nparent, dtype=_I64) * width
                rank = np.arange(len(owner), dtype=_I64) - starts[owner]
                where = slot[owner] + rank
                level_crd = np.zeros(nparent * width, _I64)
                level_crd[where] = coord
                pos.append(np.stack([slot, slot + counts], axis=1).ravel())
                crd.append(level_crd)
                parent, nparent = where[child], nparent * width
                continue
            pos.append(np.concatenate([[0], np.cumsum(counts)]).astype(_I64))
            if kind is LevelFormat.DELTA:
                gaps = coord.copy()
                same = np.zeros(len(owner), bool)
                same[1:] = owner[1:] == owner[:-1]
                gaps[1:][same[1:]] = coord[1:][same[1:]] - coord[:-1][same[1:]]
                gaps[~same] -= lo
                crd.append(gaps)
            else:
                crd.append(coord)
            parent, nparent = child, len(owner)
    val = np.zeros(nparent, values.dtype)
    np.add.at(val, parent, values)
    return _finish(pos, crd, val, index_type, fmt)


def _build_structured(spec, k, lo, parent, nparent, c, values, pos, crd, index_type, fmt):
    n, m = spec.type.params
    grid = np.zeros((nparent, m), values.dtype)
    np.add.at(grid, (parent, c - lo), values)
    present = np.zeros((nparent, m), bool)
    present[parent, c - lo] = True
    counts = present.sum(axis=1)
    if (counts > n).any():
        group = int(np.flatnonzero(counts > n)[0])
        raise LayoutError(f"level {k} ({spec}) keeps {n} of every {m}, but group {group} has "
                          f"{int(counts[group])} nonzeros")
    free = ~present
    fill = free & (np.cumsum(free, axis=1) <= (n - counts)[:, None])
    chosen = present | fill
    crd.append(np.nonzero(chosen)[1].astype(_I64))
    pos.append(None)
    return _finish(pos, crd, grid[chosen], index_type, fmt)


def _finish(pos, crd, val, index_type, fmt: TensorFormat) -> Storage:
    """Index arrays in their dtypes: the format's `posWidth` / `crdWidth` where it gives them
    (MLIR's encoding), else `index_type`, else the narrowest of int32 / int64 that holds them."""
    if index_type is None:
        largest = max([int(np.abs(a).max()) for a in pos + crd if a is not None and a.size] + [0])
        index_type = np.int32 if largest < 2**31 - 1 else np.int64
    return Storage(_cast_index(pos, fmt.pos_dtype or index_type, "posWidth"),
                   _cast_index(crd, fmt.crd_dtype or index_type, "crdWidth"), val)


def _cast_index(arrays, dtype, width: str) -> tuple:
    top = np.iinfo(dtype).max
    for k, a in enumerate(arrays):
        if a is not None and a.size and int(a.max()) > top:
            raise LayoutError(f"level {k}: index {int(a.max())} does not fit {width} "
                              f"({np.dtype(dtype).itemsize * 8} bits, at most {top})")
    return tuple(None if a is None else a.astype(dtype) for a in arrays)


def _singleton_coords(crd: np.ndarray, nparent: int, bad) -> np.ndarray:
    """A singleton level's coordinates, after checking it has one per parent position."""
    if len(crd) < nparent:
        bad(f"crd has {len(crd)} entries for {nparent} parent positions")
    return crd[:nparent]  # a singleton level keeps its parent's positions


def _verify_structured(t, crd: np.ndarray, nparent: int, bad) -> int:
    """Check an n:m structured level; returns the positions it addresses."""
    n, m = t.params
    if len(crd) != nparent * n:
        bad(f"crd has {len(crd)} entries, expected {n} for each of {nparent} groups")
    if len(crd) and ((crd < 0) | (crd >= m)).any():
        bad(f"crd holds offsets outside [0, {m})")
    return nparent * n


def _segment_bounds(kind, pos: np.ndarray, crd: np.ndarray, nparent: int, bad):
    """(starts, ends) of a compressed level's segments, after checking `pos` describes them."""
    if kind is LevelFormat.LOOSE_COMPRESSED:
        if len(pos) != 2 * nparent:
            bad(f"pos has {len(pos)} entries, expected 2 x {nparent}")
        starts, ends = pos[0::2], pos[1::2]
        if (ends < starts).any() or (starts < 0).any() or (ends > len(crd)).any():
            bad("pos pairs are not ranges within crd")
    else:
        if len(pos) != nparent + 1:
            bad(f"pos has {len(pos)} entries, expected {nparent + 1}")
        if pos[0] != 0 or (np.diff(pos) < 0).any() or pos[-1] > len(crd):
            bad("pos is not a non-decreasing sequence from 0 to at most len(crd)")
        starts, ends = pos[:-1], pos[1:]
    return starts, ends


def _check_segment_order(t, coords: np.ndarray, counts: np.ndarray, bad) -> None:
    """An ordered level's coordinates rise within each segment (strictly when unique)."""
    if t.ordered and len(coords) > 1:
        step = np.diff(coords)
        same = np.repeat(np.arange(len(counts)), counts)
        inner = same[1:] == same[:-1]
        if (step[inner] < (1 if t.unique else 0)).any():
            bad("crd is not " + ("strictly increasing" if t.unique else "sorted")
                + " within a segment")


def _compressed_coords(kind, t, pos, crd: np.ndarray, lo: int, nparent: int, bad):
    """Check a compressed (or loose, or delta) level; returns (coordinates, positions)."""
    pos = np.asarray(pos, _I64)
    starts, ends = _segment_bounds(kind, pos, crd, nparent, bad)
    counts = ends - starts
    covered = _segment_positions(starts, counts)
    coords = decode_delta(pos, crd, lo) if kind is LevelFormat.DELTA else crd
    if kind is LevelFormat.DELTA and ((crd[covered] < 0)
                                      | (crd[covered] >= 1 << t.params[0])).any():
        bad(f"a gap does not fit in {t.params[0]} bits")
    coords = coords[covered]
    _check_segment_order(t, coords, counts, bad)
    return coords, len(crd) if kind is LevelFormat.LOOSE_COMPRESSED else int(pos[-1])


def verify(fmt: TensorFormat, shape: Sequence[int], storage: Storage) -> None:
    """Check the storage invariants of every level; raise ValueError naming the level."""
    level_bounds = fmt.level_bounds(shape)
    nparent = 1
    for k, spec in enumerate(fmt.levels):
        lo, hi = level_bounds[k]
        kind, t = spec.type.format, spec.type
        pos, crd = storage.pos[k], storage.crd[k]

        def bad(what: str, k=k, spec=spec):
            raise UserError(f"level {k} ({spec}): {what}")

        if kind in ENUMERATING:
            nparent *= hi - lo
            continue
        crd = np.asarray(crd, _I64)
        if kind is LevelFormat.SINGLETON:
            coords = _singleton_coords(crd, nparent, bad)
        elif kind is LevelFormat.STRUCTURED:
            nparent = _verify_structured(t, crd, nparent, bad)
            continue
        else:
            coords, nparent = _compressed_coords(kind, t, pos, crd, lo, nparent, bad)
        if len(coords) and ((coords < lo) | (coords >= hi)).any():
            bad(f"a coordinate lies outside the level's range [{lo}, {hi})")
    if len(storage.val) != nparent:
        raise UserError(f"val has {len(storage.val)} entries, but the levels address "
                         f"{nparent} positions")
