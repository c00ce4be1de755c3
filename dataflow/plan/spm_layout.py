"""SPM layout of multi-layer butterfly buffers chosen against the mapped schedule.

The skewed layout of `dfg.lower_butterfly` puts a sub-butterfly's points on different SPM lines;
which index bit gets which skew weight (and which bits are flipped) is free, and
`choose_layout` picks the permutation and flip mask per data buffer with the fewest SPM
port-conflict stalls, measured by the engine on two tiles of the mapped schedules
(`plan.orchestrate.plan_orchestration` calls it). The search costs seconds to minutes, so the
choice is kept in memory and on disk beside the plan cache (framed like a plan file: code
fingerprint and checksum; a damaged or invalid file is deleted and rewritten).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import numpy as np

from dataflow.arch.spec import ArchSpec
from dataflow.cachefiles import BoundedCache, read_entry, resolve_cache_dir, write_entry
from dataflow.dfg.lower import live_kernel
from dataflow.dfg.lower_butterfly import (
    ButterflyKind,
    ButterflySpec,
    group_kernel,
    lower_butterfly,
)
from dataflow.mapper.mapping import Mapping
from dataflow.mapper.tiling import tile_and_allocate
from dataflow.pe_array.simulate import run_array
from dataflow.plan.layout_cost import kernel_stalls
from dataflow.plan.stage_mapping import map_stage_kernel, shape_key

LAYOUT_CANDIDATES = 16  # random layouts per plan (seeded), then twice as many local moves
LAYOUT_CACHE_ENTRIES = 256  # layout choices kept in memory per process
_LAYOUTS = BoundedCache(LAYOUT_CACHE_ENTRIES)


def layout_stalls(spec: ButterflySpec, arch: ArchSpec, groups, rows: int, budget,
                  mode: str = "multilayer") -> int:
    """SPM port-conflict stall cycles of two tiles of `rows` batch blocks with `spec`'s layout
    (the engine's count on the mapped schedules, zeros for data: conflicts depend on addresses
    and issue cycles only)."""

    prog, kms = _two_tile_program(spec, arch, groups, rows, budget)
    mapping = Mapping(program=prog, arch=arch, kernels=tuple(kms), orchestration=mode)
    return sum(t.stall_cycles_spm_conflict for a in run_array(mapping, "fast") for t in a.tiles)


def _two_tile_program(spec: ButterflySpec, arch: ArchSpec, groups, rows: int, budget):
    """The program of two tiles of `rows` batch blocks with `spec`'s layout (zeros for data),
    and its stage kernels mapped."""
    # two tiles: streamed buffers alternate between the halves of their double buffer
    one = dataclasses.replace(spec, batch=2 * rows * spec.col_blocks * spec.lanes)
    x = np.zeros((one.batch, one.n), np.float32)
    factors = None
    if spec.kind != ButterflyKind.FFT:
        dtype = np.complex64 if spec.kind == ButterflyKind.COMPLEX else np.float32
        factors = [np.zeros((spec.n // 2, 2, 2), dtype) for _ in range(spec.stages)]
    prog = lower_butterfly(one, groups, x, factors, np.zeros(spec.n) if spec.bias else None)
    return prog, [map_stage_kernel(k, arch, rows, budget) for k in prog.kernels]




def choose_layout(spec: ButterflySpec, arch: ArchSpec, groups, rows: int, budget,
                  mode: str = "multilayer", candidates: int | None = None):
    """Bit permutations and flip masks of the data buffers' skewed layouts
    (`ButterflySpec.skew_perm`, `skew_flip`)
    with the fewest SPM port-conflict stalls on two tiles of the mapped schedules.

    The modulo scheduler does not know SPM lines; with one write port per line, stores issued
    in the same cycle to one line stall the lock-step array (the engine's rule). Any bit
    permutation keeps the skewed layout one-to-one on the same rows, so the layout is free to
    follow the schedule (so is flipping bits: P xor mask, a mirror of the rows): identity plus
    `candidates` seeded random layouts, then 2 x `candidates` local moves from the best (swap two
    bits' weights or flip one bit of one buffer; kept when the stalls fall). The input and
    output layouts are the DMA's (it places every row of a tile, `pack_data`/`unpack_data`), so
    they are free too. Returns ((permutations, masks), a note); ((), ()) and "" when there is
    nothing to choose."""
    G = len(groups)
    if G < 2 or not spec.skew_lines:
        return ((), ()), ""
    n_cand = LAYOUT_CANDIDATES if candidates is None else candidates
    key = (_shape_spec(spec), arch, tuple(groups), rows, budget, n_cand)
    if key in _LAYOUTS:
        return _LAYOUTS.get(key)
    stored = _layout_disk_get(key, spec.stages, G + 1)
    if stored is not None:
        _LAYOUTS.put(key, stored)
        return stored
    S = spec.stages
    ident = (tuple(tuple(range(S)) for _ in range(G + 1)), (0,) * (G + 1))
    cost = _LayoutCost(spec, arch, groups, rows, budget, mode)

    def draw(rng):
        return tuple(int(v) for v in rng.permutation(S)), int(rng.integers(0, spec.n))

    base = cost(ident)
    best, best_cost = ident, base
    rng = np.random.default_rng(S * 1000 + G)
    tried = 1
    # random layouts of all buffers
    for _ in range(n_cand):
        if best_cost == 0:
            break
        # permutations first (flips left to the local moves: a smaller space to sample)
        cand = (tuple(draw(rng)[0] for _ in range(G + 1)), (0,) * (G + 1))
        c = cost(cand, best_cost)
        tried += 1
        if c < best_cost:
            best, best_cost = cand, c
    # then local moves from the best: swap two bits' weights or flip one bit, one buffer
    for _ in range(2 * n_cand):
        if best_cost == 0:
            break
        i = int(rng.integers(0, G + 1))
        perm, mask = list(best[0][i]), best[1][i]
        if rng.random() < 0.5:
            a, b = rng.choice(S, 2, replace=False)
            perm[a], perm[b] = perm[b], perm[a]
        else:
            mask ^= 1 << int(rng.integers(0, S))
        cand = (best[0][:i] + (tuple(int(v) for v in perm),) + best[0][i + 1:],
                best[1][:i] + (mask,) + best[1][i + 1:])
        c = cost(cand, best_cost)
        tried += 1
        if c < best_cost:
            best, best_cost = cand, c
    n_cand = tried - 1
    note = ("SPM layout: bit permutations and flips of the data buffers chosen against the "
            "schedule "
            f"({base} -> {best_cost} conflict stall cycles on two tiles of {rows} block(s), "
            f"{n_cand + 1} layouts tried)")
    out = (((), ()) if best == ident else best), note
    _LAYOUTS.put(key, out)
    _layout_disk_put(key, out)
    return out


class _LayoutCost:
    """`layout_stalls` of a layout, kernel by kernel: kernel i reads data buffer i and writes
    buffer i + 1, so its stalls depend on those two buffers' layouts only and are kept per
    (i, layout of buffer i, layout of buffer i + 1); a local move of the search re-counts the
    one or two kernels it touches. A kernel is built alone (`group_kernel`, dead nodes dropped
    as the lowering does), takes the schedule of the identity layout's kernel (the layout
    moves addresses only, so the body and its schedule are the same; `map_stage_kernel` when
    not) with its own tiles and SPM allocation, and is counted by `layout_cost.kernel_stalls`
    (the engine's count without the values). A kernel that cannot be counted so sends the
    whole layout to the engine (`layout_stalls`). The chosen layout is lowered, mapped and
    checked in full by the caller."""

    def __init__(self, spec, arch, groups, rows, budget, mode):
        self.spec, self.arch, self.groups = spec, arch, groups
        self.rows, self.budget, self.mode = rows, budget, mode
        self.per_kernel: dict = {}
        self.program = None  # the identity layout's two-tile program and mappings
        self.shapes: dict = {}  # kernel index -> shape_key of the identity layout's body

    def __call__(self, layout, bound: float = math.inf) -> int:
        """The layout's stalls; once the kernels counted so far reach `bound` (the best
        layout's stalls: only fewer replace it; stalls are never negative), that partial sum,
        and the other kernels are not counted
        (docs/planning_speed.md#a-bound-in-the-layout-search)."""
        perms, masks = layout
        keys = [(i, perms[i], masks[i], perms[i + 1], masks[i + 1])
                for i in range(len(self.groups))]
        if self.program is None:
            self.program = _two_tile_program(self.spec, self.arch, self.groups, self.rows,
                                             self.budget)
        spec = dataclasses.replace(self.spec, skew_perm=perms, skew_flip=masks)
        # kernels already counted first: their sum may reach the bound before any new count
        known = sum(self.per_kernel[k] for k in keys if k in self.per_kernel)
        if known >= bound:
            return known
        total = known
        for k in keys:
            if k not in self.per_kernel:
                stalls = kernel_stalls(self._mapping(spec, k[0]), self.arch)
                if stalls is None:
                    return layout_stalls(spec, self.arch, self.groups, self.rows, self.budget,
                                         self.mode)
                self.per_kernel[k] = stalls
                total += stalls
                if total >= bound:
                    return total
        return total

    def _mapping(self, spec, i: int):
        kms = self.program[1]
        one = dataclasses.replace(spec, batch=2 * self.rows * spec.col_blocks * spec.lanes)
        kernel = live_kernel(group_kernel(one, self.groups[i], len(self.groups), i))
        if i not in self.shapes:  # the identity layout's body, keyed once per kernel
            self.shapes[i] = shape_key(kms[i].kernel, self.arch)
        if shape_key(kernel, self.arch) != self.shapes[i]:
            return map_stage_kernel(kernel, self.arch, self.rows, self.budget)
        tiles, allocs = tile_and_allocate(kernel, self.arch, self.rows)
        return dataclasses.replace(kms[i], kernel=kernel, tiles=tiles, allocations=allocs)


LAYOUT_KIND = "layout"
LAYOUT_FORMAT_VERSION = 1


def _layout_file(key):
    """The on-disk home of a layout choice: `<plan cache dir>/layouts/<hash of key>.json`
    (the search costs seconds to minutes; a later process reuses it). The file is framed by
    `cachefiles.frame_entry` (kind, version, code fingerprint, SHA-256), then JSON."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:32]
    return resolve_cache_dir() / "layouts" / f"{digest}.json"


def _layout_disk_get(key, stages: int, buffers: int):
    """A stored layout choice, or None. A file that is unreadable, fails its header or
    checksum, is not JSON, is for another key, or holds no valid layout for `buffers` data
    buffers of a `stages`-stage butterfly is deleted (the search then rewrites it)."""
    return read_entry(_layout_file(key), LAYOUT_KIND, LAYOUT_FORMAT_VERSION,
                      lambda payload: _valid_layout(json.loads(payload), repr(key), stages,
                                                    buffers),
                      errors=(ValueError, KeyError, TypeError))


def _valid_layout(data, key_repr: str, stages: int, buffers: int):
    """((perms, masks), note) from a layout file's JSON; ValueError on any other content."""
    if not isinstance(data, dict) or data.get("key") != key_repr:
        raise ValueError("a layout for another key")
    perms, masks, note = data["perms"], data["masks"], data["note"]
    if not (isinstance(perms, list) and isinstance(masks, list) and isinstance(note, str)):
        raise ValueError("perms, masks and note must be two lists and a string")
    if (perms, masks) == ([], []):
        return ((), ()), note  # the identity layout won
    if len(perms) != buffers or len(masks) != buffers:
        raise ValueError(f"expected {buffers} permutations and masks")
    if any(not isinstance(q, list) or sorted(q) != list(range(stages)) for q in perms):
        raise ValueError(f"permutations must be of range({stages})")
    if any(type(m) is not int or not 0 <= m < 1 << stages for m in masks):
        raise ValueError(f"masks must lie in [0, 2**{stages})")
    if any(type(v) is not int for q in perms for v in q):
        raise ValueError("permutation entries must be integers")
    return (tuple(tuple(q) for q in perms), tuple(masks)), note


def _layout_disk_put(key, out) -> None:
    (perms, masks), note = out
    payload = json.dumps({"key": repr(key), "perms": [list(p) for p in perms],
                          "masks": list(masks), "note": note}).encode()
    write_entry(_layout_file(key), LAYOUT_KIND, LAYOUT_FORMAT_VERSION, payload)


def _shape_spec(spec: ButterflySpec) -> ButterflySpec:
    """The spec without its batch (the layout choice is per tile)."""
    return dataclasses.replace(spec, batch=spec.col_blocks * spec.lanes, skew_perm=(), skew_flip=())
