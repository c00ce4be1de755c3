"""System level: DMA, DRAM and the array at tile granularity, as a SimPy discrete-event model.

Each kernel starts with a reconfiguration; each tile's inputs are loaded by DMA into one half of
its double buffers while the array computes the previous tile; outputs are written back behind
the compute. DMA engines and DRAM channels are SimPy resources (see `run_system`).
"""

from __future__ import annotations

import math

import simpy

from dataflow.arch.spec import ArchSpec
from dataflow.pe_array.result import SystemTimeline, TileResult

#: DRAM pages are interleaved over the channels at this granularity (a common 4 KiB page): a
#: transfer of at least one page per channel streams over all of them at the full bandwidth
DRAM_PAGE_BYTES = 4096


def _transfers(t: TileResult, kind: str) -> list[tuple[str, int]]:
    """(buffer, bytes) DMA transfers of a tile in one direction (one per buffer; a tile without
    a per-buffer list moves its bytes as one transfer)."""
    if t.dram_transfers:
        return [(b, n) for b, k, n in t.dram_transfers if k == kind and n > 0]
    n = t.dram_bytes_read if kind == "read" else t.dram_bytes_written
    return [("tile", n)] if n > 0 else []


def _on_every_channel(env: simpy.Environment, channels: list, cycles: float):
    """Hold every DRAM channel for `cycles` (taken in index order, so two striped transfers
    never deadlock)."""
    held = [c.request() for c in channels]
    for req in held:
        yield req
    yield env.timeout(math.ceil(cycles))
    for c, req in zip(channels, held):
        c.release(req)


def run_system(kernel_tiles: list[tuple[str, tuple[TileResult, ...]]],
               arch: ArchSpec) -> SystemTimeline:
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
    """
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

    def channel(kernel: str, buffer: str) -> simpy.Resource:
        key = (kernel, buffer)
        if key not in channel_of:
            channel_of[key] = sum(1 for k in channel_of if k[0] == kernel) % dram.channels
        return channels[channel_of[key]]

    def transfer(kernel: str, buffer: str, nbytes: int):
        striped = dram.channels > 1 and nbytes >= dram.channels * DRAM_PAGE_BYTES
        with engines.request() as eng:
            yield eng
            yield env.timeout(lat)
            if striped:
                yield from _on_every_channel(env, channels, nbytes / dram.bytes_per_cycle)
                return
            with channel(kernel, buffer).request() as ch:
                yield ch
                yield env.timeout(math.ceil(nbytes / bw))

    def loader(name, tiles, loaded, free):
        for i, t in enumerate(tiles):
            yield free.get(1)  # one half of the double buffer
            reads = _transfers(t, "read")
            if len(reads) == 1:  # no need for a process of its own
                yield from transfer(name, *reads[0])
            elif reads:
                yield simpy.AllOf(env, [env.process(transfer(name, b, n)) for b, n in reads])
            loaded[i].succeed()

    def array():
        for name, tiles in kernel_tiles:
            start = env.now
            if arch.reconfiguration_cycles:
                yield env.timeout(arch.reconfiguration_cycles)
                waits["reconf"] += arch.reconfiguration_cycles
            loaded = [env.event() for _ in tiles]
            free = simpy.Container(env, capacity=2, init=2)
            env.process(loader(name, tiles, loaded, free))
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
