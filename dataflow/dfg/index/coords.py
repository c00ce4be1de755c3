"""Coordinates as the body computes them, and the walk that turns a tensor's levels into loops.

A `Coord` is an affine function of loop variables plus at most one loaded coordinate (a `crd`
array read at an affine position) times a stride: exactly what one `Addr` can express (the
loaded value is the address's index input). The walk of the iterated (driving) tensor's levels
(`walk_levels`) makes its loops and says what every dimension's coordinate is; a located
tensor (one read at coordinates the loops give, a dense operand) is addressed by `locate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dataflow.dfg.graph import Addr, DFGError, Loop
from dataflow.dfg.index.tensors import Level, LevelKind, TensorLevels


@dataclass(frozen=True)
class CrdLoad:
    """A level coordinate read from `buffer` (a crd array) at affine position `at`.
    `low`, `high`: the smallest and largest value the array holds (for bounds)."""

    buffer: str
    at: Coord
    size: int = 0  # words of the crd array
    low: int = 0
    high: int = 0


@dataclass(frozen=True)
class Coord:
    """sum(coef * var) + const + stride * (value of `loaded`)."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0
    loaded: CrdLoad | None = None
    stride: int = 0

    @staticmethod
    def var(name: str) -> Coord:
        return Coord(((name, 1),))

    def __add__(self, other: Coord) -> Coord:
        terms = dict(self.terms)
        for v, c in other.terms:
            terms[v] = terms.get(v, 0) + c
        if self.loaded is not None and other.loaded is not None and self.loaded != other.loaded:
            raise DFGError("an address needs two loaded coordinates (one index per access)")
        loaded = self.loaded or other.loaded
        stride = self.stride + other.stride
        return Coord(tuple((v, c) for v, c in terms.items() if c), self.const + other.const,
                     loaded if stride else None, stride)

    def __mul__(self, c: int) -> Coord:
        if c == 0:
            return Coord()
        return Coord(tuple((v, k * c) for v, k in self.terms), self.const * c, self.loaded,
                     self.stride * c)

    def shift(self, c: int) -> Coord:
        return Coord(self.terms, self.const + c, self.loaded, self.stride)

    def coef(self, var: str) -> int:
        return sum(c for v, c in self.terms if v == var)

    @property
    def affine(self) -> bool:
        return self.loaded is None

    def addr(self) -> Addr:
        return Addr(self.terms, self.const, index_stride=self.stride)

    def bounds(self, extents: dict[str, int]) -> tuple[int, int]:
        """The smallest and largest value over loop variables in [0, extent) and the loaded
        coordinate in its array's range."""
        lo = hi = self.const
        for v, c in self.terms:
            span = c * (extents[v] - 1)
            lo, hi = lo + min(0, span), hi + max(0, span)
        if self.loaded is not None:
            a, b = self.stride * self.loaded.low, self.stride * self.loaded.high
            lo, hi = lo + min(a, b), hi + max(a, b)
        return lo, hi


def fresh(base: str, taken: set[str]) -> str:
    """`base`, or `base` with the first free number appended; reserved in `taken`."""
    name, k = base, 1
    while name in taken:
        name, k = f"{base}{k}", k + 1
    taken.add(name)
    return name


@dataclass
class LevelLoop:
    """A loop the walk made: the `Loop`, the index variable it belongs to (where the caller's
    loop order puts it), and whether it runs over positions (a compressed level)."""

    loop: Loop
    index_var: str = ""
    positions: bool = False


@dataclass
class Walk:
    """What walking a tensor's levels gives: its loops (level order), every dimension's
    coordinate, and the position of its values."""

    loops: list[LevelLoop] = field(default_factory=list)
    dims: dict[int, Coord] = field(default_factory=dict)
    position: Coord = field(default_factory=Coord)


