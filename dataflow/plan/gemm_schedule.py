"""The dense GEMM's schedules (docs/conventions.md#register-blocking).

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

from dataflow.arch.spec import ArchSpec
from dataflow.dfg import layout, transform
from dataflow.dfg.graph import Program
from dataflow.mapper import map_program
from dataflow.mapper.bounds import ii1_copies
from dataflow.mapper.mapping import Mapping, MappingError
from dataflow.plan.retime import (
    best_candidate,
    choice_key,
    choose_memoised,
    cycles_bound,
    kernel_iterations,
    post_passes,
    sample_cycles,
)

#: row-block heights tried (A panel rows per body): at most the SIMD width, one SPM row
BLOCK_ROWS = (8, 4, 2, 1)
#: vector blocks per body tried
BLOCK_COLS = (1, 2, 3, 4, 6)


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
    copies: int = 0  # body copies asked of the mapper (`best_copies`); 0: the mapper's choice
    pad_c: int = 0  # words of pad after each row of C (`c_pad`)

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
        if self.copies:
            parts.append(f"{self.copies} copies")
        if self.pad_c:
            parts.append(f"C rows padded by {self.pad_c} words")
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
        out = layout.pack_panels(out, "A", g.m, g.k, sched.rows)
        out = dataclasses.replace(
            out, kernels=(transform.vectorise_lanes(out.kernels[0], sched.rows),))
    if sched.pack_b:
        out = layout.pack_column_panels(out, "B", g.k, g.n, lanes)
    if sched.pad_c:
        out = layout.pitch_output_rows(out, "C", g.m, g.n, sched.pad_c)
    return out


def c_pad(rows: int, cols: int, n: int, arch: ArchSpec) -> int:
    """Words of pad per row of C that put an r x s block's accumulators on the most distinct
    SPM lines (fewest rows of pad of equals; 0 when the rows do not fill whole SPM rows).
    Accumulator (u, v) lives (u * pitch + v * n / s) words from the block's first: with
    n / lanes a multiple of the line count every u -- and at II > 1 the flushes of one issue
    slot, which `stagger_flushes` cannot move apart -- lands on one line."""
    wpr, lines = arch.spm.words_per_row, arch.spm.lines
    if n % wpr or (n // cols) % wpr:
        return 0

    def spread(p):
        return len({(u * (n // wpr + p) + v * (n // cols // wpr)) % lines
                    for u in range(rows) for v in range(cols)})
    best = max(range(lines), key=lambda p: (spread(p), -p))
    return best * wpr


def supports(arch: ArchSpec, op: str) -> bool:
    """Whether a functional unit of `arch` executes `op`."""
    try:
        arch.fu_for(op)
    except KeyError:
        return False
    return True


#: longest II `best_copies` considers (each PE then holds that many of a body's nodes)
MAX_SHARED_II = 8


def body_nodes(rows: int, cols: int, fuse: bool) -> int:
    """Nodes of an r x s register-blocked body: the A panel load, s B loads, the products."""
    return 1 + cols + rows * cols * (1 if fuse else 2)


def body_units(rows: int, cols: int, fuse: bool, arch: ArchSpec) -> tuple[int, ...]:
    """Slots each functional unit is busy per copy of an r x s body (`body_nodes`'s ops: the
    loads, the products and, unfused, their accumulations), as `bounds.unit_busy`."""
    ops = [("load", 1 + cols), ("macc" if fuse else "mul", rows * cols)]
    if not fuse:
        ops.append(("acc", rows * cols))
    busy: dict[str, int] = {}
    for op, count in ops:
        try:
            fu = arch.fu_for(op)
        except KeyError:  # a unit the body cannot use: it is not a candidate there anyway
            continue
        busy[fu.name] = busy.get(fu.name, 0) + count * fu.issue_interval_cycles
    return tuple(busy.values()) or (0,)


def best_copies(nodes: int, maccs: int, loads: int, arch: ArchSpec,
                units: tuple[int, ...] | None = None) -> tuple[int, int]:
    """(copies, II) that issue the most products per cycle for a body of `nodes` nodes with
    `maccs` products and `loads` row reads: copies x nodes issue slots fit in II x PEs and the
    reads in II x the lines' read ports. A body that does not divide the PEs evenly leaves
    PEs idle at II = 1 (an 8 x 1 block of 10 nodes: 6 copies on 64 PEs, 4 idle; one copy on
    16 PEs, 6 idle); at a longer II the copies share PEs and fill them (19 copies at II 3 on
    64 PEs, 8 at II 5 on 16). Of equal rates the shorter II
    (docs/conventions.md#register-blocking). `units`: the slots each functional unit is busy
    per copy (`bounds.unit_busy`); given, a PE issues `issue_width` ops a cycle, each unit
    at most one (docs/architecture.md#issue-width); absent, one op a PE a cycle."""
    pes = arch.pe_array.num_pes
    width = arch.pe_array.issue_width if units else 1
    ports = arch.spm.lines * arch.spm.read_ports_per_line
    best = (0.0, 0, 1)
    for ii in range(1, MAX_SHARED_II + 1):
        copies = min(ii * pes * width // nodes, ii * ports // max(1, loads))
        if width > 1:
            copies = min([copies] + [ii * pes // u for u in units if u])
        if copies and copies * maccs / ii > best[0] + 1e-9:
            best = (copies * maccs / ii, copies, ii)
    return best[1], best[2]


def gemm_candidates(program: Program, arch: ArchSpec) -> list[GemmSchedule]:
    """Every blocking of this GEMM the architecture can hold: rows dividing m (at most the SIMD
    width and an SPM row), vector blocks dividing n's vectors, bodies no larger than the
    array; the plain kernel first."""
    g = program.gemm
    lanes = arch.pe_array.simd_lanes
    pes, width = arch.pe_array.num_pes, arch.pe_array.issue_width
    fuse = supports(arch, "macc")
    out = [GemmSchedule()]
    vectors = g.n // lanes if g.n % lanes == 0 else 0
    for r in BLOCK_ROWS:
        if r > lanes or g.m % r or arch.spm.words_per_row % r:
            continue
        for s in BLOCK_COLS:
            if s > 1 and (not vectors or vectors % s):
                continue
            nodes = body_nodes(r, s, fuse)
            units = body_units(r, s, fuse, arch)
            # one copy issues at II 1 (docs/architecture.md#issue-width)
            if nodes > pes * width or (width > 1 and max(units) > pes):
                continue
            sched = GemmSchedule(r, s, pack_b=vectors > 0, fuse=fuse)
            if not sched.plain:
                out.append(sched)
            copies, ii = best_copies(nodes, r * s, 1 + s, arch, units) if fuse else (0, 1)
            if ii > 1 and copies > ii1_copies(nodes, units, arch):  # PEs shared: fuller
                out.append(dataclasses.replace(sched, copies=copies,
                                               pad_c=c_pad(r, s, g.n, arch)))
    return out


def _evaluate(prog: Program, sched: GemmSchedule, arch: ArchSpec, options: dict,
              skew: bool | None = None):
    """(cycles predicted from the first tile, kernel mapping) of `prog`, the GEMM as `sched`
    transforms it; None when it does not map. `skew` as `retime.post_passes`."""
    if sched.copies:
        options = {**options, "copies": sched.copies}
    try:
        mapping = map_program(prog, arch, **options)
    except MappingError:
        if sched.plain:
            raise
        return None
    km = mapping.kernels[0]
    lanes = arch.pe_array.simd_lanes
    if sched.plain:
        per = sample_cycles(km, arch, prog) if skew is None else None
    else:
        per, km = post_passes(km, arch, prog, skew)
    cost = None if per is None else per * kernel_iterations(prog.kernels[0], lanes)
    return cost, km


def _estimate(sched: GemmSchedule, arch: ArchSpec) -> tuple[float, int, int]:
    """(-accumulator lanes per cycle, body nodes, SPM row reads per cycle) of `sched` if the
    mapper reached II = 1 with as many copies as the PEs hold: more MACs first; of equals the
    smaller body (the mapper reaches its copies more often), then fewer reads (which leave
    the lines room)."""
    nodes = body_nodes(sched.rows, sched.cols, sched.fuse)
    units = body_units(sched.rows, sched.cols, sched.fuse, arch)
    pes, width = arch.pe_array.num_pes, arch.pe_array.issue_width
    copies = sched.copies or max(1, ii1_copies(nodes, units, arch))
    reads = copies * (1 + sched.cols)
    ports = arch.spm.lines * arch.spm.read_ports_per_line
    ii = max(1, math.ceil(reads / ports), math.ceil(copies * nodes / (pes * width)),
             *(math.ceil(copies * u / pes) for u in units if width > 1 and u))
    return (-copies * sched.rows * sched.cols / ii, nodes, reads)


def compile_gemm(program: Program, arch: ArchSpec, **options) -> tuple[Mapping, GemmSchedule]:
    """The fastest blocking of a dense GEMM on `arch` (see the module docstring), mapped:
    candidates in order of their lower bound, each mapped and run on its first tile unless
    the best so far is within `BOUND_SLACK` of that bound (`retime.best_candidate`)."""
    lanes = arch.pe_array.simd_lanes
    applied: dict[GemmSchedule, Program] = {}  # each schedule's program, packed once

    def program_of(s: GemmSchedule) -> Program:
        if s not in applied:
            applied[s] = apply_gemm_schedule(program, s, lanes)
        return applied[s]

    candidates = gemm_candidates(program, arch)

    def search():
        # equal bounds keep the order of `_estimate`. Blocks sharing PEs have the better
        # bounds but the harder schedules (registers, lines), so they are a search of their
        # own: the bounds of one family never stop the other's being measured
        order = sorted(candidates, key=lambda s: _estimate(s, arch))
        found, evaluated = [], 0
        for family in ([s for s in order if not s.copies], [s for s in order if s.copies]):
            got = best_candidate(
                family, lambda s: cycles_bound(program_of(s).kernels[0], arch, s.copies or None),
                lambda s: _evaluate(program_of(s), s, arch, options)) if family else None
            if got is not None:
                found.append(got[:3])
                evaluated += got[3]
        _, sched, km = min(found, key=lambda f: f[0])
        return sched, km, evaluated

    sched, km, evaluated = choose_memoised(
        choice_key(program.kernels[0], arch, f"gemm {options}"), GemmSchedule,
        lambda s: program_of(s).kernels[0],
        lambda s, skew: _evaluate(program_of(s), s, arch, options, skew=skew)[1],
        search)
    mapping = Mapping(program=program_of(sched), arch=arch, kernels=(km,))
    note = (f"schedule: {sched.label()} (chosen earlier for this kernel and array)"
            if evaluated is None else
            f"schedule: {sched.label()} (best of {evaluated} candidates mapped and run on the "
            f"first tile, of {len(candidates)} that fit)")
    km = mapping.kernels[0]
    km = dataclasses.replace(km, notes=(*km.notes, note))
    return dataclasses.replace(mapping, kernels=(km,)), sched
