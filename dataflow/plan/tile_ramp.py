"""Ramped tiles: a kernel's first and last tiles cut into smaller ones
(docs/conventions.md#ramped-tiles).

The array waits for its first tile's loads (the prologue) and the run ends when its last
tile's write-backs land (the epilogue); the tiles between overlap their DMA with the
neighbouring tiles' compute. The first tile is cut at 1/2^s, 1/2^(s-1), ..., 1/2 of its rows,
so the array starts after the first piece's loads and each piece's loads, twice the last's,
land while the piece before computes; the last tile is cut the other way round, so only its
last piece's write-back is exposed. A side is ramped only where the DMA keeps up with the
halving beside the compute (`keeps_up`), and each extra tile costs about a pipeline fill and
drain (the schedule length, twice over: `FILL_PER_TILE`), so a halving is made only while the
transfer it hides is longer (`ramp_steps`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.graph import BufferRole
from dataflow.mapper.mapping import KernelMapping
from dataflow.mapper.tiling import tiles_at
from dataflow.pe_array.common import dma_words
from dataflow.plan.retime import kernel_iterations

#: most cuts of a ramped tile
MAX_STEPS = 6
#: growth between consecutive pieces (halvings)
GROWTH = 2
#: cycles one more tile costs, in schedule lengths: its fill and drain, and the copies' uneven
#: chunks and stalls at its edges (CSR SpMM on mlx_4x4: about 450 cycles a tile at a schedule
#: length of 251)
FILL_PER_TILE = 2


def ramp_steps(exposed_cycles: float, tile_rows: int, fill_cycles: float) -> int:
    """Halvings worth making of a tile whose transfer of `exposed_cycles` is exposed: halving s
    hides exposed / 2^s more cycles and costs one more tile (`fill_cycles`); each piece keeps
    at least one row."""
    s = 0
    while (s < MAX_STEPS and tile_rows >> (s + 1) >= 1
           and exposed_cycles / 2 ** (s + 1) > fill_cycles):
        s += 1
    return s


def keeps_up(hidden: float, beside: float, compute: float) -> bool:
    """Whether the DMA keeps up with halved pieces (per row, in DMA or compute cycles): a
    piece's transfer (`hidden`), twice the one before's, lands while the piece before
    computes, the DMA also moving that piece's transfer the other way (`beside`)."""
    return hidden > 0 and GROWTH * hidden + beside <= compute


def _per_row(km: KernelMapping, arch: ArchSpec, role: BufferRole) -> float:
    """DMA cycles per outer row of the streamed buffers of `role`, over all tiles (what a
    smaller tile shrinks; a resident input loads whole before the first tile however it is
    cut)."""
    words = sum(dma_words(km, b, i) for b in km.kernel.buffers
                if b.role == role and km.allocation_map[b.name].streamed
                for i in range(len(km.tiles)))
    return words * arch.word_bytes / arch.dram.bytes_per_cycle / km.kernel.loops[0].extent


def ramp_bounds(km: KernelMapping, arch: ArchSpec,
                per_iteration: Callable[[], float] | None = None, *, head: bool = True,
                tail: bool = True) -> list[int]:
    """The outer-loop positions where the ramped tiles of `km` begin (but the first): its
    own tiles' bounds, with cuts added in its first (`head`) and last (`tail`) tile's worth of
    rows where they pay (`ramp_steps`) and the DMA keeps up (`keeps_up`) with the compute as
    issued (iterations x II / copies, a lower bound) or, failing that, as `per_iteration`
    measures it (cycles per iteration, stalls included; called only then: it runs a tile)."""
    tiles = km.tiles
    bounds = [t.lo for t in tiles[1:]]
    if len(tiles) < 2:
        return bounds
    extent = km.kernel.loops[0].extent
    rows = max(t.hi - t.lo for t in tiles)
    load = _per_row(km, arch, BufferRole.INPUT)
    store = _per_row(km, arch, BufferRole.OUTPUT)
    fill = FILL_PER_TILE * km.schedule_length
    up = ramp_steps(load * rows, rows, fill) if head else 0
    down = ramp_steps(store * rows, rows, fill) if tail else 0
    lanes = arch.pe_array.simd_lanes if km.kernel.vector_var else 1
    per_row = kernel_iterations(km.kernel, lanes) / extent
    compute = per_row * km.ii / km.copies  # cycles per row
    if (up and not keeps_up(load, store, compute)) or (down and not keeps_up(store, load, compute)):
        if per_iteration is not None:
            compute = max(compute, per_row * per_iteration())
    up = up if keeps_up(load, store, compute) else 0
    down = down if keeps_up(store, load, compute) else 0
    cuts = [rows >> j for j in range(up, 0, -1)] + [extent - (rows >> j)
                                                    for j in range(1, down + 1)]
    # the tiles' own bounds stay: each ramped tile lies inside one of them
    return sorted({b for b in cuts + bounds if 0 < b < extent})


def ramp_tiles(km: KernelMapping, arch: ArchSpec,
               per_iteration: Callable[[], float] | None = None, *, head: bool = True,
               tail: bool = True) -> KernelMapping:
    """`km` with ramped first and last tiles (the module docstring, `ramp_bounds`); `km`
    itself when nothing pays. Every ramped tile lies inside one of `km`'s, so the allocation
    holds its windows. A program's later kernels pass `head=False` where the DMA loads their
    first tile during the kernel before (`dram.prefetch_next_kernel`), and all but its last
    `tail=False`: their write-backs drain behind the next kernel's compute."""
    if not isinstance(km, KernelMapping):
        return km
    bounds = ramp_bounds(km, arch, per_iteration, head=head, tail=tail)
    if len(bounds) == len(km.tiles) - 1:
        return km
    tiles = tiles_at(km.kernel, arch, bounds)
    note = (f"ramped tiles: {len(km.tiles)} -> {len(tiles)} (first and last cut smaller, "
            "docs/conventions.md#ramped-tiles)")
    return dataclasses.replace(km, tiles=tiles, notes=(*km.notes, note))


__all__ = ["FILL_PER_TILE", "GROWTH", "MAX_STEPS", "keeps_up", "ramp_bounds", "ramp_steps",
           "ramp_tiles"]