def crd_names(name: str, t: TensorLevels) -> dict[int, tuple[str, str]]:
    """(crd buffer, pos array) per coordinate-storing level: `A_crd` / `A_pos` when there is
    one such level, else `A_crd{k}` / `A_pos{k}`."""
    stored = [k for k, lv in enumerate(t.levels) if not lv.kind.enumerates]
    if len(stored) == 1:
        return {stored[0]: (f"{name}_crd", f"{name}_pos")}
    return {k: (f"{name}_crd{k}", f"{name}_pos{k}") for k in stored}


def walk_levels(name: str, t: TensorLevels, indices: tuple[str, ...], taken: set[str],
                domain: dict[str, np.ndarray]) -> Walk:
    """The loops that iterate tensor `name` (accessed at `indices`) level by level (TACO's
    level iteration): an enumerating level is a dense loop; a compressed level a loop over
    positions pos[parent] .. pos[parent+1] (a dense loop over positions at the top) whose
    coordinate is a crd load; a singleton level a crd load at its parent's position. Position
    loops are named p, p1, ...; a block level's loops i / c and i % c are io and ii. The pos
    arrays are added to `domain`."""
    w = Walk()
    names = crd_names(name, t)
    level_coord: list[Coord] = []
    count = 1  # positions of the level walked so far
    for k, lv in enumerate(t.levels):
        v = indices[lv.expr.dim]
        if lv.kind.enumerates:
            base = {"": v, "/": f"{v}o", "%": f"{v}i"}.get(lv.expr.op)
            if base is None:
                raise DFGError(f"{name}: an enumerating level of {_spell(lv, indices)} is not "
                               "supported (a diagonal's offsets are a compressed level)")
            var = v if lv.expr.op == "" else fresh(base, taken)
            w.loops.append(LevelLoop(Loop(var, lv.size), v))
            level_coord.append(Coord.var(var).shift(lv.lo))
            w.position = w.position * lv.size + Coord.var(var)
            count *= lv.size
            continue
        crd_buf, pos_name = names[k]
        if lv.kind is LevelKind.COMPRESSED:
            w.position = _position_loop(name, k, t, w, pos_name, taken, domain, v)
            count = int(t.level_pos(k)[-1])
        elif not w.position.affine:
            raise DFGError(f"{name}: singleton level {k} under a loaded position")
        # the coordinates' range: the array's when given, else the level's (a kernel built
        # from the structure's pos arrays alone, as the hand-written kernels were)
        crd = t.crd[k] if k < len(t.crd) else None
        low, high = (int(np.min(crd)), int(np.max(crd))) if crd is not None and len(crd) \
            else (lv.lo, lv.lo + lv.size - 1)
        loaded = CrdLoad(crd_buf, w.position, count, low, high)
        level_coord.append(Coord(loaded=loaded, stride=1))
    w.dims = _dimension_coords(name, t, indices, level_coord)
    _attach_diagonal_loops(t, indices, w)
    return w


def _position_loop(name: str, k: int, t: TensorLevels, w: Walk, pos_name: str,
                   taken: set[str], domain: dict[str, np.ndarray], v: str) -> Coord:
    """The loop over compressed level k's positions; returns the new position."""
    pos = t.level_pos(k)
    var = fresh("p", taken)
    if not w.position.terms and w.position.affine:  # the top: one parent, a dense loop
        start = int(pos[w.position.const])
        extent = int(pos[w.position.const + 1]) - start
        w.loops.append(LevelLoop(Loop(var, extent), v, positions=True))
        return Coord.var(var).shift(start)
    parent = w.position.terms[0][0] if len(w.position.terms) == 1 else None
    if parent is None or w.position != Coord.var(parent):
        raise DFGError(f"{name}: compressed level {k} needs its parent position to be one "
                       f"loop variable, got {w.position.addr()} (flatten the levels above)")
    domain[pos_name] = pos
    w.loops.append(LevelLoop(Loop(var, pos=pos_name, parent=parent), v, positions=True))
    return Coord.var(var)


