"""System level: DMA, DRAM and the array at tile granularity, as a SimPy discrete-event model.

Each kernel starts with a reconfiguration; each tile's inputs are loaded by DMA into one half of
its double buffers (or one of more slots, `dram.tile_buffers`: `tile_buffer_counts`) while the
array computes the previous tile; outputs are written back behind the compute. DMA engines and
DRAM channels are SimPy resources (see `run_system`). With `dram.prefetch_next_kernel` the DMA
loads the next kernel's first-tile program inputs while the current kernel still runs, where
the SPM has room (`prefetch_sets`; docs/conventions.md#system-level).
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Sequence

import simpy

from dataflow.arch.spec import ArchSpec
from dataflow.pe_array.result import SystemTimeline, TileResult

#: Environment switch of the timeline memo (`run_system`): on unless it is 0 (or false, no, off)
MEMO_ENV = "DATAFLOW_SYSTEM_MEMO"
#: timelines computed and timelines the memo returned, over the process (tests read it)
MEMO_STATS = {"runs": 0, "hits": 0}
#: timelines held, most recently used kept
MEMO_KEEP = 64
_TIMELINES: OrderedDict[tuple, SystemTimeline] = OrderedDict()

#: DRAM pages are interleaved over the channels at this granularity (a common 4 KiB page): a
#: transfer of at least one page per channel streams over all of them at the full bandwidth
DRAM_PAGE_BYTES = 4096


def _transfers(t: TileResult, kind: str, skip=frozenset(), only=None) -> list[tuple[str, int]]:
    """(buffer, bytes) DMA transfers of a tile in one direction (one per buffer; a tile without
    a per-buffer list moves its bytes as one transfer), less the buffers in `skip`, and only
    those in `only` when given."""
    if t.dram_transfers:
        out = [(b, n) for b, k, n in t.dram_transfers if k == kind and n > 0]
    else:
        n = t.dram_bytes_read if kind == "read" else t.dram_bytes_written
        out = [("tile", n)] if n > 0 else []
    return [(b, n) for b, n in out if b not in skip and (only is None or b in only)]


def _channel_index(channel_of: dict, kernel: str, buffer: str, channels: int) -> int:
    """A kernel's buffers spread over the channels in the order they first move."""
    key = (kernel, buffer)
    if key not in channel_of:
        channel_of[key] = sum(1 for k in channel_of if k[0] == kernel) % channels
    return channel_of[key]


def _claim_channels(channel_of: dict, kernel: str, tile: TileResult, channels: int) -> None:
    """Give the first tile's unstriped reads their channels in buffer order, as they get them
    when issued together after the reconfiguration (a prefetch issues only some of them)."""
    for b, n in _transfers(tile, "read"):
        if channels == 1 or n < channels * DRAM_PAGE_BYTES:
            _channel_index(channel_of, kernel, b, channels)


def _one(transfer, name: str, reads: list):
    """The single transfer of `reads`, if any (`run_system.load`)."""
    for b, n in reads:
        yield from transfer(name, b, n)


def _next_early(kernel_tiles, early_of, k: int):
    """(name, first tile, buffers) of kernel k + 1's prefetch, or None."""
    if k + 1 < len(kernel_tiles) and early_of[k + 1] and kernel_tiles[k + 1][1]:
        name, tiles = kernel_tiles[k + 1]
        return name, tiles[0], early_of[k + 1]
    return None


def _on_every_channel(env: simpy.Environment, channels: list, cycles: float):
    """Hold every DRAM channel for `cycles` (taken in index order, so two striped transfers
    never deadlock)."""
    held = [c.request() for c in channels]
    for req in held:
        yield req
    yield env.timeout(math.ceil(cycles))
    for c, req in zip(channels, held):
        c.release(req)


def _tile_load(load, i, tile, loaded, fetched, ahead=None):
    """Tile i's loads (`load(i, tile)`), then, for the first tile, the prefetch `fetched`;
    a token back to `ahead`, then `loaded[i]` fires."""
    yield from load(i, tile)
    if i == 0 and fetched is not None:
        yield fetched
    if ahead is not None:
        yield ahead.put(1)
    loaded[i].succeed()


def _loader(env: simpy.Environment, load, tiles, loaded, free: simpy.Container, fetched):
    """A kernel's tile loads, each once a slot of `free` is free: with two slots (double
    buffering) one tile's after another's have landed; with n > 2 up to n - 1 tiles' at once
    (`run_system`'s `buffers`). Done once every load has landed."""
    slots = free.capacity
    ahead = simpy.Container(env, capacity=slots - 1, init=slots - 1) if slots > 2 else None
    for i, t in enumerate(tiles):
        yield free.get(1)  # a free slot (one half of the double buffer)
        if ahead is None:  # double buffering: this tile's loads, then the next's
            yield from _tile_load(load, i, t, loaded, fetched)
            continue
        yield ahead.get(1)  # at most slots - 1 tiles' loads in flight
        env.process(_tile_load(load, i, t, loaded, fetched, ahead))
    if ahead is not None:  # every load landed (the next kernel's prefetch waits for that)
        yield ahead.get(slots - 1)


