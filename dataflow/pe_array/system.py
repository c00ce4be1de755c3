"""System level: DMA, DRAM and the array at tile granularity, as a SimPy discrete-event model.

Each kernel starts with a reconfiguration; each tile's inputs are loaded by DMA into one half of
its double buffers while the array computes the previous tile; outputs are written back behind
the compute. The DRAM interface moves `bytes_per_cycle` and adds `latency_cycles` to each
transfer (pipelined: latency does not block the next transfer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import simpy

from dataflow.arch.spec import ArchSpec
from dataflow.pe_array.result import TileResult


@dataclass(frozen=True)
class SystemTimeline:
    cycles: int
    stall_cycles_dram: int
    stall_cycles_reconfiguration: int
    kernel_spans: tuple[tuple[int, int], ...]  # (start, end) of each kernel on the array
    tile_spans: tuple[tuple[str, int, int, int], ...]  # (kernel, tile, start, end)


def run_system(kernel_tiles: list[tuple[str, tuple[TileResult, ...]]], arch: ArchSpec) -> SystemTimeline:
    """Schedule the kernels' tiles; the array waits only for data or reconfiguration."""
    env = simpy.Environment()
    dram = simpy.Resource(env, capacity=1)
    bw, lat = arch.dram.bytes_per_cycle, arch.dram.latency_cycles
    spans: list[tuple[int, int]] = []
    tile_spans: list[tuple[str, int, int, int]] = []
    waits = {"dram": 0, "reconf": 0}
    writebacks = []

    def transfer(nbytes: int):
        if nbytes <= 0:
            return
        with dram.request() as req:
            yield req
            yield env.timeout(math.ceil(nbytes / bw))
        yield env.timeout(lat)

    def loader(tiles, loaded, free):
        for i, t in enumerate(tiles):
            yield free.get(1)  # one half of the double buffer
            yield env.process(transfer(t.dram_bytes_read))
            loaded[i].succeed()

    def writeback(nbytes):
        yield env.process(transfer(nbytes))

    def array():
        for name, tiles in kernel_tiles:
            start = env.now
            if arch.reconfiguration_cycles:
                yield env.timeout(arch.reconfiguration_cycles)
                waits["reconf"] += arch.reconfiguration_cycles
            loaded = [env.event() for _ in tiles]
            free = simpy.Container(env, capacity=2, init=2)
            env.process(loader(tiles, loaded, free))
            for i, t in enumerate(tiles):
                before = env.now
                yield loaded[i]
                waits["dram"] += env.now - before
                t0 = env.now
                yield env.timeout(t.compute_cycles)
                tile_spans.append((name, i, t0, env.now))
                yield free.put(1)
                writebacks.append(env.process(writeback(t.dram_bytes_written)))
            spans.append((start, env.now))
        yield simpy.AllOf(env, writebacks)

    done = env.process(array())
    env.run(until=done)
    return SystemTimeline(cycles=int(env.now), stall_cycles_dram=int(waits["dram"]),
                          stall_cycles_reconfiguration=int(waits["reconf"]),
                          kernel_spans=tuple(spans), tile_spans=tuple(tile_spans))
