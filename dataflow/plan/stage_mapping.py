"""Mapping butterfly stage kernels with the schedules of identical bodies reused.

A butterfly's stage kernels differ in their addresses and twiddle tables, not in the ops and
edges of their bodies, so one modulo schedule serves them all: `map_stage_kernel` maps a body
once per architecture and instruction budget and recomputes only the tiles and SPM allocation
of each kernel (checked by `legality.check_kernel_mapping`). Wide bodies get extra copies while
the instruction entries and the mapper-effort budget allow (`_more_copies`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from dataflow.arch.spec import ArchSpec
from dataflow.cachefiles import BoundedCache
from dataflow.dfg.graph import Kernel, vector_nodes
from dataflow.mapper.legality import check_kernel_mapping
from dataflow.mapper.map import map_kernel
from dataflow.mapper.mapping import KernelMapping, MappingError
from dataflow.mapper.tiling import tile_and_allocate

MAPPER_EFFORT = 4096  # largest nodes x PEs we modulo-schedule (minutes beyond, on 2 cores)
RETRY_II_SLACK = 48
MAX_COPIES = 8
# extra copies are mapped while copies x nodes x PEs <= COPIES_EFFORT: 5 copies of a 54-node
# radix-4 body on 64 PEs (17 280) map in a tenth of a second and reach 1 iteration per cycle
# where 4 copies miss the register file at II 4 (FNet hidden 512, default array)
COPIES_EFFORT = 8 * MAPPER_EFFORT
SHAPE_CACHE_ENTRIES = 512  # distinct (arch, body, budget) schedules kept in memory

#: mapped stage bodies kept per process (a bounded LRU: keys hold an ArchSpec and a body)
_SHAPES = BoundedCache(SHAPE_CACHE_ENTRIES)


def _shape_key(kernel: Kernel, arch: ArchSpec):
    vec = vector_nodes(kernel)
    return (arch, tuple((n.op, n.inputs, n.id in vec) for n in kernel.nodes))


def map_stage_kernel(kernel: Kernel, arch: ArchSpec, tile_rows: int,
                     entry_budget: int | None = None) -> KernelMapping:
    """`map_kernel` with the schedule of an identical body reused (tiles recomputed, checked).
    Extra copies are added only while every PE holds at most `entry_budget` instructions (the
    share of the instruction entries a co-resident kernel may take)."""
    budget = arch.pe_array.instruction_entries if entry_budget is None else entry_budget
    key = (_shape_key(kernel, arch), budget)
    hit = _SHAPES.get(key)
    if hit is None:
        try:
            km = map_kernel(kernel, arch, max_tile_rows=tile_rows)
        except MappingError:
            # the list scheduler sometimes needs II well above MII for these wide bodies
            km = map_kernel(kernel, arch, max_tile_rows=tile_rows, max_ii_slack=RETRY_II_SLACK)
        km = _more_copies(kernel, arch, tile_rows, km, budget)
        _SHAPES.put(key, km)
        return km
    tiles, allocs = tile_and_allocate(kernel, arch, tile_rows)
    km = dataclasses.replace(hit, kernel=kernel, tiles=tiles, allocations=allocs,
                             notes=hit.notes + (f"schedule reused from {hit.kernel.name!r}",))
    check_kernel_mapping(km, arch)
    return km


def _more_copies(kernel: Kernel, arch: ArchSpec, tile_rows: int, km: KernelMapping,
                 budget: int) -> KernelMapping:
    """`map_kernel` tries at most PEs // nodes copies; a wide body whose one copy cannot reach
    II = ResMII often runs several copies at the same II. Try more copies (within the
    instruction entries and the mapper-effort budget) and keep the best copies / II."""
    nodes, pes = len(kernel.nodes), arch.pe_array.num_pes
    best = km
    u = km.copies + 1
    while (u * nodes <= pes * arch.pe_array.instruction_entries and u * nodes * pes <= COPIES_EFFORT
           and u <= MAX_COPIES):
        # the throughput u / ResMII(u) is an upper bound; skip what cannot beat the best
        if u / max(1, -(-u * nodes // pes)) > best.copies / best.ii:
            try:
                cand = map_kernel(kernel, arch, copies=u, max_tile_rows=tile_rows)
                if (cand.copies / cand.ii > best.copies / best.ii
                        and max(instructions_per_pe(cand).values()) <= budget):
                    best = cand
            except MappingError:
                pass
        u += 1
    if best is not km:
        best = dataclasses.replace(best, notes=best.notes + (
            f"{best.copies} copies at II {best.ii} "
            f"(map_kernel's own choice: {km.copies} at II {km.ii})",))
    return best

def instructions_per_pe(km: KernelMapping) -> Counter:
    """Placed instructions on each PE."""
    return Counter(p.pe for p in km.placements)
