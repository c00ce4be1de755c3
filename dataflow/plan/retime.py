"""Line-aware post-passes on a modulo schedule, and the measurement the schedule search scores
with (docs/conventions.md#register-blocking).

The passes move issue times by whole IIs only, so every modulo reservation (issue slots, units,
links) stays where the mapper put it; the legality checker has the last word, and a pass whose
result is not legal returns the schedule it was given.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import sys

import numpy as np

from dataflow.arch.load import arch_to_dict
from dataflow.arch.spec import ArchSpec
from dataflow.cachefiles import (
    BoundedCache,
    CacheEntryError,
    atomic_write_bytes,
    frame_entry,
    read_entry,
    resolve_cache_dir,
    unframe_entry,
    write_entry,
)
from dataflow.dfg.domain import enumerate_domain
from dataflow.dfg.graph import Kernel, Program
from dataflow.dfg.ops import Op
from dataflow.mapper.bounds import issue_copies, rec_mii, res_mii
from dataflow.mapper.legality import check_kernel_mapping
from dataflow.mapper.mapping import KernelMapping, MappingError
from dataflow.pe_array.common import spm_base
from dataflow.pe_array.fast_run import run_kernel_fast
from dataflow.plan.gather_lines import ordered_inputs
from dataflow.plan.line_schedule import LINE_NOTE, line_aware_delays
from dataflow.spm.lines import line_of_row


def retime(km: KernelMapping, arch: ArchSpec, delay: dict[tuple[int, int], int],
           note: str) -> KernelMapping:
    """`km` with (copy, node) issued `delay` cycles later, rounded up to whole IIs (so every
    modulo reservation -- issue slots, units, links -- stays where it was), each consumer at
    least as late as its latest-moved producer and each route departing as much later as its
    source moved. Returns `km` unchanged when the result is not legal (registers: operands
    wait longer) or nothing moves."""
    ii = km.ii
    nodes = km.kernel.nodes
    shift: dict[tuple[int, int], int] = {}
    for c in range(km.copies):
        for n in nodes:  # nodes are in topological order
            own = -(-delay.get((c, n.id), 0) // ii) * ii
            shift[(c, n.id)] = max([own] + [shift[(c, i)] for i in n.inputs])
    if not any(shift.values()):
        return km
    return shifted(km, arch, shift, note)


def shifted(km: KernelMapping, arch: ArchSpec, shift: dict[tuple[int, int], int],
            note: str) -> KernelMapping:
    """`km` with each (copy, node) issued shift[(copy, node)] cycles later (absent: 0) and each
    route departing as much later as its source; `km` when the result is not legal."""
    placements = tuple(dataclasses.replace(p, time=p.time + shift.get((p.copy, p.node), 0))
                       for p in km.placements)
    routes = tuple(dataclasses.replace(r, depart=r.depart + shift.get((r.copy, r.src), 0))
                   for r in km.routes)
    length = max(p.time + p.latency for p in placements)
    out = dataclasses.replace(km, placements=placements, routes=routes, schedule_length=length,
                              notes=(*km.notes, note))
    try:
        check_kernel_mapping(out, arch)
    except MappingError:
        return km
    return out


def align_gathers(km: KernelMapping, arch: ArchSpec) -> KernelMapping:
    """Line-aware issue times for gathers: a copy's gathers of one buffer through one index
    (the row blocks of one gathered row, consecutive SPM rows on consecutive lines) issue in
    the same cycle, so each iteration's row blocks cover distinct lines together instead of
    landing, one per cycle, wherever other iterations' blocks happen to be."""
    nodes = km.kernel.nodes
    groups: dict[tuple, list] = {}
    for p in km.placements:
        n = nodes[p.node]
        if n.op is Op.GATHER:
            groups.setdefault((p.copy, n.buffer, n.inputs[0]), []).append(p)
    delay = {}
    for members in groups.values():
        if len(members) > 1:
            last = max(p.time for p in members)
            delay.update({(p.copy, p.node): last - p.time for p in members})
    return retime(km, arch, delay, "gathers of one row aligned (line-aware)")


