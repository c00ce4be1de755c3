"""Mapping butterfly stage kernels with the schedules of identical bodies reused.

A butterfly's stage kernels differ in their addresses and twiddle tables, not in the ops and
edges of their bodies, so one modulo schedule serves them all: `map_stage_kernel` maps a body
once per architecture and instruction budget and recomputes only the tiles and SPM allocation
of each kernel (checked by `legality.check_kernel_mapping`). Wide bodies get extra copies while
the instruction entries and the mapper-effort budget allow (`_more_copies`).

The schedule of a body is kept in memory (`_SHAPES`) and on disk beside the plan cache
(`<cache dir>/stages/<hash>.mapping`, framed by `cachefiles.frame_entry`: code fingerprint and
checksum), so a later process maps no body twice (docs/planning_speed.md). A stored schedule
is bound to the kernel and checked by `legality.check_kernel_mapping` like an in-memory one; a
file that is damaged, stale, for another body or illegal is deleted and the body re-mapped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
from collections import Counter

from dataflow.arch.load import arch_to_dict
from dataflow.arch.spec import ArchSpec
from dataflow.cachefiles import (
    LOAD_ERRORS,
    BoundedCache,
    read_entry,
    resolve_cache_dir,
    write_entry,
)
from dataflow.dfg.graph import Kernel
from dataflow.mapper.bounds import rec_mii, res_mii
from dataflow.mapper.legality import check_kernel_mapping
from dataflow.mapper.map import body_key, map_kernel
from dataflow.mapper.mapping import KernelMapping, MappingError
from dataflow.mapper.schedule import HARD_EFFORT
from dataflow.mapper.tiling import tile_and_allocate

MAPPER_EFFORT = 4096  # largest nodes x PEs we modulo-schedule (minutes beyond, on 2 cores)
RETRY_II_SLACK = 48
# IIs below a missed one that `_harder_links` tries (from the MII up): each failed II costs
# HARD_EFFORT's attempts (~1-2 s on a 142-node body)
HARDER_IIS = 2
MORE_COPIES_II_SLACK = 8  # map_kernel's default: extra copies are scheduled up to MII + 8
MAX_COPIES = 8
# extra copies are mapped while copies x nodes x PEs <= COPIES_EFFORT: 5 copies of a 54-node
# radix-4 body on 64 PEs (17 280) map in a tenth of a second and reach 1 iteration per cycle
# where 4 copies miss the register file at II 4 (FNet hidden 512, default array)
COPIES_EFFORT = 8 * MAPPER_EFFORT
SHAPE_CACHE_ENTRIES = 512  # distinct (arch, body, budget) schedules kept in memory

#: mapped stage bodies kept per process (a bounded LRU: keys hold an ArchSpec and a body)
_SHAPES = BoundedCache(SHAPE_CACHE_ENTRIES)


def shape_key(kernel: Kernel, arch: ArchSpec):
    """What a body's schedule depends on: the arch and every node's op, inputs and vector-ness
    (not its addresses)."""
    return (arch, body_key(kernel))


def map_stage_kernel(kernel: Kernel, arch: ArchSpec, tile_rows: int,
                     entry_budget: int | None = None) -> KernelMapping:
    """`map_kernel` with the schedule of an identical body reused (tiles recomputed, checked).
    Extra copies are added only while every PE holds at most `entry_budget` instructions (the
    share of the instruction entries a co-resident kernel may take)."""
    budget = arch.pe_array.instruction_entries if entry_budget is None else entry_budget
    key = (shape_key(kernel, arch), budget)
    hit = _SHAPES.get(key)
    if hit is None:
        hit = _stage_disk_get(key, kernel, arch, tile_rows)
        if hit is not None:
            _SHAPES.put(key, hit)
            return hit
        try:
            km = map_kernel(kernel, arch, max_tile_rows=tile_rows)
        except MappingError:
            # the list scheduler sometimes needs II well above MII for these wide bodies
            km = map_kernel(kernel, arch, max_tile_rows=tile_rows, max_ii_slack=RETRY_II_SLACK)
        km = _late_sources(kernel, arch, tile_rows, km)
        km = _more_copies(kernel, arch, tile_rows, km, budget)
        km = _harder_links(kernel, arch, tile_rows, km)
        _SHAPES.put(key, km)
        _stage_disk_put(key, km)
        return km
    tiles, allocs = tile_and_allocate(kernel, arch, tile_rows)
    km = dataclasses.replace(hit, kernel=kernel, tiles=tiles, allocations=allocs,
                             notes=hit.notes + (f"schedule reused from {hit.kernel.name!r}",))
    check_kernel_mapping(km, arch)
    return km


STAGE_KIND, STAGE_VERSION = "stage-mapping", 1


def _stage_file(key):
    """`<cache dir>/stages/<hash of the body, the arch and the budget>.mapping`."""
    (arch, body), budget = key
    h = hashlib.sha256(json.dumps(arch_to_dict(arch), sort_keys=True, default=str).encode())
    h.update(repr((body, budget)).encode())
    return resolve_cache_dir() / "stages" / f"{h.hexdigest()[:32]}.mapping"


def _stage_disk_get(key, kernel: Kernel, arch: ArchSpec, tile_rows: int):
    """The stored schedule of `key`'s body bound to `kernel` (tiles and SPM allocation
    recomputed, legality checked), or None. A file that fails its frame, holds another body
    or an illegal mapping is deleted."""
    def load(payload: bytes) -> KernelMapping:
        got = pickle.loads(payload)
        if not (isinstance(got, dict) and got.get("body") == repr(key[0][1])
                and got.get("budget") == key[1] and isinstance(got.get("km"), KernelMapping)):
            raise ValueError("a schedule of another body")
        tiles, allocs = tile_and_allocate(kernel, arch, tile_rows)
        km = dataclasses.replace(got["km"], kernel=kernel, tiles=tiles, allocations=allocs)
        check_kernel_mapping(km, arch)
        return km

    return read_entry(_stage_file(key), STAGE_KIND, STAGE_VERSION, load,
                      errors=(*LOAD_ERRORS, MappingError))


def _stage_disk_put(key, km: KernelMapping) -> None:
    record = {"body": repr(key[0][1]), "budget": key[1],
              "km": dataclasses.replace(km, kernel=None, tiles=(), allocations=())}
    write_entry(_stage_file(key), STAGE_KIND, STAGE_VERSION,
                pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))


def _late_sources(kernel: Kernel, arch: ArchSpec, tile_rows: int,
                  km: KernelMapping) -> KernelMapping:
    """`km`, or the schedule with each source load issued as late as its consumers allow
    (`map_kernel(late_sources=True)`) when that one runs more iterations per cycle (or as many
    with a shorter schedule). Tried only when `km` misses its MII: on a wide radix-8 body the
    list scheduler's early loads hold registers and links (FNet seq 256 on mlx_4x4, the
    sequence pass's middle kernel: II 5 -> 4 at MII 3; docs/conventions.md#fnet-pass-boundaries)."""
    if km.ii <= km.mii:
        return km
    try:
        cand = map_kernel(kernel, arch, copies=km.copies, max_tile_rows=tile_rows,
                          max_ii_slack=km.ii - km.mii, late_sources=True)
    except MappingError:
        return km
    if (cand.copies * km.ii, -cand.schedule_length) > (km.copies * cand.ii, -km.schedule_length):
        return dataclasses.replace(cand, notes=cand.notes + (
            f"sources issued late: II {km.ii} -> {cand.ii}",))
    return km


