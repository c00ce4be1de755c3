"""The compiler's schedule choice: transformations (`dataflow.dfg.transform`) applied to a program
before it is mapped, picked per program and architecture by mapping the candidates and measuring
them (docs/conventions.md#register-blocking). The workloads call `compile_program` where they
would call the mapper.

- A dense GEMM is register-blocked (`gemm_schedule.compile_gemm`): an outer product per body,
  A and B packed as BLIS packs them.
- Every other kernel on a reconfigurable array gets the generic candidates
  (`kernel_candidates`): as lowered; each `mul` fused into the `acc` it feeds (`macc`); and,
  fused, its vector loop unrolled-and-jammed into 2, 4 or 8 blocks, so the values that do not
  depend on the vector loop (a CSR row's value and column index, a gate, a softmax weight) are
  loaded once for every block. These need no layout change, so they apply to any format the
  frontend lowers.
- An array without `vsum` also gets the row-blocked SDDMM with lane-select sums, compiled as
  one kernel (docs/conventions.md#lane-select-sums), and lane partials blocked by rows.
- Each non-plain candidate then gets the line-aware post-passes (`dataflow.plan.retime`).
- A kernel whose inputs are all the program's (the first kernel, and any later one that reads
  no earlier kernel's output) is scored by the fast engine on its first tile; the others
  (whose inputs an earlier kernel makes) by the mapper's steady state, iterations x II / copies.
  The plain kernel is always a candidate, so the choice never loses to it on what is measured.

The chosen `ProgramSchedule` is plain data: a frontend plan keeps it and `apply_schedule`
re-applies it to a program lowered again from new values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dataflow.arch.spec import ArchSpec, PEKind
from dataflow.dfg import transform
from dataflow.dfg.graph import DFGError, Kernel, Program
from dataflow.dfg.lane_partials import applies as lane_partials_apply
from dataflow.dfg.lane_partials import lane_partial_sums
from dataflow.dfg.lower import gemm_kernel
from dataflow.dfg.nonzero_unroll import unroll_nonzeros
from dataflow.dfg.ops import Op
from dataflow.dfg.row_max import has_accmax, lower_row_max
from dataflow.mapper import map_program
from dataflow.mapper.bounds import issue_copies, unit_busy
from dataflow.mapper.legality import check_mapping
from dataflow.mapper.map import map_kernel
from dataflow.mapper.mapping import KernelMapping, Mapping, MappingError
from dataflow.plan import gather_lines, gather_pads, nonzero_choice, tile_ramp
from dataflow.plan.gemm_schedule import (
    GemmSchedule,
    apply_gemm_schedule,
    best_copies,
    compile_gemm,
    supports,
)
from dataflow.plan.kernel_schedule import (
    KernelSchedule,
    apply_kernel_schedule,
    vector_reduction_body,
)
from dataflow.plan.lane_candidates import _partial_row_candidates, lane_select_candidates
from dataflow.plan.retime import (
    best_candidate,
    choice_key,
    choose_memoised,
    cycles_bound,
    kernel_iterations,
    line_copies,
    post_passes,
    sample_cycles,
)

#: vector blocks tried for a generic kernel's vector loop
VECTOR_BLOCKS = (2, 4, 8)
#: blocking factors tried for a lane-sum reduction's chunk loop
SUM_BLOCKS = (2, 4, 8, 16)


@dataclass(frozen=True)
class ProgramSchedule:
    """What the compiler chose for a program: a GEMM blocking, or one `KernelSchedule` per
    kernel."""

    gemm: GemmSchedule | None = None
    kernels: tuple[KernelSchedule, ...] = ()
    # each accmax kernel replaced by max doublings first (an array without an `accmax` unit:
    # `row_max.lower_row_max`, docs/conventions.md#row-maximum-without-accmax); `kernels`
    # are then the new program's
    row_max: bool = False
    # each lane-sum reduction split into a vector kernel into lane partials and a lane-sum
    # kernel (an array without `vsum`: `lane_partials.lane_partial_sums`,
    # docs/conventions.md#lane-partial-sums); applied after `row_max`
    lane_partials: bool = False
    # (buffer, pad words): gathered rows stored at a pitch that starts them on any line
    # (`gather_pads.gather_pads`, docs/conventions.md#gather-lines)
    pads: tuple[tuple[str, int], ...] = ()
    # each row-maximum kernel folded into the kernel before it, after the kernel schedules
    # (`transform.fuse_row_max`, docs/conventions.md#attention-fold)
    row_max_fused: bool = False
    # the CSR nonzero loop unrolled by this factor over rows padded to its multiples, first
    # (`dfg.nonzero_unroll`, docs/conventions.md#nonzero-unroll); 0: as lowered
    nonzero_unroll: int = 0
    # its u terms summed by a tree of adds into one acc (else u accumulations)
    nonzero_tree: bool = False

    @property
    def plain(self) -> bool:
        return ((self.gemm is None or self.gemm.plain) and all(k.plain for k in self.kernels)
                and not self.row_max and not self.lane_partials and not self.pads
                and not self.row_max_fused and not self.nonzero_unroll)


def _fusable(kernel: Kernel) -> bool:
    return any(n.op is Op.ACC and kernel.nodes[n.inputs[0]].op is Op.MUL for n in kernel.nodes)


def _lane_sum_candidates(kernel: Kernel, arch: ArchSpec) -> list[KernelSchedule]:
    """A reduction vectorised over the lanes (a scalar kernel whose innermost loop is one),
    and its lane sums blocked by 2..16 where the loop outside the vector loop divides and the
    body fits the PEs (docs/conventions.md#sparse-line-model)."""
    if not (supports(arch, "vsum") and supports(arch, "mac")):
        return []
    lanes = arch.pe_array.simd_lanes
    got = vector_reduction_body(kernel, lanes)
    if got is None:
        return []
    body, base = got
    out = [KernelSchedule(reduce_lanes=base)] if base else []
    if body.loops[-1].var != body.vector_var or len(body.loops) < 2 \
            or not any(n.op is Op.VSUM for n in body.nodes):
        return out
    outer = body.loops[-2]
    for f in SUM_BLOCKS:
        if not outer.is_dense or outer.extent % f:
            continue
        try:
            blocked = transform.block_lane_sums(body, outer.var, f)
        except DFGError:
            continue
        if len(blocked.nodes) <= arch.pe_array.num_pes:
            out.append(KernelSchedule(reduce_lanes=base, sum_blocks=f))
    return out + _held_row_candidates(body, base, arch)


def _held_row_candidates(body: Kernel, base: int, arch: ArchSpec) -> list[KernelSchedule]:
    """The SDDMM blocked by rows (docs/conventions.md#held-loads): every chunk of the
    reduction in one body (`block_lane_sums` by the whole chunk loop, chained or as a tree),
    so the loop over a row's nonzeros is innermost and the row of A, invariant over it, is
    held -- one read of it serves all the row's outputs on a copy, and the SPM ports serve the
    gathers -- with source loads issued late (`map_kernel(late_sources=True)`). Where the
    body fits the PEs."""
    outer = body.loops[-2]
    if not outer.is_dense or outer.extent < 2:
        return []
    lanes, pes = arch.pe_array.simd_lanes, arch.pe_array.num_pes
    out = []
    for tree in (False, True):
        sched = KernelSchedule(reduce_lanes=base, sum_blocks=outer.extent, sum_tree=tree,
                               hold=lanes, late_sources=True)
        if supports(arch, "macc"):  # the mask value times the sum into C: one macc
            sched = dataclasses.replace(sched, fuse=True)
        try:
            blocked = apply_kernel_schedule(body, dataclasses.replace(sched, reduce_lanes=0))
        except DFGError:
            continue
        nodes = len(blocked.nodes)
        if not any(n.hold for n in blocked.nodes) or nodes > pes:
            continue
        out.append(sched)
        # twice the copies at II 2: a body as large as half the array seldom routes two
        # copies at II 1 (every PE busy, every link taken), four at II 2 leave slack
        if 2 * pes // nodes > pes // nodes:
            out.append(dataclasses.replace(sched, copies=2 * pes // nodes))
    return out


def kernel_candidates(kernel: Kernel, arch: ArchSpec) -> list[KernelSchedule]:
    """The generic schedules `kernel` admits on `arch`, the plain one first (see the module
    docstring): fusing needs a mul feeding an acc and a unit that runs macc; a vector split
    needs the vector loop's vectors to divide evenly and the body to fit the PEs; a lane-sum
    reduction may be vectorised and blocked (`_lane_sum_candidates`). Every one but the plain
    one holds the loads it leaves invariant over the innermost moving loop, and the plain one
    gets a held twin (docs/conventions.md#held-loads): a held load only reads less."""
    out = _unheld_candidates(kernel, arch)
    lanes = arch.pe_array.simd_lanes
    held = []
    for c in out:
        h = c if c.hold else dataclasses.replace(c, hold=lanes)
        try:
            holds = h is not c and any(n.hold for n in apply_kernel_schedule(kernel, h).nodes)
        except DFGError:
            holds = False
        held.append(h if holds else c)
    return list(dict.fromkeys([out[0], *held]))


def _unheld_candidates(kernel: Kernel, arch: ArchSpec) -> list[KernelSchedule]:
    """`kernel_candidates` before loads are held."""
    base = KernelSchedule()
    select = lane_select_candidates(kernel, arch)  # of the kernel as it is, lane sums and all
    if any(n.op is Op.VSUM for n in kernel.nodes) and not supports(arch, "vsum"):
        base = KernelSchedule(devectorise=True)
        kernel = transform.devectorise_reduction(kernel)
    out = [base, *_lane_sum_candidates(kernel, arch), *_partial_row_candidates(kernel, arch),
           *select]
    # a nonzero-unrolled body (lane-selecting gathers, docs/conventions.md#nonzero-unroll)
    # has its products summed before the acc: nothing fuses, the vector blocks still pay
    unrolled = any(n.op is Op.GATHER and n.lane for n in kernel.nodes)
    if not ((_fusable(kernel) or unrolled) and supports(arch, "macc")):
        return out
    out.append(dataclasses.replace(base, fuse=True))
    lanes = arch.pe_array.simd_lanes
    vv = kernel.vector_var
    if vv is None or any(lp.parent == vv for lp in kernel.loops):
        return out
    extent = kernel.vector_extent
    vectors = extent // lanes if extent % lanes == 0 else 0
    fused = transform.fuse_multiply_accumulate(kernel)
    pes = arch.pe_array.num_pes
    for s in (1, *VECTOR_BLOCKS):
        if s > 1 and (not vectors or vectors % s):
            continue
        body = transform.unroll_and_jam(fused, vv, s, inner=False) if s > 1 else fused
        # blocks more than a row apart land on lines that repeat: neighbouring blocks
        inner = lanes if s > 1 and vectors != s else 0
        # the PEs issue pes x issue_width ops a cycle (docs/architecture.md#issue-width)
        slots = pes * arch.pe_array.issue_width
        if s > 1 and len(body.nodes) <= slots:
            out.append(KernelSchedule(fuse=True, vector_blocks=s, vector_inner=inner))
        # more copies than the PEs hold at II 1, sharing them at a longer II (as a GEMM block)
        # the products (an unrolled body's are muls summed before its acc)
        maccs = sum(1 for n in body.nodes if n.op is Op.MACC) or sum(
            1 for n in body.nodes if n.op.multiplies)
        reads = sum(1 for n in body.nodes if n.op.reads_spm and not n.op.accumulates)
        copies, ii = best_copies(len(body.nodes), maccs, reads, arch,
                                 tuple(unit_busy(body, arch).values()))
        if ii > 1 and copies > issue_copies(body, arch) and copies * len(body.nodes) > slots:
            out.append(KernelSchedule(fuse=True, vector_blocks=s, copies=copies,
                                      vector_inner=inner))
    return out


def _timing_from_inputs(program: Program, kernel: Kernel) -> bool:
    """Whether the first tile's timing of `kernel` can be measured before the kernels that
    feed it run: timing depends on addresses only, so on values only through the indices of
    its indirect accesses -- measurable when each index is loaded from a program input (the
    attention's PV product gathers V through the mask's columns, whatever P holds)."""
    inputs = {**program.input_map, **dict(program.known)}
    for n in kernel.nodes:
        if n.addr is not None and n.addr.index_stride:
            src = kernel.nodes[n.inputs[0]]
            if src.op is not Op.LOAD or src.buffer not in inputs:
                return False
    return True


def _evaluate(program: Program, index: int, sched: KernelSchedule, arch: ArchSpec,
              options: dict, skew: bool | None = None):
    """(cycles, mapping) of kernel `index` under `sched`: measured on the first tile for the
    first kernel (its inputs are the program's), the mapper's steady state for the others;
    None when it does not map. `skew` as `retime.post_passes` (a recorded choice: nothing is
    measured)."""
    body = apply_kernel_schedule(program.kernels[index], sched)
    if sched.copies:
        options = {**options, "copies": sched.copies}
    if sched.late_sources:
        options = {**options, "late_sources": True}
    try:
        km = map_kernel(body, arch, **options)
    except MappingError:
        if sched.plain or sched == KernelSchedule(devectorise=True):
            raise
        return None
    n = kernel_iterations(body, arch.pe_array.simd_lanes if body.vector_var else 1)
    first = skew is None and _measurable(program, body, index)
    if not sched.plain:
        per, km = post_passes(km, arch, program, skew if first or skew is not None else "lines")
    elif first:  # the plain kernel as mapped, or delayed by the line-aware table if faster
        per, km = min(((sample_cycles(v, arch, program), v)
                       for v in dict.fromkeys((km, line_copies(km, arch)))), key=lambda x: x[0])
    elif skew != False:  # noqa: E712 (False: a recorded choice of no delay)
        km = line_copies(km, arch)
    if first:
        return per * n, km
    return n * km.ii / km.copies, km


def _measurable(program: Program, kernel: Kernel, index: int) -> bool:
    """Whether kernel `index` is measured on its own first tile: the first kernel, or one
    whose timing does not depend on values an earlier kernel makes (`_timing_from_inputs`)."""
    return index == 0 or _timing_from_inputs(program, kernel)


def _choose_kernel(program: Program, index: int, arch: ArchSpec,
                   options: dict) -> tuple[KernelMapping, KernelSchedule]:
    """The best generic schedule for kernel `index` of `program`, mapped and post-passed
    (branch and bound over the candidates, `retime.best_candidate`)."""
    kernel = program.kernels[index]
    cands = kernel_candidates(kernel, arch)
    if not _measurable(program, kernel, index):
        # a kernel fed by an earlier one is ranked by its steady state (iterations x II /
        # copies), which sees no SPM conflicts: copies sharing PEs at a longer II look better
        # than they run (an attention SpMM: 16 copies at II 3 against 5 at II 1, twice as
        # slow), so only kernels measured on their first tile try them
        cands = [c for c in cands if not c.copies] or cands
    if len(cands) == 1:  # no search: the line-aware table's delays, unmeasured
        km = map_kernel(apply_kernel_schedule(kernel, cands[0]), arch, **options)
        return line_copies(km, arch), cands[0]
    def search():
        bodies = {c: apply_kernel_schedule(kernel, c) for c in cands}
        # the shared-PE schedules a search of their own, as `compile_gemm`'s
        found, evaluated = [], 0
        for family in ([c for c in cands if not c.copies], [c for c in cands if c.copies]):
            got = best_candidate(
                family, lambda c: cycles_bound(bodies[c], arch, c.copies or None),
                lambda c: _evaluate(program, index, c, arch, options)) if family else None
            if got is not None:
                found.append(got[:3])
                evaluated += got[3]
        _, sched, km = min(found, key=lambda f: f[0])
        return sched, km, evaluated

    sched, km, evaluated = choose_memoised(
        choice_key(kernel, arch, f"kernel {index} {options}"), KernelSchedule,
        lambda c: apply_kernel_schedule(kernel, c),
        lambda c, skew: _evaluate(program, index, c, arch, options, skew=skew)[1], search)
    how = ("chosen earlier for this kernel and array" if evaluated is None
           else f"best of {evaluated} mapped, of {len(cands)}")
    if not sched.plain:
        km = dataclasses.replace(km, notes=(*km.notes, f"schedule: {sched.label()} ({how})"))
    return km, sched


def _compile_kernels(program: Program, arch: ArchSpec,
                     options: dict) -> tuple[Mapping, ProgramSchedule]:
    program.verify()
    pads = gather_pads.gather_pads(program, arch)
    program = gather_pads.apply_pads(program, pads)
    chosen = [_choose_kernel(program, i, arch, options) for i in range(len(program.kernels))]
    scheds = tuple(s for _, s in chosen)
    prog = apply_schedule(program, ProgramSchedule(kernels=scheds), arch)
    kms = [km for km, _ in chosen]
    fused = _fuse_row_max(prog, kms, scheds, arch, options)
    if fused is not None:
        prog, kms = fused
    # first and last tiles cut smaller, before the line order that walks the tiles
    # (docs/conventions.md#ramped-tiles)
    kms = tuple(tile_ramp.ramp_tiles(km, arch, (lambda km=km: sample_cycles(km, arch, prog))
                                     if _measurable(prog, km.kernel, i) else None,
                                     head=i == 0 or not arch.dram.prefetch_next_kernel,
                                     tail=i == len(kms) - 1)
                for i, km in enumerate(kms))
    mapping = Mapping(program=prog, arch=arch, kernels=kms)
    check_mapping(mapping)
    # a static sparse operand's nonzeros in the line-aware order (docs/conventions.md#gather-lines)
    return gather_lines.line_order(mapping), ProgramSchedule(kernels=scheds, pads=pads,
                                                              row_max_fused=fused is not None)


def _fuse_row_max(prog: Program, kms: list, scheds: tuple, arch: ArchSpec,
                  options: dict) -> tuple[Program, list] | None:
    """(`prog` with its row-maximum kernels folded into the kernels before them, their
    mappings) where that maps at no lower throughput (docs/conventions.md#attention-fold),
    else None. The folded kernel is mapped with its own schedule's mapper options."""
    fused = transform.fuse_row_max(prog, arch.pe_array.simd_lanes)
    if fused is prog:
        return None
    old = {k.name: (k, km, s) for k, km, s in zip(prog.kernels, kms, scheds)}
    out = []
    for index, kern in enumerate(fused.kernels):
        k, km, s = old[kern.name]
        if kern is k:
            out.append(km)
            continue
        mapper = KernelSchedule(copies=s.copies, late_sources=s.late_sources, hold=s.hold)
        got = _evaluate(fused, index, mapper, arch, options) if not mapper.plain else None
        if got is None or got[1].copies * km.ii < km.copies * got[1].ii:
            return None
        out.append(dataclasses.replace(got[1], notes=(*km.notes, "row maximum folded in")))
    return fused, out


def _blockable(program: Program, arch: ArchSpec) -> bool:
    """One dense GEMM exactly as `lower_gemm` makes it (row-major A and B, no padding)."""
    g = program.gemm
    if g is None or len(program.kernels) != 1 or g.a_addresses is not None:
        return False
    return str(program.kernels[0]) == str(gemm_kernel(g.m, g.k, g.n))


def choose_schedule(program: Program, arch: ArchSpec, dataflow: str | None = None,
                    **options) -> tuple[Mapping, ProgramSchedule | None]:
    """Choose a schedule for `program` on `arch` and map it: (the mapping of the transformed
    program, the schedule to re-apply to a program lowered again from new values; None when
    the program runs as lowered). Systolic arrays and staged transforms (a butterfly, which
    `dataflow.plan.orchestrate` schedules) are mapped as lowered."""
    if arch.pe_array.kind == PEKind.SYSTOLIC or program.stage_groups:
        return map_program(program, arch, dataflow=dataflow, **options), None
    if _blockable(program, arch):
        mapping, sched = compile_gemm(program, arch, **options)
        return mapping, None if sched.plain else ProgramSchedule(gemm=sched)
    row_max = has_accmax(program) and not supports(arch, "accmax")
    if row_max:
        program = lower_row_max(program)
    lanes = arch.pe_array.simd_lanes
    partials = (not supports(arch, "vsum") and lanes > 1
                and any(lane_partials_apply(k, lanes) for k in program.kernels)
                # lane sums the multiplier does (no partials through DRAM)
                and not _lane_select_program(program, arch))
    if partials:
        program = lane_partial_sums(program, lanes)
    mapping, sched = _compile_kernels(program, arch, options)
    if not row_max and not partials:  # a CSR row's nonzeros u at a time, where faster
        (u, tree), (mapping, sched) = nonzero_choice.choose_unroll(
            program, arch, lambda p: _compile_kernels(p, arch, options), (mapping, sched))
        sched = dataclasses.replace(sched, nonzero_unroll=u, nonzero_tree=tree)
    sched = dataclasses.replace(sched, row_max=row_max, lane_partials=partials)
    return mapping, None if sched.plain else sched


def _lane_select_program(program: Program, arch: ArchSpec) -> bool:
    """Whether every kernel of `program` that lane partials would split has
    `lane_select_candidates`: the program is then compiled whole, its lane sums as
    lane-selecting multiplies, instead of split into lane partials whose words go out to DRAM
    and back (docs/conventions.md#lane-select-sums; attention butterfly on `mlx_4x4`, seq 1024,
    dim 64: 68,556 -> 55,710 cycles)."""
    lanes = arch.pe_array.simd_lanes
    summed = [k for k in program.kernels if lane_partials_apply(k, lanes)]
    return bool(summed) and all(lane_select_candidates(k, arch) for k in summed)


def apply_schedule(program: Program, sched: ProgramSchedule | None, arch: ArchSpec) -> Program:
    """`program` transformed as `sched` says (a plan bound to freshly lowered values)."""
    if sched is None or sched.plain:
        return program
    if sched.row_max:
        program = lower_row_max(program)
    if sched.lane_partials:
        program = lane_partial_sums(program, arch.pe_array.simd_lanes)
    if sched.gemm is not None:
        return apply_gemm_schedule(program, sched.gemm, arch.pe_array.simd_lanes)
    if sched.nonzero_unroll:
        program = unroll_nonzeros(program, sched.nonzero_unroll, sched.nonzero_tree)
    program = gather_pads.apply_pads(program, sched.pads)
    kernels = tuple(apply_kernel_schedule(k, s) for k, s in zip(program.kernels, sched.kernels))
    program = dataclasses.replace(program, kernels=kernels)
    if sched.row_max_fused:
        program = transform.fuse_row_max(program, arch.pe_array.simd_lanes)
    return program


def compile_program(program: Program, arch: ArchSpec, dataflow: str | None = None,
                    **options) -> Mapping:
    """`choose_schedule`'s mapping: the mapper's entry point as the workloads call it."""
    return choose_schedule(program, arch, dataflow, **options)[0]


__all__ = ["GemmSchedule", "KernelSchedule", "ProgramSchedule", "apply_schedule",
           "choose_schedule", "compile_gemm", "compile_program", "kernel_candidates"]