def prefetch_sets(kernels: Sequence[tuple[Sequence[str], Sequence[str], dict[str, int], int]],
                  capacity_words: int) -> list[frozenset[str]]:
    """Per kernel, the inputs its first tile may load while the previous kernel runs.

    `kernels` in program order: (input names, output names, words of each input's first-tile
    SPM slot, SPM words the kernel occupies). An input qualifies when no earlier kernel writes
    it (a program input or weight: its DRAM contents are final before the run) and its slot fits
    in the SPM beside everything the previous kernel occupies, taken greedily in buffer order
    (the next kernel's configuration places those buffers in that room). The first kernel has
    nothing before it to hide behind."""
    out: list[frozenset[str]] = [frozenset()]
    written: set[str] = set()
    for (_, outs, _, occupied), (ins, _, slot, _) in zip(kernels, kernels[1:]):
        written.update(outs)
        room, early = capacity_words - occupied, []
        for b in ins:
            if b not in written and 0 < slot.get(b, 0) <= room:
                early.append(b)
                room -= slot[b]
        out.append(frozenset(early))
    return out


def tile_buffer_counts(kernels: Sequence[tuple[int, int]], arch: ArchSpec) -> list[int] | None:
    """Per kernel, the SPM slots of its streamed inputs (`run_system`'s `buffers`): up to
    `dram.tile_buffers`, the two of double buffering plus as many more as fit in the SPM beside
    what the kernel already holds. `kernels`: (words of one slot, i.e. one tile's streamed
    inputs, SPM words taken: the kernel's allocations, double buffers counted, and what the
    next kernel prefetches into the room beside it). None when `dram.tile_buffers` is 2: every
    kernel double-buffered, the schedule without this parameter cycle for cycle
    (docs/conventions.md#deeper-tile-buffers)."""
    most = arch.dram.tile_buffers
    if most <= 2:
        return None
    room = arch.spm.capacity_words
    return [2 + max(0, min(most - 2, (room - taken) // slot)) if slot > 0 else 2
            for slot, taken in kernels]


def run_system(kernel_tiles: list[tuple[str, tuple[TileResult, ...]]],
               arch: ArchSpec, prefetch: Sequence[frozenset[str]] | None = None,
               buffers: Sequence[int] | None = None) -> SystemTimeline:
    """Schedule the kernels' tiles; the array waits only for data or reconfiguration.

    Memory system: `dram.channels` channels share the aggregate `bytes_per_cycle` equally.
    Pages (`DRAM_PAGE_BYTES`) are interleaved over the channels, so a transfer of at least one
    page per channel streams over every channel at once at the full bytes_per_cycle (holding
    them all meanwhile); a smaller one lives on one channel (a kernel's buffers are spread
    over the channels in declaration order) and streams at bytes_per_cycle / channels.
    `dram.dma_engines` engines each carry one transfer at a time and stay busy for its whole
    life: `latency_cycles` until the first byte, then the streaming. Loads of one tile are
    issued together (one transfer per buffer) and the tile may start when all have landed;
    write-backs go behind the compute. With one engine the latency of every transfer is
    exposed; with more, transfers overlap up to the channel bandwidth.

    `prefetch[k]` (`prefetch_sets`): buffers of kernel k's first tile loaded early, issued as soon
    as kernel k-1's last load has landed (so they queue behind its loads, beside its
    write-backs and compute, and through the reconfiguration); kernel k's first tile then also
    waits for them. `prefetch[0]`, the first kernel's, starts with the run, during its
    reconfiguration. None or empty sets: every load is issued after the kernel's
    reconfiguration, as without prefetch.

    `buffers[k]` (`tile_buffer_counts`): kernel k's SPM slots per streamed input, n >= 2. A
    tile's loads are issued once a slot is free (the array frees one when it has computed a
    tile), with at most n - 1 tiles' loads in flight at once; n = 2 (None: every kernel) is
    double buffering, each tile's loads issued once the previous tile's have landed.

    The timeline is a function of exactly these inputs: per kernel its name and per tile its
    compute cycles and DMA transfers, the arch's DRAM and reconfiguration cycles, the
    prefetch sets and the slots. A run whose inputs equal an earlier one's (a warm rerun of a
    planned workload) gets that run's timeline (the `MEMO_KEEP` most recent are held;
    DATAFLOW_SYSTEM_MEMO=0 simulates every time).
    """
    MEMO_STATS["runs"] += 1
    if os.environ.get(MEMO_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return _simulate(kernel_tiles, arch, prefetch, buffers)
    key = (tuple((name, tuple((t.compute_cycles, t.dram_bytes_read, t.dram_bytes_written,
                               t.dram_transfers) for t in tiles))
                 for name, tiles in kernel_tiles),
           arch.dram, arch.reconfiguration_cycles, tuple(prefetch) if prefetch else None,
           tuple(buffers) if buffers else None)
    timeline = _TIMELINES.get(key)
    if timeline is not None:
        MEMO_STATS["hits"] += 1
        _TIMELINES.move_to_end(key)
        return timeline
    timeline = _TIMELINES[key] = _simulate(kernel_tiles, arch, prefetch, buffers)
    while len(_TIMELINES) > MEMO_KEEP:
        _TIMELINES.popitem(last=False)
    return timeline


def _simulate(kernel_tiles: list[tuple[str, tuple[TileResult, ...]]], arch: ArchSpec,
              prefetch: Sequence[frozenset[str]] | None,
              buffers: Sequence[int] | None = None) -> SystemTimeline:
    """`run_system`'s discrete-event simulation."""
    env = simpy.Environment()
    dram = arch.dram
    channels = [simpy.Resource(env, capacity=1) for _ in range(dram.channels)]
    engines = simpy.Resource(env, capacity=dram.dma_engines)
    bw = dram.bytes_per_cycle / dram.channels
    lat = dram.latency_cycles
    spans: list[tuple[int, int]] = []
    tile_spans: list[tuple[str, int, int, int]] = []
    waits = {"dram": 0, "reconf": 0}
    writebacks = []
    channel_of: dict[tuple[str, str], int] = {}

    def transfer(kernel: str, buffer: str, nbytes: int):
        striped = dram.channels > 1 and nbytes >= dram.channels * DRAM_PAGE_BYTES
        with engines.request() as eng:
            yield eng
            yield env.timeout(lat)
            if striped:
                yield from _on_every_channel(env, channels, nbytes / dram.bytes_per_cycle)
                return
            ch_index = _channel_index(channel_of, kernel, buffer, dram.channels)
            with channels[ch_index].request() as ch:
                yield ch
                yield env.timeout(math.ceil(nbytes / bw))

    def load(name, reads):
        if len(reads) > 1:
            yield simpy.AllOf(env, [env.process(transfer(name, b, n)) for b, n in reads])
        else:  # one transfer (or none) needs no process of its own
            yield from _one(transfer, name, reads)

    def loader(name, tiles, loaded, free, early=frozenset(), fetched=None):
        yield from _loader(env, lambda i, t: load(name, _transfers(
            t, "read", skip=early if i == 0 else frozenset())), tiles, loaded, free, fetched)

    def prefetcher(after, name, tile, early):
        yield after  # the previous kernel's loads have landed
        _claim_channels(channel_of, name, tile, dram.channels)
        yield from load(name, _transfers(tile, "read", only=early))

    early_of = list(prefetch or [frozenset()] * len(kernel_tiles))

    def array():
        # this kernel's prefetch, started during the last; nothing runs before the first
        # kernel, so its early loads start with the run, during its reconfiguration
        first = _next_early(kernel_tiles, early_of, -1)
        early, fetched = (first[2], env.process(prefetcher(env.timeout(0), *first))) if first \
            else (frozenset(), None)
        for k, (name, tiles) in enumerate(kernel_tiles):
            start = env.now
            if arch.reconfiguration_cycles:
                yield env.timeout(arch.reconfiguration_cycles)
                waits["reconf"] += arch.reconfiguration_cycles
            loaded = [env.event() for _ in tiles]
            slots = buffers[k] if buffers else 2
            free = simpy.Container(env, capacity=slots, init=slots)
            ld = env.process(loader(name, tiles, loaded, free, early, fetched))
            nxt = _next_early(kernel_tiles, early_of, k)
            early, fetched = (nxt[2], env.process(prefetcher(ld, *nxt))) if nxt else (
                frozenset(), None)
            for i, t in enumerate(tiles):
                before = env.now
                yield loaded[i]
                waits["dram"] += env.now - before
                t0 = env.now
                yield env.timeout(t.compute_cycles)
                tile_spans.append((name, i, t0, env.now))
                yield free.put(1)
                for b, n in _transfers(t, "write"):
                    writebacks.append(env.process(transfer(name, b, n)))
            spans.append((start, env.now))
        if writebacks:
            yield simpy.AllOf(env, writebacks)

    done = env.process(array())
    env.run(until=done)
    return SystemTimeline(cycles=int(env.now), stall_cycles_dram=int(waits["dram"]),
                          stall_cycles_reconfiguration=int(waits["reconf"]),
                          kernel_spans=tuple(spans), tile_spans=tuple(tile_spans))