def _harder_links(kernel: Kernel, arch: ArchSpec, tile_rows: int,
                  km: KernelMapping) -> KernelMapping:
    """`km`, or a schedule at a lower II found with `schedule.HARD_EFFORT` (more placement
    attempts on the congestion history, longer PathFinder negotiation), plain then with late
    sources, with as many copies as `km` (after `_more_copies`; the orchestrator checks the
    co-resident kernels' instruction entries, as for `_late_sources`). A stage body is mapped
    once and runs every tile of every stage kernel that shares it, so a second or two of
    planning is cheap beside the cycles: FNet seq 1024 on mlx_4x4, the sequence pass's two
    radix-8 kernels (142 nodes, MII 3, links over capacity at II 3 with the default effort)
    go from II 4 to 3, pass 2 from 2,161 to 1,982 cycles a tile
    (docs/conventions.md#fnet-pass-boundaries). Only within the mapper effort (copies x nodes
    x PEs <= MAPPER_EFFORT): the default array's 4-copy radix-4 bodies (II 5 for MII 4;
    4 x 54 x 64) are beyond it, and trying their one-copy schedules (before `_more_copies`)
    doubled FNet's cold planning there (8.8 -> 17.7 s) for nothing."""
    if km.ii <= km.mii or km.copies * len(kernel.nodes) * arch.pe_array.num_pes > MAPPER_EFFORT:
        return km
    slack = min(km.ii - km.mii, HARDER_IIS) - 1
    for late in (False, True):
        try:
            cand = map_kernel(kernel, arch, copies=km.copies, max_tile_rows=tile_rows,
                              max_ii_slack=slack, late_sources=late, effort=HARD_EFFORT)
        except MappingError:
            continue
        if cand.ii < km.ii:
            return dataclasses.replace(cand, notes=cand.notes + (
                f"links negotiated harder: II {km.ii} -> {cand.ii}",))
    return km


def _more_copies(kernel: Kernel, arch: ArchSpec, tile_rows: int, km: KernelMapping,
                 budget: int) -> KernelMapping:
    """`map_kernel` tries at most PEs // nodes copies; a wide body whose one copy cannot reach
    II = ResMII often runs several copies at the same II. Try more copies (within the
    instruction entries and the mapper-effort budget) and keep the best copies / II."""
    nodes, pes = len(kernel.nodes), arch.pe_array.num_pes
    rec = rec_mii(kernel, arch)
    best = km
    u = km.copies + 1
    while (u * nodes <= pes * arch.pe_array.instruction_entries and u * nodes * pes <= COPIES_EFFORT
           and u <= MAX_COPIES):
        # the throughput u / ResMII(u) is an upper bound; skip what cannot beat the best
        # and an II at which u copies do not beat it is not worth scheduling: try only
        # II <= ii_max (u / II > best.copies / best.ii), the same first legal II or none
        ii_max = (u * best.ii - 1) // best.copies
        slack = min(MORE_COPIES_II_SLACK, ii_max - max(res_mii(kernel, arch, u), rec))
        if u / max(1, -(-u * nodes // pes)) > best.copies / best.ii and slack >= 0:
            try:
                cand = map_kernel(kernel, arch, copies=u, max_tile_rows=tile_rows,
                                  max_ii_slack=slack)
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
