"""`simulate(mapping) -> SimResult`: the array engine per kernel, then the system model."""

from __future__ import annotations

import dataclasses
from enum import Enum

import numpy as np

from dataflow.dfg.graph import BufferRole
from dataflow.errors import UserError
from dataflow.mapper.mapping import Mapping, SystolicMapping
from dataflow.pe_array.assemble import (  # noqa: F401 (area_breakdown, energy_breakdown: re-exported)
    area_breakdown,
    assemble_result,
    energy_breakdown,
)
from dataflow.pe_array.fast_run import run_kernel_fast
from dataflow.pe_array.result import ArrayResult, KernelResult, Roofline, SimResult, TileResult
from dataflow.pe_array.roofline import kernel_roofline, program_roofline
from dataflow.pe_array.systolic_timing import memory_notes

# Deferred imports (start-up, issue 14): the per-cycle stepper, the systolic engine and its
# SCALE-Sim memory model, and the SimPy system model are imported where a run first needs them
# (a systolic run needs neither the stepper nor SimPy, a fast run on the CGRA neither of the
# systolic modules).


class Engine(str, Enum):
    """Which implementation runs the array: the vectorised one or the per-cycle stepper (held
    to identical results). A str enum: callers may pass the word."""

    FAST = "fast"
    REFERENCE = "reference"

    def __str__(self) -> str:
        return self.value


ENGINES = tuple(e.value for e in Engine)


def run_array(mapping: Mapping, engine: str = "fast", trace: bool = False,
              values: bool = True) -> list[ArrayResult]:
    """Array-level results of every kernel, in program order (outputs feed later kernels).
    `values=False` (systolic kernels only, whose timing does not depend on the values) leaves
    the outputs zero."""
    if engine not in ENGINES:
        raise UserError(f"unknown engine {engine!r}; choose one of {ENGINES}")
    if not values and not all(isinstance(k, SystolicMapping) for k in mapping.kernels):
        raise UserError("timing without values is for systolic arrays only: a reconfigurable "
                        "array's timing follows its values (gathers, merges, tiles)")
    arch, prog = mapping.arch, mapping.program
    dtype = np.dtype(prog.dtype)
    data = dict(prog.input_map)
    results = []
    for km in mapping.kernels:
        if isinstance(km, SystolicMapping):
            from dataflow.pe_array.systolic import run_systolic_fast, run_systolic_reference

            if not values:
                res = run_systolic_fast(km, arch, data, values=False)
            else:
                run = run_systolic_fast if engine == Engine.FAST else run_systolic_reference
                res = run(km, arch, data)
        elif engine == Engine.FAST:
            res = run_kernel_fast(km, arch, data, dtype)
        else:
            from dataflow.pe_array.reference import run_kernel_reference

            res = run_kernel_reference(km, arch, data, dtype, trace=trace)
        data.update(dict(res.outputs))
        results.append(res)
    return results


def _schedule_rows(mapping: Mapping) -> tuple[tuple, ...]:
    rows = []
    for km in mapping.kernels:
        if isinstance(km, SystolicMapping):
            continue
        for p in km.placements:
            rows.append((km.kernel.name, p.copy, p.node, km.kernel.nodes[p.node].op.value,
                         p.pe[0], p.pe[1], p.time, p.latency, km.ii))
    return tuple(rows)


def _system_trace(arrays: list[ArrayResult], timeline) -> tuple:
    """Every kernel's (cycle, PE, op) events on the system clock: an event at array cycle c of
    tile j (array cycles count tile after tile, stalls for DMA excluded) happens at the tile's
    start in the system timeline plus its offset inside the tile."""
    spans = iter(timeline.tile_spans)  # in kernel order, one per tile
    out = []
    for a in arrays:
        starts = [next(spans)[2] for _ in a.tiles]
        if not a.trace:
            continue
        bounds = np.cumsum([0] + [t.compute_cycles for t in a.tiles])
        for cyc, pe, op in a.trace:
            j = min(int(np.searchsorted(bounds, cyc, side="right")) - 1, len(a.tiles) - 1)
            out.append((int(starts[j] + cyc - bounds[j]), pe, op))
    return tuple(sorted(out, key=lambda e: (e[0], e[1])))


