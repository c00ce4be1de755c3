"""Store timing of butterfly stage kernels against the SPM lines
(docs/conventions.md#butterfly-stage-lines).

The modulo scheduler places a stage kernel's ops without knowing SPM lines. A stage stores
every point it computes (8 rows an iteration for a radix-4 complex body), and with one write
port per line the stores of the copies that issue in one cycle collide on lines: on the
default array they stalled the lock-step array for 40-60 % of a stage's unstalled cycles
(FNet seq 256). Stores have no users, so their issue times are free up to the registers that
hold their operands and the issue slots of their PEs: this pass chooses them, after mapping,
from three families of variants, each a legal schedule of the same body:

* `near_copies`: every op of copy c issued d_c < copies whole IIs later (d_c chosen copy by
  copy on the line-aware reservation table, `line_schedule.LineTable`, for the fewest stalls
  plus the length the delay adds): a copy runs d_c iterations behind, d_c rows away, so
  copies that stored on one line in one cycle spread; then its stores staggered too;
* `stagger_stores`: each store alone delayed by the fewest cycles that put it on a line
  whose write port is free in that cycle, over the first tile's waves, greedily (stores in
  issue order), onto a free issue slot of its PE;
* `fewer_copies`: the body mapped with fewer copies (`map_kernel(copies=u)`), when u copies
  at their II lose no throughput, or lose less than their conflicts cost; then staggered too.

Where the plain schedule stalls for less than `MIN_STALL_SHARE` of its cycles nothing is
searched. Each variant is scored on the engine's count (`layout_cost.kernel_stalls`, equal
to the fast engine's `stall_cycles_spm_conflict`) over the first two tiles (the halves of the
double buffers): tile cycles (W - 1) II + L plus the stalls; the plain schedule wins ties.
The choice is kept in memory and on disk (`<cache dir>/stage_lines/<hash>.pkl`, framed by
`cachefiles.write_entry`: code fingerprint and checksum; a damaged entry is deleted and the
choice re-made), and a stored schedule is checked by `legality.check_kernel_mapping` again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
from collections import Counter
from enum import Enum

import numpy as np

from dataflow.arch.load import arch_to_dict
from dataflow.arch.spec import ArchSpec
from dataflow.cachefiles import (
    LOAD_ERRORS,
    BoundedCache,
    read_entry,
    resolve_cache_dir,
    write_entry,
)
from dataflow.dfg.domain import enumerate_domain
from dataflow.dfg.ops import Op
from dataflow.mapper.legality import check_kernel_mapping
from dataflow.mapper.map import map_kernel
from dataflow.mapper.mapping import KernelMapping, MappingError
from dataflow.plan.layout_cost import kernel_stalls, timing_only
from dataflow.plan.line_schedule import LineTable, static_nodes
from dataflow.plan.retime import retime, shifted


class StoreTiming(str, Enum):
    """Which variant a stage kernel runs (the module docstring)."""

    PLAIN = "plain"
    NEAR_COPIES = "near_copies"
    STAGGER_STORES = "stagger_stores"
    FEWER_COPIES = "fewer_copies"

    def __str__(self) -> str:
        return self.value


#: tiles a variant is scored on: the two halves of the double buffers
SCORED_TILES = (0, 1)
#: fewer copies are tried down to this share of the mapped copies
FEWEST_COPIES_SHARE = 0.5
#: greedy passes of `stagger_stores` over the stores (the first places them, later ones move
#: each store again against all the others)
STAGGER_SWEEPS = 3
#: the search runs only where the plain schedule's stalls are at least this share of its
#: cycles: below it the variants (and the remapping of fewer copies) cost more planning time
#: than they can save (FNet on mlx_4x4: 3-8 %, store queues absorb the store collisions, no
#: variant won; on the default array 35-45 %)
MIN_STALL_SHARE = 0.1
STAGE_LINES_NOTE = "store timing against the SPM lines: "
CACHE_ENTRIES = 256
_CHOICES = BoundedCache(CACHE_ENTRIES)


def stage_cycles(km: KernelMapping, arch: ArchSpec, tiles=SCORED_TILES) -> int:
    """Cycles of `tiles` of `km` on the engine: (W - 1) II + L per tile plus the SPM
    port-conflict stalls (`layout_cost.kernel_stalls`)."""
    tiles = [t for t in tiles if t < len(km.tiles)]
    stalls = kernel_stalls(km, arch, tiles)
    total = stalls or 0
    for t in tiles:
        n = _iterations(km, arch, t)
        if n:
            total += (-(-n // km.copies) - 1) * km.ii + km.schedule_length
    return total


def _iterations(km: KernelMapping, arch: ArchSpec, t: int) -> int:
    """Iterations (vector iterations for a vector body) of tile `t`."""
    kernel = km.kernel
    lanes = arch.pe_array.simd_lanes if kernel.vector_var else 1
    tile = km.tiles[t]
    dom = enumerate_domain(kernel, lanes, (tile.lo, tile.hi))
    return len(dom[kernel.loops[0].var])


def near_copies(km: KernelMapping, arch: ArchSpec) -> KernelMapping:
    """Every op of copy c delayed d_c whole IIs, d_c < copies (near the other copies: a copy
    runs d_c iterations, d_c rows, behind), chosen copy by copy on the line-aware reservation
    table (`line_schedule.LineTable`) for the fewest stall cycles plus the schedule length
    the delays add; `km` when no copy moves or the result is not legal."""
    if km.copies < 2 or not km.tiles:
        return km
    table = LineTable(km, arch)
    if not table.sample:
        return km
    delays = [0] * km.copies
    for c in range(1, km.copies):
        best = None
        for d in range(km.copies):
            delays[c] = d
            key = (table.score(delays, c + 1)[0] + max(delays[:c + 1]) * km.ii, d)
            if best is None or key < best:
                best = key
        delays[c] = best[1]
    if not any(delays):
        return km
    return retime(km, arch, {(c, n.id): d * km.ii for c, d in enumerate(delays)
                             for n in km.kernel.nodes},
                  STAGE_LINES_NOTE + str(StoreTiming.NEAR_COPIES))


def stagger_stores(km: KernelMapping, arch: ArchSpec, max_delay: int | None = None
                   ) -> KernelMapping:
    """Each store delayed by the cycles (0 .. `max_delay`, default 2 II + lines) that add the
    fewest stall cycles over the first tile's waves, and then the fewest cycles of schedule
    length, given the stores placed before it (in issue order) and every load; only onto a
    free issue slot of its PE. `km` when nothing moves or the result is not legal (registers
    that must hold an operand longer)."""
    if km.copies < 1 or not km.tiles:
        return km
    spm, ii = arch.spm, km.ii
    table = LineTable(km, arch)
    if not table.sample:
        return km
    lines = spm.lines
    nodes = static_nodes(km)
    if max_delay is None:
        max_delay = 2 * ii + lines
    stores = [(c, node.id, w, t, line) for c in range(km.copies)
              for node, (w, t, line, _row, write) in zip(nodes, table.per_copy[c]) if write]
    if not stores:
        return km
    horizon = (table.sample + 1) * ii + km.schedule_length + max_delay + 1
    reads = np.zeros((horizon, lines), dtype=np.int64)
    rd, _ = table.counts([0] * km.copies, km.copies)
    reads[:rd.shape[0]] = rd
    need = -(-reads // spm.read_ports_per_line)
    writes = np.zeros((horizon, lines), dtype=np.int64)
    cur = np.maximum(need.max(axis=1), 1)  # port-cycles each cycle needs so far
    wp = spm.write_ports_per_line
    room = _IssueRoom(km, arch)
    place = {(p.copy, p.node): p for p in km.placements}
    length = max(p.time + p.latency for p in km.placements if
                 km.kernel.nodes[p.node].op is not Op.STORE)
    delay = {}

    def cost(c, nid, w, t, line, d):
        """(stall cycles added, cycles of schedule length added) by store (c, nid) at +d."""
        cyc = w * ii + t + d
        new = np.maximum(need[cyc, line], -(-(writes[cyc, line] + 1) // wp))
        return (int(np.maximum(new - cur[cyc], 0).sum())
                + max(0, t + d + place[(c, nid)].latency - length))

    def put(c, nid, w, t, line, d, sign):
        cyc = w * ii + t + d
        np.add.at(writes, (cyc, line), sign)
        room.add(place[(c, nid)].pe, t + d, sign)
        if sign < 0:  # recount the cycles this store leaves
            cur[cyc] = np.maximum(need[cyc].max(axis=1),
                                  -(-writes[cyc].max(axis=1) // wp)).clip(min=1)
        else:
            np.maximum.at(cur, cyc, -(-writes[cyc, line] // wp))

    order = sorted(stores, key=lambda s: (s[3], s[0], s[1]))
    for c, nid, _w, t, _line in order:  # free the stores' slots: placed one by one below
        room.add(place[(c, nid)].pe, t, -1)
    for sweep in range(STAGGER_SWEEPS):
        for s in order:
            c, nid, w, t, line = s
            if sweep:
                put(*s, delay[(c, nid)], -1)
            pe = place[(c, nid)].pe
            d = min((d for d in range(max_delay + 1) if room.free(pe, t + d)),
                    key=lambda d: (cost(*s, d), d))
            put(*s, d, 1)
            length = max(length, t + d + place[(c, nid)].latency)
            delay[(c, nid)] = d
    if not any(delay.values()):
        return km
    return _delay_stores(km, arch, delay, STAGE_LINES_NOTE + str(StoreTiming.STAGGER_STORES))


class _IssueRoom:
    """Ops per (PE, slot), at most `pe_array.issue_width`, and the store unit's busy slots: a
    store moves only onto a slot of its PE with issue room and its unit free
    (docs/architecture.md#issue-width)."""

    def __init__(self, km: KernelMapping, arch: ArchSpec):
        self.ii, self.width = km.ii, arch.pe_array.issue_width
        self.slots = Counter((p.pe, p.time % km.ii) for p in km.placements)
        self.fu = arch.fu_for(Op.STORE.value)
        self.units = Counter()
        for p in km.placements:
            fu = arch.fu_for(km.kernel.nodes[p.node].op.value)
            if fu.name == self.fu.name:
                self.units.update((p.pe, (p.time + j) % km.ii)
                                  for j in range(fu.issue_interval_cycles))

    def add(self, pe, t: int, sign: int) -> None:
        """A store issued on `pe` at t (sign 1) or taken away (-1)."""
        self.slots[(pe, t % self.ii)] += sign
        for j in range(self.fu.issue_interval_cycles):
            self.units[(pe, (t + j) % self.ii)] += sign

    def free(self, pe, t: int) -> bool:
        return self.slots[(pe, t % self.ii)] < self.width and not any(
            self.units[(pe, (t + j) % self.ii)] for j in range(self.fu.issue_interval_cycles))


def _delay_stores(km: KernelMapping, arch: ArchSpec, delay: dict, note: str) -> KernelMapping:
    """`km` with store (copy, node) issued delay[(copy, node)] cycles later (stores have no
    users and no routes: nothing else moves); `km` when the result is not legal."""
    return shifted(km, arch, delay, note)


def fewer_copies(km: KernelMapping, arch: ArchSpec, tile_rows: int) -> list[KernelMapping]:
    """The body mapped with fewer copies (down to `FEWEST_COPIES_SHARE` of `km`'s), each at
    the first II the mapper finds; those that do not map are left out."""
    out = []
    lowest = max(1, int(km.copies * FEWEST_COPIES_SHARE))
    for u in range(km.copies - 1, lowest - 1, -1):
        try:
            out.append(map_kernel(km.kernel, arch, copies=u, max_tile_rows=tile_rows))
        except MappingError:
            continue
    return out


def choose_store_timing(km: KernelMapping, arch: ArchSpec, tile_rows: int,
                        entry_budget: int | None = None) -> KernelMapping:
    """The variant of `km` (the module docstring) with the fewest cycles on its first two
    tiles; `km` itself when none is faster or the kernel is not a plain load/store body."""
    if not km.tiles or not timing_only(km):
        return km
    key = _key(km, arch, tile_rows, entry_budget)
    hit = _CHOICES.get(key)  # the chosen schedule, or PLAIN
    if hit is None:
        hit = _disk_get(key, km, arch)
    if hit is None:
        chosen = _choose(km, arch, tile_rows, entry_budget)
        hit = StoreTiming.PLAIN if chosen is km else chosen
        _disk_put(key, None if hit is StoreTiming.PLAIN else hit)
    _CHOICES.put(key, hit)
    if hit is StoreTiming.PLAIN:
        return km
    # bound to this kernel (another program's kernels may share the key: same body, addresses)
    return dataclasses.replace(hit, kernel=km.kernel, tiles=km.tiles, allocations=km.allocations)


def _choose(km, arch, tile_rows, entry_budget) -> KernelMapping:
    budget = arch.pe_array.instruction_entries if entry_budget is None else entry_budget
    base = stage_cycles(km, arch)
    stalls = kernel_stalls(km, arch, [t for t in SCORED_TILES if t < len(km.tiles)])
    if stalls < MIN_STALL_SHARE * base:
        return km
    cands = [(base, 0, km, StoreTiming.PLAIN)]
    near = near_copies(km, arch)
    for kind, v in ((StoreTiming.NEAR_COPIES, near),
                    (StoreTiming.NEAR_COPIES, stagger_stores(near, arch) if near is not km
                     else km),
                    (StoreTiming.STAGGER_STORES, stagger_stores(km, arch))):
        if v is not km:
            cands.append((stage_cycles(v, arch), len(cands), v, kind))
    for f in fewer_copies(km, arch, tile_rows):
        if max(Counter(p.pe for p in f.placements).values()) > budget:
            continue
        for v in (f, stagger_stores(f, arch)):
            cands.append((stage_cycles(v, arch), len(cands), v, StoreTiming.FEWER_COPIES))
    cycles, _, best, kind = min(cands, key=lambda c: c[:2])
    if best is km:
        return km
    return dataclasses.replace(best, notes=(*best.notes, (
        f"{STAGE_LINES_NOTE}{kind}, {best.copies} copies at II {best.ii}: {base} -> {cycles} "
        f"cycles on tiles {SCORED_TILES}")))


# --- the cache ---------------------------------------------------------------------------------

KIND, VERSION = "stage-lines", 1


def _key(km: KernelMapping, arch: ArchSpec, tile_rows: int, budget) -> str:
    """What the choice depends on: the arch, the body with its addresses and buffers, the
    mapped schedule, the tiles and the SPM allocation."""
    h = hashlib.sha256(json.dumps(arch_to_dict(arch), sort_keys=True, default=str).encode())
    h.update(repr((km.kernel.nodes, km.kernel.loops, km.kernel.buffers, km.kernel.vector_var,
                   km.copies, km.ii,
                   sorted((p.copy, p.node, p.pe, p.time) for p in km.placements), km.routes,
                   km.tiles, km.allocations, tile_rows, budget)).encode())
    return h.hexdigest()[:32]


def _file(key: str):
    return resolve_cache_dir() / "stage_lines" / f"{key}.pkl"


def _disk_get(key: str, km: KernelMapping, arch: ArchSpec):
    """The stored choice bound to `km`'s kernel, tiles and allocation (legality checked),
    StoreTiming.PLAIN when the plain schedule won, or None; a damaged, foreign or illegal entry
    is deleted."""
    def load(payload: bytes) -> KernelMapping:
        got = pickle.loads(payload)
        if not (isinstance(got, dict) and got.get("key") == key):
            raise ValueError("a choice for another kernel")
        if got["km"] is None:
            return StoreTiming.PLAIN
        out = dataclasses.replace(got["km"], kernel=km.kernel, tiles=km.tiles,
                                  allocations=km.allocations)
        check_kernel_mapping(out, arch)
        return out

    return read_entry(_file(key), KIND, VERSION, load, errors=(*LOAD_ERRORS, MappingError))


def _disk_put(key: str, chosen: KernelMapping | None) -> None:
    """`chosen` (None: the plain schedule won) stored without its kernel, tiles and
    allocation."""
    record = {"key": key, "km": None}
    if chosen is not None:
        record["km"] = dataclasses.replace(chosen, kernel=None, tiles=(), allocations=())
    write_entry(_file(key), KIND, VERSION, pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))