SKEW_NOTE = "copies skewed by one II each (line-aware)"


def skew_copies(km: KernelMapping, arch: ArchSpec) -> KernelMapping:
    """Copy c issues everything c IIs later. Copies whose chunks start at the same point of a
    stream (a chunk a whole number of reduction runs long) otherwise read rows one line apart
    in lock step -- all on one line -- and a skew of one row per copy spreads them over the
    lines; where the chunks were already offset it may do the opposite, so the search measures
    both."""
    delay = {(c, n.id): c * km.ii for c in range(km.copies) for n in km.kernel.nodes}
    return retime(km, arch, delay, SKEW_NOTE)


def line_copies(km: KernelMapping, arch: ArchSpec) -> KernelMapping:
    """Copy c issues everything d_c IIs later, the delays chosen by the line-aware reservation
    table of the static SPM accesses (`line_schedule.line_aware_delays`,
    docs/conventions.md#sparse-line-model); `km` when every delay is 0."""
    delays = line_aware_delays(km, arch)
    if not delays or not any(delays):
        return km
    ii = km.ii
    return retime(km, arch, {(c, n.id): d * ii for c, d in enumerate(delays)
                             for n in km.kernel.nodes}, LINE_NOTE)


#: copy orders `stagger_reads` tries beyond forward and backward
STAGGER_ORDERS = 64
STAGGER_READS_NOTE = "row reads of one issue slot staggered by one II each (line-aware)"