def with_reloads(arrays: list[ArrayResult], mapping: Mapping,
                 names: tuple[str, ...]) -> list[ArrayResult]:
    """`arrays` with the outputs named in `names` read back from DRAM before they are written:
    each tile first loads its window of a streamed output, a resident one is loaded whole
    before the first tile. The partial sums of C that a K panel accumulates into
    (docs/conventions.md#tiling-any-problem-size); values are the caller's to combine."""
    wb = mapping.arch.word_bytes
    out = []
    for a, km in zip(arrays, mapping.kernels):
        bufs = [] if isinstance(km, SystolicMapping) else [
            b for b in km.kernel.buffers if b.name in names and b.role == BufferRole.OUTPUT]
        if not bufs:
            out.append(a)
            continue
        tiles: list[TileResult] = []
        for i, t in enumerate(a.tiles):
            reads = []
            for b in bufs:
                if km.allocation_map[b.name].streamed:
                    lo, hi = km.tiles[i].window_map[b.name]
                    words = max(0, hi - lo)
                else:
                    words = b.size if i == 0 else 0
                if words:
                    reads.append((b.name, "read", words * wb))
            tiles.append(dataclasses.replace(
                t, dram_bytes_read=t.dram_bytes_read + sum(r[2] for r in reads),
                dram_transfers=tuple(reads) + t.dram_transfers))
        out.append(dataclasses.replace(a, tiles=tuple(tiles)))
    return out


def _prefetch(mapping: Mapping):
    """`system.prefetch_sets` from the kernels' SPM allocations (None when the arch has
    `dram.prefetch_next_kernel: false`): a kernel occupies up to its highest allocated word, an
    input's first-tile slot is one half of its allocation."""
    from dataflow.pe_array.system import prefetch_sets

    arch = mapping.arch
    if not arch.dram.prefetch_next_kernel:
        return None
    kernels = []
    for km in mapping.kernels:
        allocs = km.allocations
        ends = [max(a.base, a.base_alt or 0) + a.words for a in allocs]
        # an input handed over in the SPM has nothing to load
        ins = [b.name for b in km.kernel.buffers if b.role == BufferRole.INPUT and not b.on_chip]
        outs = [b.name for b in km.kernel.buffers if b.role == BufferRole.OUTPUT]
        slot = {a.buffer: a.words for a in allocs}
        kernels.append((ins, outs, slot, max(ends, default=0)))
    return prefetch_sets(kernels, arch.spm.capacity_words)


def _buffers(mapping: Mapping, prefetch) -> list[int] | None:
    """`system.tile_buffer_counts` from the kernels' SPM allocations (None while
    `dram.tile_buffers` is 2): a slot is one half of each streamed input's allocation; a kernel
    holds up to its highest allocated word plus what the next kernel prefetches beside it."""
    from dataflow.pe_array.system import tile_buffer_counts

    if mapping.arch.dram.tile_buffers <= 2:
        return None
    kernels = []
    for k, km in enumerate(mapping.kernels):
        allocs = km.allocations
        loaded = {b.name for b in km.kernel.buffers if b.role == BufferRole.INPUT and not b.on_chip}
        slot = sum(a.words for a in allocs if a.streamed and a.buffer in loaded)
        taken = max((max(a.base, a.base_alt or 0) + a.words for a in allocs), default=0)
        if prefetch and k + 1 < len(mapping.kernels):
            taken += sum(a.words for a in mapping.kernels[k + 1].allocations
                         if a.buffer in prefetch[k + 1])
        kernels.append((slot, taken))
    return tile_buffer_counts(kernels, mapping.arch)


def simulate_mapping(mapping: Mapping, engine: str = "fast", trace: bool = False,
                     workload: str | None = None, reload: tuple[str, ...] = (),
                     values: bool = True) -> SimResult:
    """Run a mapped program: values and timing. Cycles at the array clock, energy in pJ.
    `reload` names outputs whose earlier contents each tile reads back first (`with_reloads`).
    `values=False`: timing only (systolic arrays, `run_array`); the output is left zero."""
    arch, prog = mapping.arch, mapping.program
    arrays = run_array(mapping, engine, trace, values)
    if reload:
        arrays = with_reloads(arrays, mapping, tuple(reload))
    compute = sum(t.compute_cycles for a in arrays for t in a.tiles)
    spm_stall = sum(t.stall_cycles_spm_conflict for a in arrays for t in a.tiles)
    systolic = any(isinstance(k, SystolicMapping) for k in mapping.kernels)
    notes: tuple[str, ...] = ()
    if systolic:  # SCALE-Sim's SRAMs and DRAM links (dataflow/pe_array/systolic_memory.py)
        from dataflow.pe_array.systolic_memory import run_systolic_system

        timeline, mems = run_systolic_system(list(mapping.kernels), arrays, arch)
        rd = sum(m.dram_words_read for m in mems) * arch.word_bytes
        wr = sum(m.dram_words_written for m in mems) * arch.word_bytes
        notes = memory_notes(mems)
    else:
        from dataflow.pe_array.system import run_system

        prefetch = _prefetch(mapping)
        timeline = run_system([(a.kernel, a.tiles) for a in arrays], arch, prefetch=prefetch,
                              buffers=_buffers(mapping, prefetch))
        rd = sum(t.dram_bytes_read for a in arrays for t in a.tiles)
        wr = sum(t.dram_bytes_written for a in arrays for t in a.tiles)
    cycles = timeline.cycles
    if systolic:
        # SCALE-Sim convention (dataflow/pe_array/systolic.py): compute cycles are the 0-based
        # index of the last cycle; keep the total consistent with it
        compute -= 1
        cycles -= 1
    outputs = {}
    for a in arrays:
        outputs.update(dict(a.outputs))
    (out_name, shape), *_ = prog.outputs
    output = prog.logical_output(out_name, outputs[out_name]).reshape(shape)
    kernels = tuple(
        KernelResult(kernel=a.kernel, start_cycle=s, end_cycle=e,
                     compute_cycles=sum(t.compute_cycles for t in a.tiles),
                     ii=km.ii, mii=getattr(km, "mii", 1), copies=getattr(km, "copies", 1),
                     tiles=a.tiles, roofline=kernel_roofline(prog, arch, i, a))
        for i, (a, km, (s, e)) in enumerate(zip(arrays, mapping.kernels, timeline.kernel_spans)))
    return assemble_result(
        arch, workload=workload or prog.name, engine=engine, counts=array_counts(arrays),
        energy_pj=energy_breakdown(arrays, arch, rd + wr, len(arrays)),
        cycles=cycles, compute_cycles=compute, stall_cycles_spm_conflict=spm_stall,
        stall_cycles_dram=timeline.stall_cycles_dram,
        stall_cycles_reconfiguration=timeline.stall_cycles_reconfiguration,
        stall_cycles_dependency=timeline.stall_cycles_dependency, macs=sum(a.macs for a in arrays),
        dram_bytes_read=rd, dram_bytes_written=wr, kernels=kernels, output=output,
        trace=_system_trace(arrays, timeline) if trace and arrays else None,
        schedule=_schedule_rows(mapping), tile_spans=timeline.tile_spans,
        roofline=program_roofline(prog, arch, arrays), notes=notes,
    )


