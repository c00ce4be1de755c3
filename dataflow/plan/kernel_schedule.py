"""One kernel's generic schedule (`KernelSchedule`) and its application to a kernel: the
transformations of `dataflow.dfg.transform` (and the lane-sum passes of `dfg.block_partials`,
`dfg.lane_select`) in one fixed order (docs/conventions.md#register-blocking). Plain data:
`plan.compile` searches over these, `plan.lane_candidates` proposes some, a frontend plan keeps
the chosen ones and re-applies them to a program lowered again from new values.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataflow.dfg import block_partials, transform
from dataflow.dfg.graph import DFGError, Kernel
from dataflow.dfg.lane_select import lane_select_sums, store_once
from dataflow.dfg.ops import Op


@dataclass(frozen=True)
class KernelSchedule:
    """One kernel's generic transformations: `fuse` each mul into its acc; split the vector
    loop into `vector_blocks` outer blocks (unroll-and-jam)."""

    fuse: bool = False
    vector_blocks: int = 1
    # > 0: the innermost (reduction) loop split by this many lanes and made the vector loop
    reduce_lanes: int = 0
    # > 1: the loop outside the vector loop blocked by this factor, its lane sums merged
    # (`transform.block_lane_sums`, docs/conventions.md#sparse-line-model)
    sum_blocks: int = 1
    # the vector loop made scalar, each lane sum gone (an array without a `vsum` unit:
    # `transform.devectorise_reduction`)
    devectorise: bool = False
    copies: int = 0  # body copies asked of the mapper (`gemm_schedule.best_copies`); 0: its own
    # > 0 (the lanes): the vector blocks are neighbouring vectors, one SPM row apart, not
    # blocks extent / vector_blocks apart, whose rows can share a line
    # (docs/conventions.md#sparse-line-model)
    vector_inner: int = 0
    # the row-blocked SDDMM (`_held_row_candidates`, docs/conventions.md#held-loads): the
    # blocked lane sums added as a tree (`block_lane_sums(tree=True)`); > 0 (the lanes): the
    # loads invariant over the innermost moving loop held (`transform.hold_invariant_loads`);
    # the mapper issues source loads as late as their consumers allow (`late_sources`)
    sum_tree: bool = False
    hold: int = 0
    late_sources: bool = False
    # each lane sum done by lane-selecting multiplies (an array without `vsum`:
    # `lane_select.lane_select_sums`, docs/conventions.md#lane-select-sums)
    lane_select: bool = False

    @property
    def plain(self) -> bool:
        return self == KernelSchedule()

    def label(self) -> str:
        if self.plain:
            return "as lowered"
        parts = ["macc"] if self.fuse else []
        if self.vector_blocks > 1:
            parts.append(f"vector loop in {self.vector_blocks} blocks")
        if self.reduce_lanes:
            parts.append(f"reduction vectorised over {self.reduce_lanes} lanes")
        if self.sum_blocks > 1:
            parts.append(f"lane sums blocked by {self.sum_blocks}"
                         + (" as a tree" if self.sum_tree else ""))
        if self.lane_select:
            parts.append("lane sums as lane-selecting multiplies (no vsum unit)")
        if self.hold:
            parts.append("invariant loads held")
        if self.late_sources:
            parts.append("source loads late")
        if self.devectorise:
            parts.insert(0, "lane sums as scalar accumulation (no vsum unit)")
        if self.copies:
            parts.append(f"{self.copies} copies sharing the PEs")
        return ", ".join(parts)


def apply_kernel_schedule(kernel: Kernel, sched: KernelSchedule) -> Kernel:
    if sched.devectorise:
        kernel = transform.devectorise_reduction(kernel)
    if sched.reduce_lanes:
        kernel = vectorise_innermost(kernel, sched.reduce_lanes)
    if sched.sum_blocks > 1 and not any(n.op is Op.VSUM for n in kernel.nodes):
        # a lane-partials kernel (no lane sum): its accumulations merged
        # (docs/conventions.md#row-blocked-lane-partials)
        kernel = block_partials.block_partial_sums(kernel, kernel.loops[-2].var,
                                                   sched.sum_blocks)
    elif sched.sum_blocks > 1:
        kernel = transform.block_lane_sums(kernel, kernel.loops[-2].var, sched.sum_blocks,
                                           tree=sched.sum_tree)
    if sched.lane_select:  # each result then written once: a store
        kernel = store_once(lane_select_sums(kernel, kernel.vector_extent))
    if sched.fuse:
        kernel = transform.fuse_multiply_accumulate(kernel)
    if sched.vector_blocks > 1 and sched.vector_inner:
        kernel = neighbouring_vector_blocks(kernel, sched.vector_blocks, sched.vector_inner)
    elif sched.vector_blocks > 1:
        kernel = transform.unroll_and_jam(kernel, kernel.vector_var, sched.vector_blocks,
                                          inner=False)
    if sched.hold:
        kernel = transform.hold_invariant_loads(kernel, sched.hold)
    return kernel


def neighbouring_vector_blocks(kernel: Kernel, blocks: int, lanes: int) -> Kernel:
    """The vector loop split into vectors of `lanes` (`split`) and the loop over vectors
    unrolled-and-jammed by `blocks` (inner): one iteration covers `blocks` consecutive vectors,
    consecutive SPM rows on consecutive lines."""
    split = transform.split(kernel, kernel.vector_var, lanes)
    pos = next(i for i, lp in enumerate(split.loops) if lp.var == split.vector_var)
    return transform.unroll_and_jam(split, split.loops[pos - 1].var, blocks, inner=True)


def vectorise_innermost(kernel: Kernel, lanes: int) -> Kernel:
    """A scalar kernel's innermost loop (a reduction) split by `lanes`, its inner half the
    vector loop with a lane sum before each accumulation (`transform.vectorise_reduction`)."""
    var = kernel.loops[-1].var
    split = transform.split(kernel, var, lanes)
    return transform.vectorise_reduction(split, split.loops[-1].var)


def vector_reduction_body(kernel: Kernel, lanes: int) -> tuple[Kernel, int] | None:
    """(the kernel with its reduction over the lanes, the lanes it was vectorised over -- 0
    when it already was a vector kernel); None when a scalar kernel's innermost loop is not a
    dense reduction `lanes` divides."""
    if kernel.vector_var is not None:
        return kernel, 0
    lp = kernel.loops[-1]
    if len(kernel.loops) < 2 or not lp.is_dense or lp.extent % lanes:
        return None
    try:
        return vectorise_innermost(kernel, lanes), lanes
    except DFGError:
        return None