def stagger_reads(km: KernelMapping, arch: ArchSpec) -> KernelMapping:
    """Line-aware issue times for row reads: each affine read of each copy is delayed by the
    fewest whole IIs (0 .. lines - 1) that put it, in the steady state of the first tile, on
    a line whose read ports the reads already placed in its issue slot (time mod II) leave
    free. A register-blocked body's streams advance one SPM row per iteration from
    line-aligned bases (packed panels), so a copy's A panel row and B rows -- and other
    copies', whose chunks start at offsets a multiple of the line count apart -- otherwise
    fall on one line in one cycle; a read delayed d IIs runs d iterations behind, d rows
    (d lines) away (docs/conventions.md#register-blocking)."""
    spm = arch.spm
    kernel, tile = km.kernel, km.tiles[0]
    lanes = arch.pe_array.simd_lanes if kernel.vector_var else 1
    dom = enumerate_domain(kernel, lanes, (tile.lo, tile.hi))
    n = len(dom[kernel.loops[0].var])
    waves = -(-n // km.copies)
    ref = spm.lines  # the steady-state wave the lines are compared at
    if n == 0 or waves <= ref:
        return km
    nodes = kernel.nodes
    reads: dict[int, list] = {}  # copy -> [(node, slot, line at delay d for d < lines)]
    for p in sorted(km.placements, key=lambda p: (p.copy, p.time, p.node)):
        node = nodes[p.node]
        # a held load reads once per run of its address (docs/conventions.md#held-loads)
        if (not node.op.reads_spm or node.op.accumulates or node.addr.index_stride
                or node.hold):
            continue
        it = min(n - 1, p.copy * waves + ref) - np.arange(2 * spm.lines)
        it = np.maximum(it, 0)
        addr = np.full(len(it), node.addr.const, dtype=np.int64)
        for v, c in node.addr.terms:
            if v != kernel.vector_var or node.addr.span:
                addr = addr + c * dom[v][it]
        if not node.addr.span and node.addr.coef(kernel.vector_var):
            addr = addr + node.addr.coef(kernel.vector_var) * dom[kernel.vector_var][it]
        sbase, wlo = spm_base(km, node.buffer, 0, tile)
        lines = line_of_row((sbase + addr - wlo) // spm.words_per_row, spm)
        reads.setdefault(p.copy, []).append((p.node, p.time % km.ii, [int(x) for x in lines]))
    ports = spm.read_ports_per_line

    def place(group, base, counts):
        """Each read of one copy at `base` IIs plus the fewest extra IIs (fewer than the
        copy's reads: the operands of one body wait at most that long) onto a free line."""
        over, got = 0, []
        for nid, slot, lines in group:
            e = min(range(min(len(group), spm.lines)), key=lambda e: (
                counts.get((slot, lines[base + e]), 0) >= ports, e))
            key = (slot, lines[base + e])
            over += counts.get(key, 0) >= ports
            counts[key] = counts.get(key, 0) + 1
            got.append((nid, base + e))
        return over, got

    def arrange(order, prefer):
        """Copies in `order`, each at the base that overflows fewest ports (of equals, the
        first in `prefer`): (overflow, delays)."""
        taken: dict[tuple[int, int], int] = {}  # (slot, line) -> reads placed
        total, delay = 0, {}
        for c in order:
            best = min((place(reads[c], base, dict(taken))[0], rank, base)
                       for rank, base in enumerate(prefer))
            over, got = place(reads[c], best[2], taken)
            total += over
            delay.update({(c, nid): d * km.ii for nid, d in got})
        return total, delay

    # a greedy packing can strand the last copies between full lines: the copies in order,
    # the fewest IIs first, then (seeded, so a schedule is reproducible) shuffled orders and
    # preferences, the arrangement that overflows least
    rng = np.random.default_rng(0)
    copies = sorted(reads)
    best = arrange(copies, range(spm.lines))
    for _ in range(STAGGER_ORDERS):
        if best[0] == 0:
            break
        got = arrange([copies[i] for i in rng.permutation(len(copies))],
                      [int(b) for b in rng.permutation(spm.lines)])
        if got[0] < best[0]:
            best = got
    delay = best[1]
    return retime(km, arch, delay, STAGGER_READS_NOTE)


#: the recorded line-aware variants of `post_passes` (`skewed` names the one a mapping has)
VARIANTS = {False: lambda km, arch: km, True: skew_copies, "lines": line_copies,
            "reads": lambda km, arch: stagger_flushes(stagger_reads(km, arch), arch)}


def post_passes(km: KernelMapping, arch: ArchSpec, program: Program,
                skew: bool | str | None = None) -> tuple[float | None, KernelMapping]:
    """The line-aware passes on a non-plain schedule: gathers aligned, flushes staggered, and
    the copies skewed, delayed by the line-aware table (`line_copies`) or their reads staggered
    (`stagger_reads`) when that measures faster on the first tile (`skew` None), or as a
    recorded choice says (a key of `VARIANTS`: nothing measured, the cost None)."""
    km = stagger_flushes(align_gathers(km, arch), arch)
    if skew is not None:
        return None, VARIANTS[skew](km, arch)
    variants = [km]
    for key, make in VARIANTS.items():
        v = make(km, arch)
        if key is not False and v is not km:  # a pass that changed nothing is not run twice
            variants.append(v)
    return min(((sample_cycles(v, arch, program), i, v) for i, v in enumerate(variants)),
               key=lambda x: x[:2])[::2]


def skewed(km: KernelMapping) -> bool | str:
    """The `VARIANTS` key of `km`'s line-aware variant."""
    if LINE_NOTE in km.notes:
        return "lines"
    if STAGGER_READS_NOTE in km.notes:
        return "reads"
    return SKEW_NOTE in km.notes


def stagger_flushes(km: KernelMapping, arch: ArchSpec) -> KernelMapping:
    """Line-aware issue times: within each copy, accumulating nodes that issue in the same
    cycle are moved to distinct cycles (later, never earlier; they have no users), so their
    register flushes -- which for a register block hit rows one line apart -- never share
    a cycle on a line's write port. Returns `km` unchanged when the moved schedule is not legal
    (a register file too small to hold the operands longer)."""
    nodes = km.kernel.nodes
    taken: dict[tuple[int, int], int] = {}
    moved = []
    for p in sorted(km.placements, key=lambda p: (p.copy, p.time, p.node)):
        if nodes[p.node].op.accumulates:
            t = p.time
            while (p.copy, t) in taken:
                t += 1
            taken[(p.copy, t)] = p.node
            p = dataclasses.replace(p, time=t)
        moved.append(p)
    moved.sort(key=lambda p: (p.copy, p.node))
    length = max(p.time + p.latency for p in moved)
    out = dataclasses.replace(km, placements=tuple(moved), schedule_length=length,
                              notes=(*km.notes, "accumulator flushes staggered (line-aware)"))
    try:
        check_kernel_mapping(out, arch)
    except MappingError:
        return km
    return out


#: measured first tiles, by everything the measurement reads (`_sample_key`): a warm run
#: re-plans its program (ramped tiles ask for one) without running the tile again
_SAMPLES: dict[str, float] = {}
SAMPLES_KEPT = 64


def _sample_key(first: KernelMapping, arch: ArchSpec, program: Program) -> str:
    """A digest of what `sample_cycles` reads: the arch, the first tile's mapping and every
    array of the program (inputs and the values the host knows), so a hit is the same run."""
    h = hashlib.sha256(json.dumps(arch_to_dict(arch), sort_keys=True, default=str).encode())
    with np.printoptions(threshold=sys.maxsize):  # reprs, not pickles: no set order enters
        h.update(repr((str(first.kernel), first.copies, first.ii, first.placements,
                       first.routes, first.allocations, first.tiles, first.schedule_length,
                       program.dtype)).encode())
    for name, x in (*program.inputs, *program.known, *first.kernel.domain_arrays):
        a = np.ascontiguousarray(x)
        h.update(repr((name, a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def sample_cycles(km: KernelMapping, arch: ArchSpec, program: Program) -> float:
    """Cycles per iteration of the kernel's first tile on the fast engine (stalls included):
    the measured score of a schedule. Memoised by content (`_sample_key`), in this process and
    on disk."""
    first = dataclasses.replace(km, tiles=km.tiles[:1])
    key = _sample_key(first, arch, program)
    hit = _SAMPLES.get(key)
    if hit is None:
        path = resolve_cache_dir() / "tile_samples" / f"{key[:32]}.sample"
        hit = read_entry(path, SAMPLES_KIND, SAMPLES_VERSION,
                         lambda payload: _sample_of(json.loads(payload), key))
        if hit is None:
            hit = _measure(first, arch, program)
            write_entry(path, SAMPLES_KIND, SAMPLES_VERSION,
                        json.dumps({"key": key, "cycles_per_iteration": hit}).encode())
        _SAMPLES[key] = hit
        while len(_SAMPLES) > SAMPLES_KEPT:
            _SAMPLES.pop(next(iter(_SAMPLES)))
    return hit


#: measured tiles on disk (`<cache dir>/tile_samples/`), framed with the code fingerprint, so a
#: new process planning a program it planned before runs no tile (nor the line order it needs)
SAMPLES_KIND, SAMPLES_VERSION = "tile-sample", 1


def _sample_of(record, key: str) -> float:
    """The measurement of a sample file's record; ValueError unless it is the one for `key` (a
    damaged or foreign file is then measured again and rewritten)."""
    if not (isinstance(record, dict) and record.get("key") == key):
        raise ValueError("the sample of another tile")
    got = record.get("cycles_per_iteration")
    if not isinstance(got, (int, float)) or not got >= 0:
        raise ValueError("not a measurement")
    return float(got)


def _measure(first: KernelMapping, arch: ArchSpec, program: Program) -> float:
    # a static sparse operand's nonzeros as the compiler will order them (gather_lines), and
    # the values the host knows of buffers an earlier kernel makes
    inputs = {**ordered_inputs(first, arch, program), **dict(program.known)}
    # an earlier kernel's output is zeros here (timing depends on addresses only): a division
    # by it (the attention's folded normalisation) makes NaNs nobody reads
    with np.errstate(divide="ignore", invalid="ignore"):
        res = run_kernel_fast(first, arch, inputs, program.dtype)
    tile = res.tiles[0]
    return tile.compute_cycles / max(1, tile.iterations)


#: a candidate is not mapped when the best schedule measured so far is within this factor of
#: its lower bound: it could win by at most that much (the bound leaves out fill, drain and
#: stalls, which a measured tile of a good schedule carries by some 10-20 %)
BOUND_SLACK = 1.25
#: most candidates mapped and measured per kernel (planning stays fast: each costs a mapping
#: and a tile); the ranking puts the likely winners first
MAX_EVALUATED = 3


def kernel_iterations(kernel: Kernel, lanes: int) -> int:
    """Iterations of `kernel` (its vector loop counted in vectors of `lanes`); a sparse loop
    contributes its pos array's total over its parent's extent."""
    total = 1
    for lp in kernel.loops:
        if lp.is_dense:
            total *= -(-lp.extent // lanes) if lp.var == kernel.vector_var else lp.extent
    for lp in kernel.loops:
        if not lp.is_dense:
            pos = kernel.domain[lp.pos]
            total = total // max(1, len(pos) - 1) * int(pos[-1])
    return max(1, total)


def cycles_bound(kernel: Kernel, arch: ArchSpec, copies: int | None = None) -> float:
    """A lower bound on the kernel's cycles before anything is mapped: its iterations over the
    best throughput any copy count could reach (or `copies`, when the mapper is asked for
    that many), copies / max(ResMII, RecMII)."""
    lanes = arch.pe_array.simd_lanes if kernel.vector_var else 1
    rec = rec_mii(kernel, arch)
    most = max(1, issue_copies(kernel, arch))  # as `map_kernel` tries them
    counts = [copies] if copies else range(1, most + 1)
    best = min(max(res_mii(kernel, arch, u), rec) / u for u in counts)
    return kernel_iterations(kernel, lanes) * best


def best_candidate(candidates: list, bound, evaluate):
    """Branch and bound: `candidates` in order of `bound(c)` (a lower bound on c's cost); each
    is `evaluate`d (-> (cost, result), or None when it cannot be mapped) unless the best cost
    so far is within `BOUND_SLACK` of its bound, and at most `MAX_EVALUATED` once one has
    mapped. Returns (cost, candidate, result, evaluated)
    of the cheapest; the first candidate is always evaluated."""
    ranked = sorted(candidates, key=bound)  # stable: equal bounds keep the given order
    best, evaluated = None, 0
    for c in ranked:
        if best is not None and (best[0] <= BOUND_SLACK * bound(c)
                                 or evaluated >= MAX_EVALUATED):
            break
        got = evaluate(c)
        evaluated += 1
        if got is not None and (best is None or got[0] < best[0]):
            best = (got[0], c, got[1])
    return (*best, evaluated) if best is not None else None


#: the schedule each (kernel, array) was given, so a sweep that varies only the memory system,
#: energy or area, or the next process, re-plans with one mapping instead of a search
#: (process-wide and bounded; on disk beside the plan cache, `recall` / `remember`)
CHOICES = BoundedCache(512)
#: arch fields a schedule choice does not depend on: the choice is made on tile compute cycles
_CHOICE_FREE = ("dram", "energy", "area", "name", "source")


def choice_key(kernel: Kernel, arch: ArchSpec, kind: str) -> str:
    """A key for `CHOICES`: the kernel's loops, body, buffers and domain arrays, and every arch
    field the choice depends on."""
    h = hashlib.sha256(kind.encode())
    h.update(str(kernel).encode())
    h.update(repr([(lp.var, lp.extent, lp.pos, lp.parent) for lp in kernel.loops]).encode())
    h.update(repr([(b.name, b.size, str(b.role), str(b.fetch), b.spm_base)
                   for b in kernel.buffers]).encode())
    for name, arr in kernel.domain_arrays:
        h.update(name.encode())
        h.update(arr.tobytes())
    spec = {k: v for k, v in arch_to_dict(arch).items() if k not in _CHOICE_FREE}
    h.update(json.dumps(spec, sort_keys=True, default=str).encode())
    return h.hexdigest()


CHOICE_KIND, CHOICE_VERSION = "schedule", 2  # 2: held-row schedules


def _choice_path(key: str):
    return resolve_cache_dir() / "schedules" / f"{key}.json"


def recall(key: str) -> dict | None:
    """A schedule choice made for `key` (`choice_key`): from this process's memo, else from
    the cache folder (framed and fingerprinted like every cache file; a stale, damaged or
    unreadable one is ignored and rebuilt). None when none was made."""
    known = CHOICES.get(key)
    if known is not None:
        return known
    try:
        blob = _choice_path(key).read_bytes()
        got = json.loads(unframe_entry(CHOICE_KIND, CHOICE_VERSION, blob))
    except (OSError, CacheEntryError, ValueError):
        return None
    if not isinstance(got, dict) or not isinstance(got.get("fields"), dict):
        return None
    CHOICES.put(key, got)
    return got


def remember(key: str, choice: dict) -> None:
    """Keep `choice` (plain JSON data) for `key`, in memory and, where the folder is writable,
    on disk."""
    CHOICES.put(key, choice)
    payload = json.dumps(choice, sort_keys=True).encode()
    try:
        atomic_write_bytes(_choice_path(key), frame_entry(CHOICE_KIND, CHOICE_VERSION, payload))
    except OSError:
        pass  # a read-only cache folder only costs the next process a search


MAPPING_KIND, MAPPING_VERSION = "kernel-mapping", 1


def recall_mapping(key: str, kernel: Kernel) -> KernelMapping | None:
    """The mapping kept for `key` with `kernel` (the same body, lowered again) bound to it, or
    None. A mapping holds no operand values, only the body's structure, which the key fixes."""
    try:
        blob = (resolve_cache_dir() / "schedules" / f"{key}.mapping").read_bytes()
        km = pickle.loads(unframe_entry(MAPPING_KIND, MAPPING_VERSION, blob))
    except (OSError, CacheEntryError, pickle.UnpicklingError, EOFError, AttributeError,
            ImportError, IndexError, TypeError, ValueError):
        return None
    if not isinstance(km, KernelMapping) or str(km.kernel) != str(kernel):
        return None
    return dataclasses.replace(km, kernel=kernel)


def remember_mapping(key: str, km: KernelMapping) -> None:
    payload = pickle.dumps(km, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        atomic_write_bytes(resolve_cache_dir() / "schedules" / f"{key}.mapping",
                           frame_entry(MAPPING_KIND, MAPPING_VERSION, payload))
    except OSError:
        pass


def choose_memoised(key: str, schedule_type, body_of, replay, search):
    """The one flow of a memoised schedule choice: a choice recorded for `key` (`recall`) is
    rebuilt as `schedule_type(**fields)` and bound to its kept mapping when that matches
    `body_of(schedule)`, else re-mapped by `replay(schedule, skew)` with nothing measured;
    otherwise `search()` -> (schedule, mapping, candidates evaluated) runs and its result is
    kept (`remember`, `remember_mapping`). Returns (schedule, mapping, evaluated), evaluated
    None for a recorded choice."""
    known = recall(key)
    if known is not None:
        sched = schedule_type(**known["fields"])
        km = recall_mapping(key, body_of(sched))
        if km is None:
            km = replay(sched, known["skew"])
            remember_mapping(key, km)
        return sched, km, None
    sched, km, evaluated = search()
    remember(key, {"fields": dataclasses.asdict(sched), "skew": skewed(km)})
    remember_mapping(key, km)
    return sched, km, evaluated
