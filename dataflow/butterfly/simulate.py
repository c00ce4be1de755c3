"""Simulation of an orchestrated butterfly mapping: the engine per kernel, then the system model
with the kernels grouped into residencies (one configuration and one DRAM round trip each).

The engine (`pe_array.simulate.run_array`, fast or reference) computes every kernel's values,
per-tile array cycles and SPM traffic exactly as for any program. What the orchestration
changes is the system level: a residency's kernels run tile by tile one after another, so its
DMA reads only the data that enters the residency (plus coefficient tables) and writes only what
leaves it; buffers handed between co-resident kernels stay in SPM lines and cost no DRAM bytes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dataflow.butterfly.reference import ButterflyError
from dataflow.dfg.graph import BufferRole
from dataflow.dfg.lower_butterfly import data_names, data_rows, is_skewed
from dataflow.pe_array.common import dma_words
from dataflow.pe_array.result import KernelResult, SimResult, TileResult
from dataflow.pe_array.roofline import kernel_roofline, program_roofline
from dataflow.pe_array.simulate import (
    array_counts,
    assemble_result,
    energy_breakdown,
    run_array,
    sequence_results,
)
from dataflow.pe_array.system import run_system, tile_buffer_counts
from dataflow.plan.orchestrate import OrchestratedMapping, roofline

# the system model takes per-buffer DMA transfers when TileResult carries them
_PER_BUFFER = "dram_transfers" in TileResult.__dataclass_fields__


@dataclass(frozen=True)
class StageSpan:
    """Kernel `kernel` ran tile `tile` on the array in cycles [start, end) on PEs `pes`."""

    kernel: str
    residency: int
    tile: int
    start: int
    end: int
    pes: tuple[tuple[int, int], ...]


def _buffer_bytes(km, kernel, tile_index: int, word_bytes: int,
                  real_rows: tuple = (frozenset(), 1, 1)) -> dict[str, tuple[int, int]]:
    """name -> (bytes read, bytes written) by DMA for one tile (the engine's rule, per buffer).

    `real_rows` = (skewed data buffers, real rows, rows): the DMA moves only the real rows of a
    skewed buffer (the spare rows of the layout never leave the SPM)."""
    skewed, real, rows = real_rows
    out = {}
    for b in kernel.buffers:
        words = dma_words(km, b, tile_index)
        if b.name in skewed:
            words = words * real // rows
        out[b.name] = (words * word_bytes if b.role == BufferRole.INPUT else 0,
                       words * word_bytes if b.role == BufferRole.OUTPUT else 0)
    return out


#: the one DMA transfer of a residency's resident inputs (coefficient tables, biases): tables
#: that stay in the SPM for the residency's life are laid out together in DRAM by the compiler,
#: so they cross in one transfer before the first tile instead of paying the DMA latency
#: once per stage (docs/conventions.md#system-level)
TABLES = "tables"


def _transfers(name: str, rd: int, wr: int) -> list:
    """DMA transfers of one buffer for one tile: one per direction that moves bytes. The
    system model stripes a transfer of a page per channel or more over every channel
    (`pe_array.system`); splitting it per channel or per row would only pay the DMA latency
    more often on the engines (docs/conventions.md#system-level)."""
    return [(name, kind, nb) for kind, nb in (("read", rd), ("write", wr)) if nb]


def _first_loads(seg_tiles, arch, occupied=None) -> list[frozenset[str]] | None:
    """`run_system`'s prefetch sets: every first-tile load of the first residency, issued with
    its configuration (nothing before it occupies the SPM, and its tile fits by construction;
    docs/conventions.md#system-level); None without `dram.prefetch_next_kernel`.

    A later residency's packed tables (`TABLES`: program inputs, never written by a kernel)
    load while the residency before it runs, when they fit in the SPM beside the words that
    one occupies (`occupied[k - 1]`, `_occupied`); its data, an intermediate, never does
    (docs/conventions.md#fnet-pass-boundaries)."""
    if not arch.dram.prefetch_next_kernel or not seg_tiles or not seg_tiles[0][1]:
        return None
    first = seg_tiles[0][1][0]
    reads = frozenset(b for b, kind, n in first.dram_transfers if kind == "read" and n)
    out = [reads]
    for k in range(1, len(seg_tiles)):
        tiles = seg_tiles[k][1]
        words = sum(n for b, kind, n in tiles[0].dram_transfers
                    if b == TABLES and kind == "read") // arch.word_bytes if tiles else 0
        room = arch.spm.capacity_words - (occupied[k - 1] if occupied else arch.spm.capacity_words)
        out.append(frozenset({TABLES}) if 0 < words <= room else frozenset())
    return out


def _occupied(mapping, seg) -> int:
    """SPM words a residency holds at most: every kernel's allocations side by side (each
    kernel allocates from word 0, so this over-counts what the residency shares)."""
    return sum(max((max(a.base, a.base_alt or 0) + a.words for a in mapping.kernels[i].allocations),
                   default=0) for i in seg)


def _slot_words(mapping, seg) -> int:
    """SPM words of one slot of a residency's streamed inputs: the data that enters it from
    DRAM each tile (its resident tables and the buffers its kernels hand over excluded)."""
    bufs = [b for i in seg for b in mapping.kernels[i].kernel.buffers]
    made = {b.name for b in bufs if b.role == BufferRole.OUTPUT}
    enters = {b.name for b in bufs if b.role == BufferRole.INPUT} - made
    return sum(a.words for i in seg for a in mapping.kernels[i].allocations
               if a.streamed and a.buffer in enters)


def _buffers(seg_tiles, arch, occupied, slots, prefetch) -> list[int] | None:
    """`run_system`'s slots per residency (`tile_buffer_counts`): a residency's extra slots fit
    beside the words it occupies and the next residency's tables, when those load early
    (`_first_loads`; docs/conventions.md#deeper-tile-buffers). None: double buffering."""
    if arch.dram.tile_buffers <= 2 or len(slots) != len(seg_tiles) or not occupied:
        return None
    taken = []
    for k, words in enumerate(occupied):
        early = 0
        if prefetch and k + 1 < len(seg_tiles) and TABLES in prefetch[k + 1]:
            early = sum(n for b, kind, n in seg_tiles[k + 1][1][0].dram_transfers
                        if b == TABLES and kind == "read") // arch.word_bytes
        taken.append(words + early)
    return tile_buffer_counts(list(zip(slots, taken)), arch)


def _system(seg_tiles, arch, occupied, slots):
    """`run_system` over the residencies with their prefetch sets and slots."""
    prefetch = _first_loads(seg_tiles, arch, occupied)
    return run_system(seg_tiles, arch, prefetch,
                      _buffers(seg_tiles, arch, occupied, slots, prefetch))


@dataclass(frozen=True, eq=False)
class OrchestratedRun:
    """`result`: the SimResult (its `output` is the program's first output, flat);
    `outputs`: every output buffer by name (flat, layout [nb, n, L]); `spans`: when each kernel
    tile ran (Gantt charts); `bounds`: `orchestrate.roofline` of this run (cycles)."""

    result: SimResult
    outputs: dict
    spans: tuple[StageSpan, ...]
    bounds: dict
    spec: object = None  # the ButterflySpec the program was lowered with (its data layout)
    #: (residency name, tiles) as handed to the system model, in order (`back_to_back`)
    system: tuple = ()
    #: SPM words each residency occupies (`_occupied`), in the order of `system`
    occupied: tuple = ()
    #: SPM words of one slot of each residency's streamed inputs (`_slot_words`), same order
    slots: tuple = ()


def simulate_orchestrated(om: OrchestratedMapping, engine: str = "fast",
                          workload: str | None = None) -> OrchestratedRun:
    """Values and timing of `om` (cycles at the array clock, bytes, pJ)."""
    mapping, arch = om.mapping, om.arch
    arrays = run_array(mapping, engine)
    wb = arch.word_bytes
    spec, G = om.spec, len(mapping.kernels)
    if is_skewed(spec, 0, G):
        real_rows = (frozenset(nm for i in range(G + 1) for nm in data_names(spec, i, G)),
                     spec.n, data_rows(spec, True))
    else:
        real_rows = (frozenset(), 1, 1)
    seg_tiles = []
    for si, seg in enumerate(om.segments):
        bufs = [b for i in seg for b in mapping.kernels[i].kernel.buffers]
        produced = {b.name for b in bufs if b.role == BufferRole.OUTPUT}
        consumed = {b.name for b in bufs if b.role == BufferRole.INPUT}
        internal = produced & consumed  # handed between co-resident kernels through the SPM
        ntiles = len(arrays[seg[0]].tiles)
        merged = []
        for t in range(ntiles):
            rd = wr = comp = stall = iters = 0
            transfers = []  # one DMA transfer per buffer and direction
            tables = 0  # bytes of the residency's resident inputs: one packed transfer
            for i in seg:
                km = mapping.kernels[i]
                a = arrays[i].tiles[t]
                comp += a.compute_cycles
                stall += a.stall_cycles_spm_conflict
                iters += a.iterations
                for name, (r, w) in _buffer_bytes(km, km.kernel, t, wb, real_rows).items():
                    if name not in internal:
                        rd += r
                        wr += w
                        if r and not km.allocation_map[name].streamed:
                            tables += r
                        else:
                            transfers += _transfers(name, r, w)
            transfers += _transfers(TABLES, tables, 0)
            extra = {"dram_transfers": tuple(transfers)} if _PER_BUFFER else {}
            merged.append(TileResult(kernel=f"residency{si}", index=t, iterations=iters,
                                     compute_cycles=comp, stall_cycles_spm_conflict=stall,
                                     dram_bytes_read=rd, dram_bytes_written=wr, **extra))
        seg_tiles.append((f"residency{si}", tuple(merged)))
    occupied = tuple(_occupied(mapping, seg) for seg in om.segments)
    slots = tuple(_slot_words(mapping, seg) for seg in om.segments)
    tl = _system(seg_tiles, arch, occupied, slots)
    rd = sum(t.dram_bytes_read for _, ts in seg_tiles for t in ts)
    wr = sum(t.dram_bytes_written for _, ts in seg_tiles for t in ts)
    spans: list[StageSpan] = []
    starts = {(name, ti): s for name, ti, s, _ in tl.tile_spans}
    kernel_span: dict[int, list[int]] = {}
    for si, seg in enumerate(om.segments):
        for t in range(len(seg_tiles[si][1])):
            cur = starts[(f"residency{si}", t)]
            for i in seg:
                km = mapping.kernels[i]
                c = arrays[i].tiles[t].compute_cycles
                spans.append(StageSpan(km.kernel.name, si, t, cur, cur + c,
                                       tuple(sorted({p.pe for p in km.placements}))))
                span = kernel_span.setdefault(i, [cur, cur + c])
                span[0], span[1] = min(span[0], cur), max(span[1], cur + c)
                cur += c
    outputs = {}
    for a in arrays:
        outputs.update(dict(a.outputs))
    kernels = tuple(
        KernelResult(kernel=a.kernel, start_cycle=kernel_span[i][0], end_cycle=kernel_span[i][1],
                     compute_cycles=sum(t.compute_cycles for t in a.tiles), ii=km.ii, mii=km.mii,
                     copies=km.copies, tiles=a.tiles,
                     roofline=kernel_roofline(mapping.program, arch, i, a, own_dma=False))
        for i, (a, km) in enumerate(zip(arrays, mapping.kernels)))
    bounds = roofline(om, rd + wr)
    notes = (*om.notes,
             (f"roofline bound {bounds['bound']:.0f} cycles (issue {bounds['issue_bound']:.0f}, "
              f"DRAM {bounds['dram_bound']:.0f}); "
              f"achieved {bounds['bound'] / max(1, tl.cycles):.2f}"))
    res = assemble_result(
        arch, workload=workload or mapping.program.name, engine=engine,
        counts=array_counts(arrays),
        energy_pj=energy_breakdown(arrays, arch, rd + wr, len(om.segments)),
        cycles=tl.cycles, compute_cycles=sum(t.compute_cycles for _, ts in seg_tiles for t in ts),
        stall_cycles_spm_conflict=sum(t.stall_cycles_spm_conflict
                                      for _, ts in seg_tiles for t in ts),
        stall_cycles_dram=tl.stall_cycles_dram,
        stall_cycles_reconfiguration=tl.stall_cycles_reconfiguration,
        stall_cycles_dependency=tl.stall_cycles_dependency, macs=mapping.program.macs,
        dram_bytes_read=rd, dram_bytes_written=wr, kernels=kernels,
        output=outputs[mapping.program.outputs[0][0]], notes=notes, mapping_summary=om.summary(),
        roofline=program_roofline(mapping.program, arch, arrays, dram_bytes=(rd, wr)))
    return OrchestratedRun(result=res, outputs=outputs, spans=tuple(spans), bounds=bounds,
                           spec=spec, system=tuple(seg_tiles), occupied=occupied, slots=slots)


def back_to_back(runs: list[OrchestratedRun], arch) -> tuple[int, int, int, list[int]] | None:
    """Programs run one after another on one system timeline (`run_system` over all their
    residencies in order): (cycles, DRAM stall cycles, reconfiguration stall cycles, the cycle
    each run's first tile starts computing at), or None when a run carries no system tiles.

    A program's reconfiguration then overlaps the previous one's last write-backs, and its
    loads, issued after it, share the DMA engines and channels with them: the rule between
    the kernels of one program (docs/conventions.md#system-level). Only the first program's
    first-tile loads go with its configuration."""
    if not runs or any(not r.system for r in runs):
        return None
    tiles, first, occupied, slots = [], [], [], []
    for j, r in enumerate(runs):
        first.append(len(tiles))
        tiles += [(f"p{j}.{name}", ts) for name, ts in r.system]
        occupied += r.occupied or [arch.spm.capacity_words] * len(r.system)
        slots += r.slots if len(r.slots) == len(r.system) else [0] * len(r.system)
    tl = _system(tiles, arch, occupied, slots)
    began = {(name, i): t0 for name, i, t0, _ in tl.tile_spans}
    starts = [began[(tiles[k][0], 0)] for k in first]
    return tl.cycles, tl.stall_cycles_dram, tl.stall_cycles_reconfiguration, starts


def merge_results(parts: list[SimResult], workload: str, output, notes=(),
                  runs: list[OrchestratedRun] | None = None, arch=None) -> SimResult:
    """Several programs run back to back (e.g. the two passes of a 2-D FFT): one result
    (`pe_array.simulate.sequence_results`), every part's notes kept, then `notes`. With their
    `runs` and `arch`, the cycles and the DRAM and reconfiguration stalls are those of one
    system timeline (`back_to_back`) and the kernels sit where it runs them."""
    if not parts:
        raise ButterflyError("nothing to merge")
    res = sequence_results(parts, workload, output,
                           notes=tuple(n for r in parts for n in r.notes) + tuple(notes))
    joint = back_to_back(runs, arch) if runs is not None and arch is not None else None
    return res if joint is None else _on_timeline(res, parts, joint)


def _on_timeline(res: SimResult, parts: list[SimResult], joint) -> SimResult:
    """`res` (the parts in sequence) with the cycles, stalls and kernel places of `joint`
    (`back_to_back`)."""
    cycles, dram, reconf, starts = joint
    kernels = []
    for r, start in zip(parts, starts):  # each run's kernels moved with its first tile
        shift = start - min(k.start_cycle for k in r.kernels)
        kernels += [dataclasses.replace(k, start_cycle=k.start_cycle + shift,
                                        end_cycle=k.end_cycle + shift) for k in r.kernels]
    return dataclasses.replace(res, cycles=cycles, stall_cycles_dram=dram,
                               stall_cycles_reconfiguration=reconf, kernels=tuple(kernels))


def chain_runs(runs: list[OrchestratedRun], workload: str, outputs: dict, spec=None,
               notes=(), arch=None) -> OrchestratedRun:
    """Programs run back to back as one run (the passes of a four-step FFT): results merged
    (`merge_results`, on one system timeline when `arch` is given), spans shifted onto one
    time line with residencies renumbered, bounds added (the roofline of a sequence of
    programs is the sum of theirs)."""

    joint = back_to_back(runs, arch) if arch is not None else None
    parts = [r.result for r in runs]
    res = merge_results(parts, workload, runs[-1].result.output, notes)
    if joint is not None:
        res = _on_timeline(res, parts, joint)
    starts = joint[3] if joint else None
    spans, offset, seg = [], 0, 0
    for j, r in enumerate(runs):
        if starts is not None:  # moved with the run's first tile on the joint timeline
            offset = starts[j] - min((s.start for s in r.spans), default=0)
        spans += [dataclasses.replace(s, start=s.start + offset, end=s.end + offset,
                                      residency=s.residency + seg) for s in r.spans]
        offset += r.result.cycles
        seg += 1 + max((s.residency for s in r.spans), default=-1)
    bounds = {k: sum(r.bounds[k] for r in runs) for k in runs[0].bounds}
    system = tuple((f"p{j}.{name}", ts) for j, r in enumerate(runs) for name, ts in r.system) \
        if all(r.system for r in runs) else ()
    occupied = tuple(w for r in runs for w in r.occupied) \
        if all(len(r.occupied) == len(r.system) for r in runs) else ()
    slots = tuple(w for r in runs for w in r.slots) \
        if all(len(r.slots) == len(r.system) for r in runs) else ()
    return OrchestratedRun(result=res, outputs=outputs, spans=tuple(spans), bounds=bounds,
                           spec=spec if spec is not None else runs[-1].spec, system=system,
                           occupied=occupied if system else (),
                           slots=slots if system else ())
