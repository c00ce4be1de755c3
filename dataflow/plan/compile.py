"""The compiler's schedule choice: transformations (`dataflow.dfg.transform`) applied to a program
before it is mapped, picked per program and architecture by measuring the candidates
(docs/conventions.md#register-blocking).

A dense GEMM is lowered as `load a, load b, mul, acc` per 8-lane MAC: four PEs and two SPM
reads for eight MACs. The candidates here block it into an outer product per body:

    for i in m / r, j in n / (s * lanes) (vector), kk in k:
        a = A_packed[i, kk, 0:r]            one SPM row: r rows of A in one column (`span`)
        b_v = B_packed[j + v * n / s, kk]   one SPM row per vector block v = 0 .. s - 1
        C[r*i + u, j + v * n / s] += a.lane(u) * b_v    r * s maccs, accumulators in registers

so r * s * lanes MACs cost 1 + s loads, A and B stored as BLIS packs them (panels of r rows,
panels of `lanes` columns), which also makes every copy's streams walk the SPM lines in step
instead of piling onto one. Each candidate (r, s) is mapped (the mapper picks the copies and
II) and scored by the engine's cycles on the problem's first tile; the fastest wins, and the
plain kernel stays among the candidates, so the choice never loses to it on that tile.
A last, line-aware pass (`stagger_flushes`) moves each copy's accumulations to distinct issue
cycles, so their register flushes, which hit the same SPM line, do not share a cycle.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from dataflow.arch.spec import ArchSpec, PEKind
from dataflow.dfg import transform
from dataflow.dfg.graph import Program
from dataflow.mapper import map_program
from dataflow.mapper.legality import check_kernel_mapping
from dataflow.mapper.mapping import KernelMapping, Mapping, MappingError
from dataflow.pe_array.fast import run_kernel_fast

#: row-block heights tried (A panel rows per body): at most the SIMD width, one SPM row
BLOCK_ROWS = (8, 4, 2, 1)
#: vector blocks per body tried
BLOCK_COLS = (1, 2, 3, 4, 6)
#: candidates simulated on a sample tile after ranking by the mapper's throughput
MEASURED_CANDIDATES = 4


@dataclass(frozen=True)
class GemmSchedule:
    """How a dense GEMM body is blocked: `rows` x `cols` accumulators (rows of C by vector
    blocks), A packed in panels of `rows` rows, B packed in panels of `lanes` columns when
    `pack_b`; `fuse` merges each mul into its acc (a macc). rows = cols = 1 without packing or
    fusing is the plain kernel."""

    rows: int = 1
    cols: int = 1
    pack_b: bool = False
    fuse: bool = False

    @property
    def plain(self) -> bool:
        return self == GemmSchedule()

    def label(self) -> str:
        if self.plain:
            return "plain (load a, load b, mul, acc)"
        parts = [f"{self.rows}x{self.cols} register block"]
        if self.fuse:
            parts.append("macc")
        if self.rows > 1:
            parts.append(f"A packed in {self.rows}-row panels")
        if self.pack_b:
            parts.append("B packed in column panels")
        return ", ".join(parts)


def apply_gemm_schedule(program: Program, sched: GemmSchedule, lanes: int) -> Program:
    """`program` (one dense GEMM from `dfg.lower.lower_gemm`) with `sched`'s transformations:
    the same values, a different body and operand layout."""
    if sched.plain:
        return program
    g = program.gemm
    kern = program.kernels[0]
    if sched.fuse:
        kern = transform.fuse_multiply_accumulate(kern)
    kern = transform.unroll_and_jam(kern, "i", sched.rows, inner=True)
    kern = transform.unroll_and_jam(kern, "j", sched.cols, inner=False)
    out = dataclasses.replace(program, kernels=(kern,))
    if sched.rows > 1:
        out = transform.pack_panels(out, "A", g.m, g.k, sched.rows)
        out = dataclasses.replace(
            out, kernels=(transform.vectorise_lanes(out.kernels[0], sched.rows),))
    if sched.pack_b:
        out = transform.pack_column_panels(out, "B", g.k, g.n, lanes)
    return out


def _supports(arch: ArchSpec, op: str) -> bool:
    try:
        arch.fu_for(op)
    except KeyError:
        return False
    return True


def gemm_candidates(program: Program, arch: ArchSpec) -> list[GemmSchedule]:
    """Every blocking of this GEMM the architecture can hold: rows dividing m (at most the SIMD
    width and an SPM row), vector blocks dividing n's vectors, bodies no larger than the
    array; the plain kernel first."""
    g = program.gemm
    lanes = arch.pe_array.simd_lanes
    pes = arch.pe_array.num_pes
    fuse = _supports(arch, "macc")
    out = [GemmSchedule()]
    vectors = g.n // lanes if g.n % lanes == 0 else 0
    for r in BLOCK_ROWS:
        if r > lanes or g.m % r or arch.spm.words_per_row % r:
            continue
        for s in BLOCK_COLS:
            if s > 1 and (not vectors or vectors % s):
                continue
            nodes = 1 + s + r * s * (1 if fuse else 2)  # loads of a and b, the products
            if nodes > pes:
                continue
            sched = GemmSchedule(r, s, pack_b=vectors > 0, fuse=fuse)
            if not sched.plain:
                out.append(sched)
    return out


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


def sample_cycles(km: KernelMapping, arch: ArchSpec, program: Program) -> float:
    """Cycles per iteration of the kernel's first tile on the fast engine (stalls included):
    the measured score of a schedule."""
    first = dataclasses.replace(km, tiles=km.tiles[:1])
    res = run_kernel_fast(first, arch, program.input_map, program.dtype)
    tile = res.tiles[0]
    return tile.compute_cycles / max(1, tile.iterations)


@dataclass(frozen=True)
class _Candidate:
    sched: GemmSchedule
    program: Program
    mapping: Mapping
    iterations: int

    @property
    def predicted(self) -> float:
        """The mapper's steady state: iterations x II / copies."""
        km = self.mapping.kernels[0]
        return self.iterations * km.ii / km.copies