def array_counts(arrays: list[ArrayResult]) -> dict[str, np.ndarray]:
    """Per-PE busy cycles and per-line SPM reads, writes and conflicts, summed over kernels."""
    return {"pe_busy_cycles": sum(a.pe_busy_cycles for a in arrays),
            "spm_reads_per_line": sum(a.spm_reads_per_line for a in arrays),
            "spm_writes_per_line": sum(a.spm_writes_per_line for a in arrays),
            "spm_conflicts_per_line": sum(a.spm_conflicts_per_line for a in arrays)}


def sequence_results(parts: list[SimResult], workload: str, output, notes=(),
                     mapping_summary: str | None = None) -> SimResult:
    """Runs one after another on the whole array as one result (the two passes of a 2-D FFT,
    the matrices of a batched layer): cycles, stalls, counts, traffic and energy add; kernels
    are shifted onto one time line; the floors add component by component -- a valid floor of
    the sequence, since each run is above its own, which counts the hand-off between runs as
    compulsory traffic (the bound of the sequence as lowered, not of the op in one program).
    What follows from the architecture is the first part's. `notes` are the result's notes;
    `mapping_summary` defaults to the parts' summaries, one per line."""
    if not parts:
        raise UserError("nothing to put in sequence")
    kernels, offset = [], 0
    energy: dict[str, float] = {}
    for r in parts:
        kernels += [dataclasses.replace(k, start_cycle=k.start_cycle + offset,
                                        end_cycle=k.end_cycle + offset) for k in r.kernels]
        offset += r.cycles
        for k, v in r.energy_pj:
            energy[k] = energy.get(k, 0.0) + v

    def total(name):
        return sum(getattr(r, name) for r in parts)

    floors = [r.roofline for r in parts]
    roofline = None if any(f is None for f in floors) else Roofline(*(
        sum(getattr(f, name) for f in floors)
        for name in ("compute_cycles", "dram_cycles", "spm_port_cycles")))
    return dataclasses.replace(
        parts[0], workload=workload, cycles=total("cycles"),
        compute_cycles=total("compute_cycles"),
        stall_cycles_spm_conflict=total("stall_cycles_spm_conflict"),
        stall_cycles_dram=total("stall_cycles_dram"),
        stall_cycles_reconfiguration=total("stall_cycles_reconfiguration"),
        stall_cycles_dependency=total("stall_cycles_dependency"),
        macs=total("macs"), pe_busy_cycles=total("pe_busy_cycles"),
        spm_reads_per_line=total("spm_reads_per_line"),
        spm_writes_per_line=total("spm_writes_per_line"),
        spm_conflicts_per_line=total("spm_conflicts_per_line"),
        dram_bytes_read=total("dram_bytes_read"), dram_bytes_written=total("dram_bytes_written"),
        energy_pj=tuple(energy.items()), kernels=tuple(kernels), output=output,
        notes=tuple(notes), roofline=roofline, values_match_reference=None,
        max_abs_error=None, wall_seconds=None,
        mapping_summary=("\n".join(r.mapping_summary for r in parts)
                         if mapping_summary is None else mapping_summary))
