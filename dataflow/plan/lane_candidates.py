"""Candidate schedules for a lane-sum reduction on an array without `vsum` (the MLX preset),
for `dataflow.plan.compile.kernel_candidates`: the row-blocked SDDMM with lane-select sums
(docs/conventions.md#lane-select-sums) and the lane partials' vector kernel blocked by rows
(docs/conventions.md#row-blocked-lane-partials)."""

from __future__ import annotations

import dataclasses

from dataflow.arch.spec import ArchSpec
from dataflow.dfg import block_partials
from dataflow.dfg.graph import DFGError, Kernel
from dataflow.dfg.ops import Op
from dataflow.plan.gemm_schedule import supports
from dataflow.plan.kernel_schedule import (
    KernelSchedule,
    apply_kernel_schedule,
    vector_reduction_body,
)

#: copies asked of the mapper for a row-blocked lane-partials body, besides its own choice
PARTIAL_ROW_COPIES = (2, 3, 4)


def _partial_row_candidates(kernel: Kernel, arch: ArchSpec) -> list:
    """The lane-partials kernel of an SDDMM (an array without `vsum`,
    docs/conventions.md#row-blocked-lane-partials) blocked by rows as `_held_row_candidates`
    blocks one with lane sums: every chunk of the reduction in one body
    (`block_partials.block_partial_sums`), the row of A held, source loads late. The body (29
    nodes at k = 64) fits the PEs' issue slots, not one node a PE: the mapper's own copies and
    a few more sharing the PEs at a longer II."""
    slots = arch.pe_array.num_pes * arch.pe_array.issue_width
    # the partials exist only without `vsum`; a long chunk loop makes a body past the slots
    if supports(arch, "vsum") or not block_partials.applies(kernel) \
            or 3 * kernel.loops[-2].extent > slots:
        return []
    outer, lanes = kernel.loops[-2], arch.pe_array.simd_lanes
    sched = KernelSchedule(sum_blocks=outer.extent, sum_tree=True, hold=lanes,
                           late_sources=True)
    return _held_with_copies(kernel, sched, slots)


def lane_select_candidates(kernel: Kernel, arch: ArchSpec) -> list:
    """On an array without `vsum`: the row-blocked SDDMM (`_held_row_candidates`, a tree)
    with each lane sum done by lane-selecting multiplies (docs/conventions.md#lane-select-sums),
    one kernel instead of the lane partials' two; the mapper's own copies and a few more
    sharing the PEs. A scalar reduction is vectorised first; [] where it does not apply."""
    if supports(arch, "vsum") or not supports(arch, "mul"):
        return []
    lanes = arch.pe_array.simd_lanes
    got = vector_reduction_body(kernel, lanes)
    if got is None:
        return []
    body, base = got
    if body.vector_var is None or body.loops[-1].var != body.vector_var \
            or body.vector_extent != lanes or len(body.loops) < 2 \
            or not any(n.op is Op.VSUM for n in body.nodes):
        return []
    outer = body.loops[-2]
    slots = arch.pe_array.num_pes * arch.pe_array.issue_width
    if not outer.is_dense or outer.extent < 2 or 3 * outer.extent > slots:
        return []
    sched = KernelSchedule(reduce_lanes=base, sum_blocks=outer.extent, sum_tree=True,
                           hold=lanes, late_sources=True, lane_select=True)
    return _held_with_copies(kernel, sched, slots)


def _held_with_copies(kernel: Kernel, sched: KernelSchedule, slots: int) -> list:
    """`sched` and its twins at `PARTIAL_ROW_COPIES` copies, where it applies to `kernel`,
    leaves a load held and its body fits the PEs' `slots` issue slots; [] otherwise."""
    try:
        body = apply_kernel_schedule(kernel, sched)
    except DFGError:
        return []
    if not any(n.hold for n in body.nodes) or len(body.nodes) > slots:
        return []
    return [sched, *(dataclasses.replace(sched, copies=c) for c in PARTIAL_ROW_COPIES)]


__all__ = ["PARTIAL_ROW_COPIES", "lane_select_candidates"]