def _map_candidate(program: Program, sched: GemmSchedule, arch: ArchSpec,
                   options: dict) -> _Candidate | None:
    prog = apply_gemm_schedule(program, sched, arch.pe_array.simd_lanes)
    try:
        mapping = map_program(prog, arch, **options)
    except MappingError:
        if sched.plain:
            raise
        return None
    if not sched.plain:
        km = stagger_flushes(mapping.kernels[0], arch)
        mapping = dataclasses.replace(mapping, kernels=(km,))
    kern = prog.kernels[0]
    lanes = arch.pe_array.simd_lanes
    iterations = math.prod(-(-lp.extent // lanes) if lp.var == kern.vector_var else lp.extent
                           for lp in kern.loops)
    return _Candidate(sched, prog, mapping, iterations)


def _estimate(sched: GemmSchedule, arch: ArchSpec) -> tuple[float, int]:
    """(-accumulator lanes per cycle, SPM row reads per cycle) of `sched` if the mapper reached
    II = 1 with as many copies as the PEs hold: the ranking before anything is mapped (more
    MACs first; of equals, fewer reads, which leave the lines room)."""
    nodes = 1 + sched.cols + sched.rows * sched.cols * (1 if sched.fuse else 2)
    copies = max(1, arch.pe_array.num_pes // nodes)
    reads = copies * (1 + sched.cols)
    ports = arch.spm.lines * arch.spm.read_ports_per_line
    ii = max(1, math.ceil(reads / ports))
    return (-copies * sched.rows * sched.cols / ii, reads)


def compile_gemm(program: Program, arch: ArchSpec, **options) -> tuple[Mapping, GemmSchedule]:
    """The fastest blocking of a dense GEMM on `arch` (see the module docstring), mapped."""
    ranked = sorted(gemm_candidates(program, arch)[1:], key=lambda s: _estimate(s, arch))
    tried = [GemmSchedule(), *ranked[:MEASURED_CANDIDATES]]
    mapped = [c for s in tried if (c := _map_candidate(program, s, arch, options)) is not None]
    mapped.sort(key=lambda c: c.predicted)
    plain = [c for c in mapped if c.sched.plain]
    shortlist = mapped[:MEASURED_CANDIDATES] + [c for c in plain
                                                if c not in mapped[:MEASURED_CANDIDATES]]
    scored = []
    for c in shortlist:
        km = c.mapping.kernels[0]
        per_iteration = sample_cycles(km, arch, c.program)
        scored.append((per_iteration * c.iterations, c.sched.plain, c))
    best = min(scored, key=lambda x: (x[0], x[1]))[2]
    notes = (f"schedule: {best.sched.label()} (chosen of {len(mapped)} candidates by the "
             "engine's cycles on the first tile)",)
    km = best.mapping.kernels[0]
    km = dataclasses.replace(km, notes=(*km.notes, *notes))
    return dataclasses.replace(best.mapping, kernels=(km,)), best.sched


def _blockable(program: Program, arch: ArchSpec) -> bool:
    """One dense GEMM as `lower_gemm` makes it, on a reconfigurable array."""
    return (program.gemm is not None and arch.pe_array.kind != PEKind.SYSTOLIC
            and len(program.kernels) == 1 and program.kernels[0].name == "gemm"
            and program.gemm.a_addresses is None and len(program.kernels[0].nodes) == 4)


def choose_schedule(program: Program, arch: ArchSpec, dataflow: str | None = None,
                    **options) -> tuple[Mapping, GemmSchedule | None]:
    """Choose a schedule for `program` on `arch` and map it: (the mapping of the transformed
    program, the schedule to re-apply to a program lowered again from new values, None when
    the program runs as lowered). A dense GEMM on a reconfigurable array is blocked
    (`compile_gemm`); everything else is mapped as lowered."""
    if _blockable(program, arch):
        mapping, sched = compile_gemm(program, arch, **options)
        return mapping, None if sched.plain else sched
    return map_program(program, arch, dataflow=dataflow, **options), None


def apply_schedule(program: Program, sched: GemmSchedule | None, arch: ArchSpec) -> Program:
    """`program` transformed as `sched` says (a plan bound to freshly lowered values)."""
    if sched is None:
        return program
    return apply_gemm_schedule(program, sched, arch.pe_array.simd_lanes)


def compile_program(program: Program, arch: ArchSpec, dataflow: str | None = None,
                    **options) -> Mapping:
    """`choose_schedule`'s mapping: the mapper's entry point as the workloads call it."""
    return choose_schedule(program, arch, dataflow, **options)[0]