def _spell(lv: Level, indices: tuple[str, ...]) -> str:
    e = lv.expr
    arg = indices[e.arg] if e.op in ("+", "-") else e.arg
    return f"{indices[e.dim]}{f' {e.op} {arg}' if e.op else ''}"


def _dimension_coords(name: str, t: TensorLevels, indices: tuple[str, ...],
                      level_coord: list[Coord]) -> dict[int, Coord]:
    """Every dimension's coordinate from the level coordinates (the inverse of the level
    expressions, as `TensorFormat.lvl2dim` inverts them)."""
    dims: dict[int, Coord] = {}
    blocks: dict[int, dict[str, Coord]] = {}
    sums = []
    for lv, c in zip(t.levels, level_coord):
        e = lv.expr
        if e.op == "":
            dims[e.dim] = c
        elif e.op in ("/", "%"):
            blocks.setdefault(e.dim, {})[e.op] = c
        else:
            sums.append((e, c))
    for d, parts in blocks.items():
        if set(parts) != {"/", "%"}:
            raise DFGError(f"{name}: dimension {indices[d]} has a block level without its "
                           "offset level (both d / c and d % c are needed)")
        size = next(lv.expr.arg for lv in t.levels if lv.expr.dim == d and lv.expr.op == "/")
        dims[d] = parts["/"] * size + parts["%"]
    for e, c in sums:
        a, b = e.dim, e.arg
        if b in dims and a not in dims:  # a + b = c or a - b = c
            dims[a] = c + dims[b] * (-1 if e.op == "+" else 1)
        elif a in dims and b not in dims:
            dims[b] = (c * -1 + dims[a]) if e.op == "-" else c + dims[a] * -1
        else:
            raise DFGError(f"{name}: level {indices[a]} {e.op} {indices[b]} needs exactly one "
                           "of its dimensions from another level")
    missing = [indices[d] for d in range(len(t.shape)) if d not in dims]
    if missing:
        raise DFGError(f"{name}: no level gives dimension {missing[0]}")
    return dims


def _attach_diagonal_loops(t: TensorLevels, indices: tuple[str, ...], w: Walk) -> None:
    """A diagonal level's loop (a + b or a - b) belongs to the dimension it determines."""
    given = {lv.expr.dim for lv in t.levels if lv.expr.op not in ("+", "-")}
    for ll, lv in zip(_level_loops(t, w), t.levels):
        if ll is not None and lv.expr.op in ("+", "-"):
            e = lv.expr
            ll.index_var = indices[e.arg if e.dim in given else e.dim]


def _level_loops(t: TensorLevels, w: Walk) -> list[LevelLoop | None]:
    """The loop each level made (None for a singleton level), in level order."""
    it = iter(w.loops)
    return [None if lv.kind is LevelKind.SINGLETON else next(it) for lv in t.levels]


def locate(name: str, t: TensorLevels, indices: tuple[str, ...], coords: dict[str, Coord],
           pad: tuple[int, ...] | None = None) -> Coord:
    """The position of `name[indices]` in a tensor whose every level is dense (random access:
    TACO's locate), given each index variable's coordinate. `pad[d]` words of zeros before
    dimension d's coordinate 0 (see `IndexLowering.pads`)."""
    pos = Coord()
    for lv in t.levels:
        e = lv.expr
        if not lv.kind.enumerates or e.op not in ("", "+", "-"):
            raise DFGError(f"{name}: only a tensor of dense levels of whole dimensions can be "
                           f"read at given coordinates, not level {_spell(lv, indices)} "
                           f"({lv.kind.value})")
        c = coords[indices[e.dim]]
        if e.op:
            c = c + coords[indices[e.arg]] * (1 if e.op == "+" else -1)
        lead = 0 if pad is None or e.op else pad[e.dim]
        pos = pos * (lv.size + 2 * lead) + c.shift(lead - lv.lo)
    return pos
