"""Tiling of the outermost loop so each tile's working set fits the SPM, and SPM allocation.

A buffer is *resident* when its addresses do not move with the outermost loop (or come from a
gathered index, which the mapper cannot know without reading data), else *streamed*: each tile
loads only the address window it touches, double-buffered so the next tile's load overlaps this
tile's compute. The mapper reads the domain's `pos` arrays (iteration extents) but never values.
"""

from __future__ import annotations

import numpy as np

from dataflow.arch.spec import AddressMapping, ArchSpec
from dataflow.dfg.domain import enumerate_domain
from dataflow.dfg.graph import Kernel
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import MappingError, SPMAllocation, Tile


def classify_buffers(kernel: Kernel) -> dict[str, bool]:
    """buffer name -> streamed? (False = resident for the whole kernel)."""
    outer = kernel.loops[0].var
    # variables that move with the outer loop: itself and sparse loops nested under it
    moving = {outer}
    for lp in kernel.loops[1:]:
        if not lp.is_dense and lp.parent in moving:
            moving.add(lp.var)
    streamed = {b.name: False for b in kernel.buffers}
    for n in kernel.nodes:
        if n.op in (Op.LOAD, Op.STORE, Op.ACC, Op.MACC) and any(
                v in moving and c for v, c in n.addr.terms):
            streamed[n.buffer] = True
    # a buffer touched by any indirect access must be whole, and so must one handed over in
    # the SPM (the whole of it stays there between kernels)
    for n in kernel.nodes:
        if n.op.is_indirect:
            streamed[n.buffer] = False
    for b in kernel.buffers:
        if b.held:
            streamed[b.name] = False
    return streamed


