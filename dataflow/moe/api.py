"""`simulate_moe`: a mixture-of-experts layer on the array, and the `moe` workload.

Three placements of the experts:
- `grouped` (default; `dataflow.moe.grouped`): one program on the whole array, gate -> one
  kernel for all experts (the tokens gathered by row, each expert's rows a sparse loop over the
  dispatch order, its weights streamed tile by tile) -> combine: no dispatch kernel, one
  reconfiguration and one DMA prologue for all experts instead of one per expert; the
  experts' output handed to the combine in the SPM where it fits (`compile_grouped`).
- `parallel`: the array is cut into one region per expert (PE rows/columns and SPM
  lines split evenly; each region gets 1/E of the DRAM bandwidth, a fair share of the one
  interface -- contention beyond that share is not modelled). Gate and dispatch run on the
  whole array, then every expert runs at once in its region, and combine starts when the
  busiest expert is done: total = front + max over experts + combine, so load imbalance costs
  time exactly as in expert-parallel serving.
- `sequential`: one program on the whole array, the experts one after another; the imbalance
  shows as one long kernel, the total is their sum.

`SimResult.kernels` holds one `KernelResult` per kernel (gate, dispatch, expert{e}, combine;
grouped: gate, experts, combine) with start and end cycles on the layer's timeline;
`dataflow.moe.timeline.draw_timeline` draws them.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from dataflow.arch import resolve_arch
from dataflow.errors import UserError
from dataflow.moe.gating import (
    check_moe_params,
    gate_logits,
    make_moe_operands,
    moe_reference,
    route,
)
from dataflow.moe.grouped import compile_grouped
from dataflow.moe.lower import combine_program, expert_program, front_program, sequential_program
from dataflow.moe.split import split_moe
from dataflow.pe_array.roofline import program_roofline
from dataflow.pe_array.simulate import assemble_result, simulate_mapping
from dataflow.plan.compile import compile_program
from dataflow.workloads import Param, Workload, dense_bytes, finish, register

PLACEMENTS = ("grouped", "parallel", "sequential")


def region_grid(arch, parts: int) -> tuple[int, int]:
    """(region rows, region cols) splitting the PE array into `parts` equal rectangles (as
    square as possible) and the SPM lines evenly; ValueError when it cannot."""
    rows, cols, lines = arch.pe_array.rows, arch.pe_array.cols, arch.spm.lines
    best = None
    for gr in range(1, parts + 1):
        if parts % gr or rows % gr or cols % (parts // gr):
            continue
        gc = parts // gr
        shape = abs(rows // gr - cols // gc)
        if best is None or shape < best[0]:
            best = (shape, gr, gc)
    if best is None or lines % parts:
        raise UserError(f"--placement parallel needs --experts ({parts}) to split the "
                         f"{rows}x{cols} PE array and its {lines} SPM lines evenly; "
                         "use --placement sequential")
    return best[1], best[2]


def region_arch(arch, parts: int):
    """One of `parts` equal regions of `arch` (see `region_grid`)."""
    gr, gc = region_grid(arch, parts)
    pe = dataclasses.replace(arch.pe_array, rows=arch.pe_array.rows // gr,
                             cols=arch.pe_array.cols // gc)
    spm = dataclasses.replace(arch.spm, lines=arch.spm.lines // parts)
    dram = dataclasses.replace(arch.dram, bytes_per_cycle=arch.dram.bytes_per_cycle / parts)
    return dataclasses.replace(arch, name=f"{arch.name}/region{pe.rows}x{pe.cols}", pe_array=pe,
                               spm=spm, dram=dram)


def _run(prog, arch, engine, name):
    mapping = compile_program(prog, arch)
    return simulate_mapping(mapping, engine=engine, workload=name), mapping


def _shift(kernels, offset: int):
    return tuple(dataclasses.replace(k, start_cycle=k.start_cycle + offset,
                                     end_cycle=k.end_cycle + offset)
                 for k in kernels)


def _compose_parallel(arch, parts_total: int, front, experts, combine, output, summaries):
    """One SimResult for front -> experts side by side -> combine (see the module docstring)."""

    gr, gc = region_grid(arch, parts_total)
    t_front = front.cycles
    t_experts = max((r.cycles for _, r in experts), default=0)
    crit = max(experts, key=lambda er: er[1].cycles)[1] if experts else None
    busy = front.pe_busy_cycles + combine.pe_busy_cycles
    rd = front.spm_reads_per_line + combine.spm_reads_per_line
    wr = front.spm_writes_per_line + combine.spm_writes_per_line
    cf = front.spm_conflicts_per_line + combine.spm_conflicts_per_line
    energy: dict[str, float] = {}
    kernels = list(front.kernels)
    parts = [front, combine]
    for e, r in sorted(experts):
        slot = e
        rr, cc = divmod(slot, gc)
        h, w = r.pe_busy_cycles.shape
        busy[rr * h:(rr + 1) * h, cc * w:(cc + 1) * w] += r.pe_busy_cycles
        lines = len(r.spm_reads_per_line)
        sl = slice(slot * lines, (slot + 1) * lines)
        rd[sl] += r.spm_reads_per_line
        wr[sl] += r.spm_writes_per_line
        cf[sl] += r.spm_conflicts_per_line
        kernels += _shift(r.kernels, t_front)
        parts.append(r)
    kernels += _shift(combine.kernels, t_front + t_experts)
    for p in parts:
        for k, v in p.energy_pj:
            energy[k] = energy.get(k, 0.0) + v
    on_path = [front, combine] + ([crit] if crit is not None else [])
    return assemble_result(
        arch, workload="moe", engine=front.engine,
        counts={"pe_busy_cycles": busy, "spm_reads_per_line": rd, "spm_writes_per_line": wr,
                "spm_conflicts_per_line": cf},
        energy_pj=energy, cycles=t_front + t_experts + combine.cycles,
        compute_cycles=sum(p.compute_cycles for p in on_path),
        stall_cycles_spm_conflict=sum(p.stall_cycles_spm_conflict for p in on_path),
        stall_cycles_dram=sum(p.stall_cycles_dram for p in on_path),
        stall_cycles_reconfiguration=sum(p.stall_cycles_reconfiguration for p in on_path),
        stall_cycles_dependency=sum(p.stall_cycles_dependency for p in on_path),
        macs=sum(p.macs for p in parts), dram_bytes_read=sum(p.dram_bytes_read for p in parts),
        dram_bytes_written=sum(p.dram_bytes_written for p in parts), kernels=tuple(kernels),
        output=output, mapping_summary="\n".join(summaries),
        notes=((f"experts side by side in {gr}x{gc} regions of "
                f"{arch.pe_array.rows // gr}x{arch.pe_array.cols // gc} PEs; compute and stall "
                "cycles are those on the critical path (front, busiest expert, combine)"),))


def simulate_moe(x, wg, bias, w, top_k: int, arch=None, *, engine: str = "fast",
                 placement: str = "grouped", on_chip: bool = True):
    """Simulate the layer Y = combine(gate, experts(dispatch(X))); returns (SimResult, Routing).
    `on_chip` (grouped): the experts' output handed to the combine in the SPM where it fits
    (`grouped.compile_grouped`).

    `x` tokens x dim, `wg` dim x experts, `bias` (experts,), `w` experts x dim x hidden. Values
    are checked against `moe_reference` (numpy, float64)."""

    if placement not in PLACEMENTS:
        raise UserError(f"--placement must be one of {PLACEMENTS}, got {placement!r}")
    x, wg, w = (np.asarray(v, dtype=np.float32) for v in (x, wg, w))
    (tokens, dim), (experts, dim2, hidden) = x.shape, w.shape
    if dim2 != dim or wg.shape != (dim, experts) or np.shape(bias) != (experts,):
        raise UserError(f"moe operands disagree: X {x.shape}, Wg {wg.shape}, "
                        f"bias {np.shape(bias)}, W {w.shape} "
                        f"(want dim x experts, experts, experts x dim x hidden)")
    check_moe_params(experts, top_k, tokens, dim, hidden)
    t0 = time.perf_counter()
    spec = resolve_arch(arch)
    routing = route(gate_logits(x, wg, bias), top_k)
    reference = moe_reference(x, wg, bias, w, top_k)
    if placement == "grouped":
        grouped = compile_grouped(x, wg, w, routing, spec,
                                  lambda m: simulate_mapping(m, engine=engine, workload="moe"),
                                  on_chip=on_chip)
        res, mapping = grouped.result, grouped.mapping
        if grouped.note:
            res = dataclasses.replace(res, notes=res.notes + (grouped.note,))
    if placement in ("sequential", "grouped"):
        if placement == "sequential":
            res, mapping = _run(sequential_program(x, wg, w, routing), spec, engine, "moe")
        if placement == "grouped":  # the layer's floors, as for the other placements
            res = dataclasses.replace(res, roofline=program_roofline(
                sequential_program(x, wg, w, routing), spec, []))
        res = finish(res, reference, t0, mapping)
    else:
        region = region_arch(spec, experts)
        front, fmap = _run(front_program(x, wg, routing), spec, engine, "moe")
        xd = front.output
        summaries = [fmap.summary()]
        results, outs = [], np.zeros((len(routing.token_of_row), hidden), dtype=np.float32)
        for e in range(experts):
            lo, hi = routing.offsets[e], routing.offsets[e + 1]
            if hi == lo:
                continue
            r, m = _run(expert_program(e, xd[lo:hi], w[e]), region, engine, "moe")
            results.append((e, r))
            outs[lo:hi] = r.output
            summaries.append(m.summary())
        combine, cmap = _run(combine_program(outs, routing, tokens), spec, engine, "moe")
        summaries.append(cmap.summary())
        res = _compose_parallel(spec, experts, front, results, combine, combine.output, summaries)
        # the layer's floors are those of the whole layer as one program: the regions split the
        # peak and the DRAM bandwidth, so side by side cannot beat them
        res = dataclasses.replace(res, roofline=program_roofline(
            sequential_program(x, wg, w, routing), spec, []))
        res = finish(res, reference, t0)
    n = routing.tokens_per_expert
    busiest = int(np.argmax(n))
    note = (f"tokens per expert {n.tolist()}; busiest expert{busiest} with {int(n[busiest])} "
            f"rows, {n.max() / n.mean():.2f}x the mean")
    return dataclasses.replace(res, notes=res.notes + (note,)), routing


def _run_moe(spec, *, engine="fast", seed=0, trace=False, experts=8, top_k=2, tokens=64, dim=64,
             hidden=64, skew=0.0, placement="grouped"):
    check_moe_params(experts, top_k, tokens, dim, hidden)
    x, wg, bias, w = make_moe_operands(experts, tokens, dim, hidden, skew, seed)
    held = 2 * dense_bytes((tokens, dim), (dim, experts), (experts, dim, hidden),
                           (tokens, experts, dim + hidden), (tokens, hidden))
    split = split_moe(spec, x, wg, bias, w, top_k, engine=engine, placement=placement,
                      operand_bytes=held, simulate=simulate_moe)
    if split is not None:  # too many tokens for the SPM or the host: token blocks
        return split
    res, _ = simulate_moe(x, wg, bias, w, top_k, spec, engine=engine, placement=placement)
    return res


def register_workloads() -> None:
    register(Workload("moe", _run_moe, (
        Param("experts", int, 8, "experts (moe)"),
        Param("top_k", int, 2, "experts per token, <= --experts (moe)"),
        Param("tokens", int, 64, "tokens (rows of X)"),
        Param("dim", int, 64, "model width (columns of X)"),
        Param("hidden", int, 64, "output width of each expert / the FFN's hidden width"),
        Param("skew", float, 0.0,
              "gate bias -skew * e: > 0 sends more tokens to low experts (moe)"),
        Param("placement", str, "grouped", "experts as one grouped kernel, side by side in "
              "array regions, or one after another (moe)", choices=PLACEMENTS),
    ), "mixture of experts: top-k gating, dispatch, per-expert GEMMs, combine"))