def _row_windows(kernel: Kernel, lanes: int,
                 streamed: dict[str, bool]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per streamed buffer, per outer index: (min word, max word + 1) touched; empty rows get
    (+inf, -inf) so they never widen a window."""
    outer = kernel.loops[0]
    dom = enumerate_domain(kernel, lanes)
    o = dom[outer.var]
    # per buffer, each iteration's lowest and highest word over the buffer's nodes, then one
    # reduction per outer index (the min of mins is the min: integers, any order)
    spans: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for n in kernel.nodes:
        if not n.op.is_memory or not streamed[n.buffer]:
            continue
        a = np.full(len(o), n.addr.const, dtype=np.int64)
        for v, c in n.addr.terms:
            a += c * dom[v]
        if kernel.vector_var is not None and not n.addr.span:
            c = n.addr.coef(kernel.vector_var)
            if c:
                extent = kernel.vector_extent
                active = np.minimum(lanes, extent - dom[kernel.vector_var])
                span_arr = (active - 1) * c
                lo_a, hi_a = np.minimum(a, a + span_arr), np.maximum(a, a + span_arr) + 1
            else:
                lo_a, hi_a = a, a + 1
        else:
            lo_a, hi_a = a, a + max(1, n.addr.span)
        if n.buffer in spans:
            lo_a = np.minimum(lo_a, spans[n.buffer][0])
            hi_a = np.maximum(hi_a, spans[n.buffer][1])
        spans[n.buffer] = (lo_a, hi_a)
    return {name: (_per_outer(np.minimum, np.iinfo(np.int64).max, o, lo_a, outer.extent),
                   _per_outer(np.maximum, np.iinfo(np.int64).min, o, hi_a, outer.extent))
            for name, (lo_a, hi_a) in spans.items()}


def _per_outer(ufunc, empty: int, o: np.ndarray, vals: np.ndarray, extent: int) -> np.ndarray:
    """ufunc over `vals` per outer index `o` (`empty` where none): by segments when `o` is
    sorted, as the domain enumerates it (issue 14: `ufunc.at` took seconds on a tile of
    attention), else `ufunc.at`."""
    out = np.full(extent, empty, dtype=np.int64)
    if len(o) and bool(np.all(o[1:] >= o[:-1])):
        starts = np.flatnonzero(np.concatenate(([True], o[1:] != o[:-1])))
        out[o[starts]] = ufunc.reduceat(vals, starts)
    elif len(o):
        ufunc.at(out, o, vals)
    return out


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


MIN_TILES = 8  # enough tiles that DMA of the next overlaps compute of this one


def tile_and_allocate(kernel: Kernel, arch: ArchSpec, max_tile_rows: int | None = None):
    """Greedy tiles over the outer loop (as large as fit double-buffered, and at most
    extent / MIN_TILES rows so loads overlap compute) and SPM bases.

    Raises MappingError naming the capacity when not even one outer index fits.
    """
    spm = arch.spm
    lanes = arch.pe_array.simd_lanes
    capacity = spm.capacity_words
    row = spm.words_per_row
    streamed = classify_buffers(kernel)
    resident_words = sum(_round_up(b.size, row) for b in kernel.buffers if not streamed[b.name])
    src = f" ({arch.source})" if arch.source else ""
    if resident_words > capacity:
        names = ", ".join(f"{b.name}={b.size}" for b in kernel.buffers if not streamed[b.name])
        raise MappingError(
            f"kernel {kernel.name!r} does not fit the SPM{src}: resident buffers need "
            f"{resident_words} words ({names}) but spm.lines x spm.capacity_words_per_line = "
            f"{spm.lines} x {spm.capacity_words_per_line} = {capacity} words"
            + _on_chip_hint(kernel))
    windows = _row_windows(kernel, lanes, streamed)
    extent = kernel.loops[0].extent
    if max_tile_rows is None:
        # nothing streams (every buffer resident or held on chip): one tile, so the DMA may
        # start the next kernel's prefetch at once (`pe_array.system.run_system`)
        max_tile_rows = (max(1, -(-extent // MIN_TILES)) if any(streamed.values())
                         else extent)
    budget = capacity - resident_words
    tiles: list[Tile] = []
    peak = {name: 0 for name in windows}
    lo = 0
    while lo < extent:
        hi = lo
        cur = {name: (np.iinfo(np.int64).max, np.iinfo(np.int64).min) for name in windows}
        while hi < extent and (max_tile_rows is None or hi - lo < max_tile_rows):
            trial = {name: (min(cur[name][0], int(w[0][hi])), max(cur[name][1], int(w[1][hi])))
                     for name, w in windows.items()}
            # the allocation holds each buffer's largest window over all tiles, so a tile may
            # grow only while those peaks (with its trial window) fit, not just its own windows
            need = 2 * sum(_round_up(max(0, b - a, peak[name]), row) + row
                           for name, (a, b) in trial.items())
            if need > budget:
                break
            cur = trial
            hi += 1
        if hi == lo:
            raise MappingError(
                f"kernel {kernel.name!r} does not fit the SPM{src}: one index of loop "
                f"{kernel.loops[0].var!r} needs {need} words double-buffered plus "
                f"{resident_words} resident, more than spm capacity {capacity} words"
                + _on_chip_hint(kernel))
        wins = []
        for name, (a, b) in cur.items():
            if b <= a:  # nothing touched in this tile
                a = b = 0
            wins.append((name, a, b))
            peak[name] = max(peak[name], b - a)
        tiles.append(Tile(lo=lo, hi=hi, windows=tuple(sorted(wins))))
        lo = hi
    # allocation: stagger each buffer's first row over the lines to spread port pressure
    allocs = []
    base = 0
    order = allocation_order(kernel)
    for idx, b in enumerate(order):
        words = _round_up(peak[b.name] + row, row) if streamed[b.name] else _round_up(b.size, row)
        halves = 2 if streamed[b.name] else 1
        bases = []
        for _ in range(halves):
            base = (_stagger(base, idx, len(order), arch) if b.spm_base is None
                    else _fixed_base(kernel, b, base, row))
            bases.append(base)
            base += words
        allocs.append(SPMAllocation(buffer=b.name, base=bases[0], words=words,
                                    streamed=streamed[b.name],
                                    base_alt=bases[1] if halves == 2 else None))
    if base > capacity:
        # staggering padding pushed us over: fall back to dense packing
        allocs, base = _pack(kernel, order, streamed, peak, row)
    if base > capacity:
        raise MappingError(f"kernel {kernel.name!r}: SPM allocation needs {base} words, "
                           f"capacity {capacity}{src}")
    return tuple(tiles), tuple(allocs)


def tiles_at(kernel: Kernel, arch: ArchSpec, bounds) -> tuple[Tile, ...]:
    """Tiles of the outer loop cut at `bounds` (increasing, strictly inside the loop's extent),
    each with the windows `tile_and_allocate` gives a tile of those rows. A tile inside one of
    `tile_and_allocate`'s has windows inside that tile's, so its allocation holds them."""
    extent = kernel.loops[0].extent
    edges = [0, *bounds, extent]
    if any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"tile bounds {list(bounds)} not increasing inside (0, {extent})")
    windows = _row_windows(kernel, arch.pe_array.simd_lanes, classify_buffers(kernel))
    tiles = []
    for lo, hi in zip(edges, edges[1:]):
        wins = []
        for name, (first, last) in windows.items():
            a, b = int(first[lo:hi].min()), int(last[lo:hi].max())
            wins.append((name, *((a, b) if b > a else (0, 0))))  # (0, 0): nothing touched
        tiles.append(Tile(lo=lo, hi=hi, windows=tuple(sorted(wins))))
    return tuple(tiles)


def allocation_order(kernel: Kernel) -> list:
    """The kernel's buffers in SPM allocation order: those held on chip for or from another
    kernel first (at their `spm_base`, else from word 0), so the kernel that leaves one and the
    kernel that reads it hold it at the same words
    (docs/conventions.md#moe-buffers-handed-over-in-the-spm; `legality.check_on_chip`)."""
    return sorted(kernel.buffers, key=lambda b: (not b.held, b.spm_base or 0))


def _fixed_base(kernel: Kernel, b, base: int, row: int) -> int:
    """The SPM word of a held buffer placed at its `spm_base`; MappingError when that is not
    a row's first word or lies below what is already allocated."""
    if b.spm_base % row or b.spm_base < base:
        raise MappingError(f"kernel {kernel.name!r}: buffer {b.name!r} held at spm_base "
                           f"{b.spm_base}, which is not a multiple of the {row}-word SPM row or "
                           f"overlaps the held buffers below it (they end at word {base})")
    return b.spm_base


def _on_chip_hint(kernel: Kernel) -> str:
    """The part of a does-not-fit message that names the buffers held on chip."""
    held = [f"{b.name}={b.size}" for b in kernel.buffers if b.held]
    return (f"; of them held on chip for another kernel (fetch 'on_chip' or 'keep', whole): "
            f"{', '.join(held)} -- hand them over through DRAM instead" if held else "")


def _stagger(base: int, idx: int, nbuf: int, arch: ArchSpec) -> int:
    """Advance `base` to a row whose line is idx * lines / nbuf (interleaved mapping only)."""
    spm = arch.spm
    row = spm.words_per_row
    base = _round_up(base, row)
    if spm.address_mapping != AddressMapping.INTERLEAVED:
        return base
    want = (idx * spm.lines) // max(1, nbuf)
    r = base // row
    r += (want - r) % spm.lines
    return r * row


def _pack(kernel, order, streamed, peak, row):
    allocs, base = [], 0
    for b in order:
        words = _round_up(peak[b.name] + row, row) if streamed[b.name] else _round_up(b.size, row)
        if b.spm_base is not None:
            base = _fixed_base(kernel, b, base, row)
        if streamed[b.name]:
            allocs.append(SPMAllocation(b.name, base, words, True, base + words))
            base += 2 * words
        else:
            allocs.append(SPMAllocation(b.name, base, words, False))
            base += words
    return tuple(allocs), base
