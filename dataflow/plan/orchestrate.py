"""Layer orchestration of butterfly stage kernels: layer-by-layer, stage-fused, multi-layer.

Three ways to run the log2(n) stages of a butterfly on one array (docs/architecture.md#planning):

* ``layer``: one kernel per stage, one after another; every kernel reconfigures the array, reads
  its input from DRAM and writes its output back (DRAM traffic ~ stages x data).
* ``fused``: f stages per kernel (a radix-2^f body: intermediate values stay in registers and on
  links); ceil(stages / f) kernels, each a DRAM round trip.
* ``multilayer``: c stage kernels *co-resident* (MLX, ISCA 2026: several logical layers held as
  tagged instruction blocks per PE; docs/references.md#mlx): one configuration per residency, the
  data handed from kernel to kernel through SPM lines, one DRAM round trip per residency. Within
  a tile the co-resident kernels run one after another (the hardware arbiter switches blocks;
  our model does not overlap them, a conservative choice). Its data buffers use the skewed SPM
  layout of `lower_butterfly` (with an interleaved SPM of 2^z lines), so a sub-butterfly's
  points, a power of two apart, do not all fall on one SPM line; the layout's bit permutation
  and flip mask per buffer are then chosen against the mapped schedule
  (`spm_layout.choose_layout`: the scheduler does not see SPM lines, so stores issued in one
  cycle to one single-port line stall the array; the search measures those stalls with the
  engine on two tiles).

How many stages go in one kernel (f) and how many kernels stay co-resident (c) is chosen from
the architecture, and the reason is recorded (`FusionChoice.reason`, the mapping's notes):
  * instruction entries: a kernel of N nodes needs N <= PEs x instruction_entries; co-resident
    kernels need, on every PE, the sum of their placed instructions <= instruction_entries;
  * registers: every value edge of the body holds a register on its consumer PE
    (`mapper/legality.py`), so E edges need E <= PEs x register_file_entries;
  * SPM: a residency of c kernels keeps, per tile, its double-buffered input and output and
    min(c - 1, 2) intermediate buffers (they ping-pong: `INTERMEDIATE_SLOTS`,
    docs/conventions.md#fnet-pass-boundaries): words <= spm capacity;
  * mapper effort: nodes x PEs <= MAPPER_EFFORT (the list scheduler's time grows with both: a
    radix-8 complex body, ~150 nodes, maps in seconds on 16 PEs and takes about a minute on 64),
    and an optional explicit `max_stages_per_kernel`;
  * and whatever the modulo scheduler reports when a candidate does not map (then f - 1).

The stride-2^k exchanges are the routes between the PEs that hold a pair; the scheduler routes
them over the mesh and, when `interconnect.skip_hop_strides` is set, over skip-hop links (one hop
for a stride the arch has, MLX's "butterfly strides in one or two hops").

Mappings of kernels with identical bodies (same ops and edges) are reused: placements depend on
the body only, tiles and SPM allocation are recomputed for each kernel and the whole is checked
by `legality.check_kernel_mapping`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from enum import Enum

from dataflow.arch.spec import AddressMapping, ArchSpec, PEKind
from dataflow.dfg.graph import Kernel
from dataflow.dfg.lower import live_kernel
from dataflow.dfg.lower_butterfly import (
    ButterflyKind,
    ButterflySpec,
    StageGroup,
    data_rows,
    group_kernel,
    skew_period,
    split_stages,
)
from dataflow.mapper.legality import check_mapping
from dataflow.mapper.mapping import KernelMapping, Mapping, MappingError
from dataflow.mapper.tiling import MIN_TILES
from dataflow.pe_array.system import DRAM_PAGE_BYTES
from dataflow.plan.retime import kernel_iterations
from dataflow.plan.spm_layout import choose_layout
from dataflow.plan.stage_lines import choose_store_timing
from dataflow.plan.stage_mapping import MAPPER_EFFORT, instructions_per_pe, map_stage_kernel


class Orchestration(str, Enum):
    """How a butterfly's stage kernels share the array (the module docstring). A str enum:
    callers may pass the word."""

    LAYER = "layer"
    FUSED = "fused"
    MULTILAYER = "multilayer"

    def __str__(self) -> str:  # messages and notes print the word
        return self.value


ORCHESTRATIONS = tuple(o.value for o in Orchestration)
MAX_STAGES_PER_KERNEL = None  # no explicit cap: the limits below decide


class SPMCapacityError(MappingError):
    """One tile of the full butterfly length does not fit the SPM (an FFT can then be split
    four-step, `butterfly.ops.run_fft_spec`)."""


@dataclass(frozen=True)
class FusionChoice:
    """f stages per kernel, c kernels per residency, and why (limits: name -> largest value
    that resource allows)."""

    mode: str
    stages: int
    stages_per_kernel: int
    kernels_per_residency: int
    tile_rows: int
    limits: tuple[tuple[str, int], ...]
    reason: str
    skew_lines: int = 0  # intermediates in the skewed SPM layout (see lower_butterfly)
    skew_perm: tuple[tuple[int, ...], ...] = ()  # bit permutation per data buffer (choose_layout)
    skew_flip: tuple[int, ...] = ()  # flipped index bits per data buffer (choose_layout)
    entry_budget: int | None = None  # instruction entries per PE one kernel may fill with copies

    @property
    def stages_on_chip(self) -> int:
        """Stages computed between two DRAM round trips."""
        return min(self.stages, self.stages_per_kernel * self.kernels_per_residency)


@dataclass(frozen=True)
class TilePlan:
    """The closed-form part of a plan, before any kernel is mapped (`_tile_plan`)."""

    spec: ButterflySpec  # with `skew_lines` set when the intermediates are skewed
    skew_lines: int  # 0: natural layout
    tile_rows: int  # outer indices (batch blocks) per tile
    residency_limit: int  # most kernels whose tiles the SPM holds at once (c <= this)
    stages_per_kernel: int  # f from the closed-form limits (the mapper may lower it)
    limits: tuple[tuple[str, int], ...]  # resource -> largest f it allows
    reason: str


@dataclass(frozen=True, eq=False)
class OrchestrationPlan:
    """What `plan_orchestration` chose, with the stage kernels mapped (built without data):
    `groups` lower the program (`lower_butterfly`), `segments` are the residencies (kernel
    indices co-resident on the array), `notes` the fallbacks taken on the way."""

    choice: FusionChoice
    groups: tuple[StageGroup, ...]
    kernel_mappings: tuple[KernelMapping, ...]
    segments: tuple[tuple[int, ...], ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class OrchestratedMapping:
    """A `Mapping` plus how its kernels share the array: `segments` are the residencies (tuples
    of kernel indices co-resident on the array; one configuration and one DRAM round trip
    each)."""

    mapping: Mapping
    spec: ButterflySpec
    choice: FusionChoice
    segments: tuple[tuple[int, ...], ...]
    notes: tuple[str, ...] = ()

    @property
    def arch(self) -> ArchSpec:
        return self.mapping.arch

    def summary(self) -> str:
        head = (f"{self.choice.mode}: {len(self.mapping.kernels)} kernels of <= "
                f"{self.choice.stages_per_kernel} stages, {len(self.segments)} residenc"
                f"{'y' if len(self.segments) == 1 else 'ies'}")
        return "\n".join([head, self.mapping.summary(), *self.notes])


# --- the choice ---------------------------------------------------------------------------------

def default_tile_rows(spec: ButterflySpec) -> int:
    """Batch blocks per tile: at least MIN_TILES tiles so DMA overlaps compute (as tiling.py)."""
    return max(1, -(-spec.outer // MIN_TILES))


def _edges(kernel: Kernel) -> int:
    return sum(len(n.inputs) for n in kernel.nodes)


def tile_words(spec: ButterflySpec, rows: int, skewed: bool = False) -> int:
    """SPM words of one data buffer set (re and im) for a tile of `rows` outer indices (batch
    blocks; 2^col_bits / lanes blocks each for a column pass)."""
    parts = 2 if spec.complex_data else 1
    return rows * spec.col_blocks * data_rows(spec, skewed) * spec.lanes * parts


def coefficient_words(spec: ButterflySpec) -> int:
    """Words of all coefficient tables (an upper bound: constant twiddles are not loaded)."""
    if spec.kind == ButterflyKind.FFT and spec.col_bits:
        return 2 * spec.col_block_words * spec.n  # (place, part) blocks, lower_butterfly
    if spec.kind == ButterflyKind.FFT:
        return 2 * spec.n
    return spec.stages * (spec.n // 2) * (4 if spec.kind == ButterflyKind.REAL else 8)


#: intermediate slots a residency needs however many kernels it holds: kernel i reads X_i and
#: writes X_(i+1), one after another within a tile, so X_(i+1) takes the slot of X_(i-1), dead
#: since kernel i - 1 read it (docs/conventions.md#fnet-pass-boundaries)
INTERMEDIATE_SLOTS = 2


def spm_residency_limit(spec: ButterflySpec, arch: ArchSpec, rows: int) -> int:
    """Largest c whose per-tile working set fits: double-buffered input and output plus
    min(c - 1, `INTERMEDIATE_SLOTS`) intermediates plus the coefficient tables (0 when even
    c = 1 does not fit; `spec.stages` when every c does). A real input or output holds one
    part (re) of a complex transform's words."""
    cap = arch.spm.capacity_words
    skewed = spec.skew_lines > 1 and skew_period(spec) > 1
    mid = tile_words(spec, rows, skewed)
    half = mid // 2 if spec.complex_data else mid  # re rows only, in the complex layout
    ends = 2 * ((half if spec.real_input else mid) + (half if spec.real_output else mid))
    free = cap - coefficient_words(spec) - ends
    if free < 0:
        return 0
    if free >= INTERMEDIATE_SLOTS * mid:
        return max(spec.stages, 1 + INTERMEDIATE_SLOTS)
    return 1 + free // mid


def choose_stages_per_kernel(spec: ButterflySpec, arch: ArchSpec, max_stages: int | None = None,
                             effort: int | None = MAPPER_EFFORT) -> tuple[int, list, str]:
    """Largest f the closed-form limits allow: (f, [(limit, largest f it allows)], reason).

    Kernels for f = 1, 2, ... are built until one limit fails (nodes and edges only grow with
    f), so a limit that did not bind reports the largest f that was checked."""
    pes = arch.pe_array.num_pes
    S = spec.stages
    cap = S if max_stages is None else max(0, min(S, max_stages))
    f_instr = f_regs = f_effort = 0
    for f in range(1, cap + 1):
        groups = split_stages(S, f)
        ks = [group_kernel(spec, g, len(groups), i) for i, g in enumerate(groups)]
        nodes = max(len(k.nodes) for k in ks)
        if nodes <= pes * arch.pe_array.instruction_entries:
            f_instr = f
        if max(_edges(k) for k in ks) <= pes * arch.pe_array.register_file_entries:
            f_regs = f
        if effort is None or nodes * pes <= effort:
            f_effort = f
        if f > min(f_instr, f_regs, f_effort):
            break
    limits = [("stages", S)]
    if max_stages is not None:
        limits.append(("max_stages_per_kernel", max_stages))
    limits += [("instruction entries", f_instr), ("registers", f_regs)]
    if effort is not None:
        limits.append((f"mapper effort (nodes x PEs <= {effort})", f_effort))
    f = min(v for _, v in limits)
    if f < 1:
        if f_instr < 1 or f_regs < 1:
            name = ("pe_array.instruction_entries" if f_instr < 1
                    else "pe_array.register_file_entries")
            raise MappingError(f"butterfly n={spec.n}: not even one stage per kernel fits {name} "
                               f"on {arch.name!r} ({pes} PEs)")
        f = 1  # effort or an explicit cap below 1: one stage per kernel is always tried
    binding = [name for name, v in limits if v == f]
    reason = (f"{f} stage{'s' if f > 1 else ''} per kernel, limited by {' and '.join(binding)} "
              f"(limits: " + ", ".join(f"{n} {v}" for n, v in limits) + ")")
    return f, limits, reason


def _map_groups(spec, arch, groups, rows, budget):
    # the bodies the lowering will run: dead nodes dropped (`lower.live_kernel`; a real
    # output's imaginary part), so the plan maps no body that never runs
    kernels = [live_kernel(group_kernel(spec, g, len(groups), i)) for i, g in enumerate(groups)]
    return kernels, [map_stage_kernel(k, arch, rows, budget) for k in kernels]




def _tile_plan(spec: ButterflySpec, arch: ArchSpec, mode: str, max_stages_per_kernel) -> TilePlan:
    """The closed-form part of a plan (skew, tile rows, SPM limit on co-resident kernels, f and
    its limits). Raises SPMCapacityError when no tile fits."""
    if mode not in ORCHESTRATIONS:
        raise MappingError(f"orchestration must be one of {ORCHESTRATIONS}, got {mode!r}")
    if arch.pe_array.kind != PEKind.RECONFIGURABLE:
        raise MappingError(f"butterfly kernels need a reconfigurable array; {arch.name!r} is "
                           f"{arch.pe_array.kind}")
    S = spec.stages
    skew = 0
    lines = arch.spm.lines
    if mode == Orchestration.MULTILAYER and arch.spm.address_mapping == AddressMapping.INTERLEAVED \
            and lines > 1 \
            and not lines & (lines - 1):
        # intermediates never cross DRAM: lay them out so a sub-butterfly's points (a power of
        # two apart) sit on different SPM lines
        skew = lines
        spec = dataclasses.replace(spec, skew_lines=skew)
    # tile rows: at most the default (>= MIN_TILES tiles); fewer when the SPM needs it, and for
    # multilayer as many as still let every stage kernel be co-resident
    rows = default_tile_rows(spec)
    want = S if mode == Orchestration.MULTILAYER else 1
    while rows > 1 and spm_residency_limit(spec, arch, rows) < want:
        rows -= 1
    limit_c = spm_residency_limit(spec, arch, rows)
    if limit_c < 1:
        raise SPMCapacityError(
            f"butterfly n={spec.n}: one tile ({rows * spec.col_blocks} batch block(s) of "
            f"{spec.n} x {spec.lanes} {'complex ' if spec.complex_data else ''}words, "
            f"double-buffered in and out, plus "
            f"{coefficient_words(spec)} coefficient words) does not fit the SPM of {arch.name!r}: "
            f"spm.lines x spm.capacity_words_per_line = {arch.spm.capacity_words} words")
    if mode == Orchestration.LAYER:
        f, limits, reason = 1, [("layer-by-layer", 1)], "layer-by-layer: one stage per kernel"
    else:
        f, limits, reason = choose_stages_per_kernel(spec, arch, max_stages_per_kernel)
    return TilePlan(spec=spec, skew_lines=skew, tile_rows=rows, residency_limit=limit_c,
                    stages_per_kernel=f, limits=tuple(limits), reason=reason)


def round_trips(spec: ButterflySpec, arch: ArchSpec, mode: str,
                max_stages_per_kernel: int | None = MAX_STAGES_PER_KERNEL) -> int:
    """DRAM round trips (residencies) a plan of `spec` will take, from the closed-form limits
    only (no mapping; instruction entries can split a residency further): one per kernel for
    `layer` and `fused`, ceil(kernels / SPM limit) for `multilayer`. SPMCapacityError when no
    tile fits."""
    tp = _tile_plan(spec, arch, mode, max_stages_per_kernel)
    kernels = -(-spec.stages // tp.stages_per_kernel)
    return -(-kernels // tp.residency_limit) if mode == Orchestration.MULTILAYER else kernels


def plan_orchestration(spec: ButterflySpec, arch: ArchSpec, mode: str,
                       max_stages_per_kernel: int | None = MAX_STAGES_PER_KERNEL
                       ) -> OrchestrationPlan:
    """Choose f (and c) for `mode`, mapping the candidate kernels."""
    S = spec.stages
    tp = _tile_plan(spec, arch, mode, max_stages_per_kernel)
    spec, skew, rows, limit_c = tp.spec, tp.skew_lines, tp.tile_rows, tp.residency_limit
    f, limits, reason = tp.stages_per_kernel, list(tp.limits), tp.reason
    notes = []
    while True:
        groups = split_stages(S, f)
        try:
            # co-resident kernels share the instruction entries: extra copies only within a share
            budget = (arch.pe_array.instruction_entries // len(groups)
                      if mode == Orchestration.MULTILAYER else None)
            _, kms = _map_groups(spec, arch, groups, rows, budget)
            break
        except MappingError as exc:
            if f == 1:
                raise
            notes.append(f"{f} stages per kernel did not map ({exc}); trying {f - 1}")
            limits.append(("modulo scheduler", f - 1))
            reason = f"{f - 1} stages per kernel: the modulo scheduler could not map {f}"
            f -= 1
    small = striped_rows(spec, arch, rows, kms)
    if small < rows:  # the same schedules (reused by body), smaller tiles
        notes.append(f"tiles of {small} batch block(s) instead of {rows}: the DMA binds, and "
                     f"{small} still stream over every DRAM channel "
                     "(docs/conventions.md#fnet-pass-boundaries)")
        rows = small
        _, kms = _map_groups(spec, arch, groups, rows, budget)
        limit_c = spm_residency_limit(spec, arch, rows)
    c = 1
    segments = tuple((i,) for i in range(len(kms)))
    if mode == Orchestration.MULTILAYER:
        c, segments, why = _residencies(kms, arch, limit_c)
        reason += "; " + why
        limits.append(("co-resident kernels (spm)", limit_c))
    perm: tuple = ((), ())
    if skew:
        reason += f"; intermediates in the skewed layout for {skew} SPM lines"
        perm, why = choose_layout(spec, arch, groups, rows, budget, mode)
        if why:
            reason += "; " + why
    choice = FusionChoice(mode=mode, stages=S, stages_per_kernel=f, kernels_per_residency=c,
                          tile_rows=rows, limits=tuple(limits), reason=reason, skew_lines=skew,
                          entry_budget=budget, skew_perm=perm[0], skew_flip=perm[1])
    return OrchestrationPlan(choice=choice, groups=groups, kernel_mappings=tuple(kms),
                             segments=segments, notes=tuple(notes))


def striped_rows(spec: ButterflySpec, arch: ArchSpec, rows: int, kms) -> int:
    """Outer rows per tile: fewer than `rows` when the kernels `kms` wait on DRAM (a row's
    input and output transfers take longer than its compute, iterations x II / copies
    summed over the kernels), as few as keep each data transfer of a tile at least a DRAM
    page per channel (`system.DRAM_PAGE_BYTES`: a smaller one streams on one channel at a
    fraction of the bandwidth). Smaller tiles start the array sooner and shorten the last
    write-back while the DMA stays the bottleneck between them
    (docs/conventions.md#fnet-pass-boundaries)."""
    block = spec.col_blocks * spec.n * spec.lanes * arch.word_bytes
    parts = 2 if spec.complex_data else 1
    rd = block * (1 if spec.real_input else parts)
    wr = block * (1 if spec.real_output else parts)
    channels = arch.dram.channels
    least = max(1, -(-(channels * DRAM_PAGE_BYTES if channels > 1 else 1) // min(rd, wr)))
    if least >= rows:
        return rows
    compute = 0.0
    for km in kms:
        lanes = arch.pe_array.simd_lanes if km.kernel.vector_var else 1
        compute += (kernel_iterations(km.kernel, lanes) / km.kernel.loops[0].extent
                    * km.ii / km.copies)
    return least if (rd + wr) / arch.dram.bytes_per_cycle > compute else rows


def _residencies(kms, arch, limit_c):
    """Greedy residencies: consecutive kernels while every PE's instructions and the SPM fit."""
    entries = arch.pe_array.instruction_entries
    segments, cur, used = [], [], Counter()
    why_split = set()
    for i, km in enumerate(kms):
        ins = instructions_per_pe(km)
        over = any(used[pe] + n > entries for pe, n in ins.items())
        if cur and (over or len(cur) >= limit_c):
            why_split.add("instruction entries" if over else "SPM capacity")
            segments.append(tuple(cur))
            cur, used = [], Counter()
        cur.append(i)
        used += ins
    segments.append(tuple(cur))
    c = max(len(s) for s in segments)
    peak = max(max(sum((instructions_per_pe(kms[i]) for i in s), Counter()).values())
               for s in segments)
    if len(segments) == 1:
        why = (f"all {len(kms)} kernels co-resident (at most {peak} of {entries} instruction "
               f"entries on a PE; SPM holds up to {limit_c} kernels' tiles)")
    else:
        why = (f"{len(segments)} residencies of <= {c} kernels, split by "
               f"{' and '.join(sorted(why_split))} (instruction entries per PE {entries}, "
               f"SPM allows {limit_c} co-resident kernels)")
    return c, tuple(segments), why


def map_butterfly(program, spec: ButterflySpec, arch: ArchSpec,
                  plan: OrchestrationPlan) -> OrchestratedMapping:
    """Map a program lowered by `lower_butterfly` with the groups of `plan`."""
    choice, segments = plan.choice, plan.segments
    mode = choice.mode
    if len(program.kernels) != len(plan.kernel_mappings):
        raise MappingError("program and plan disagree on the number of stage kernels")
    # the plan mapped kernels built without data; the program's kernels have the same bodies
    kms = [map_stage_kernel(k, arch, choice.tile_rows, choice.entry_budget)
           for k in program.kernels]
    # stores timed against the SPM lines (docs/conventions.md#butterfly-stage-lines)
    kms = [choose_store_timing(km, arch, choice.tile_rows, choice.entry_budget) for km in kms]
    mapping = Mapping(program=program, arch=arch, kernels=tuple(kms), orchestration=mode)
    check_mapping(mapping)
    _check_residencies(mapping, segments)
    return OrchestratedMapping(mapping=mapping, spec=spec, choice=choice, segments=segments,
                               notes=(choice.reason, *plan.notes))


def _check_residencies(mapping: Mapping, segments) -> None:
    """Co-resident kernels: instructions within entries on every PE, equal tiles."""
    entries = mapping.arch.pe_array.instruction_entries
    for seg in segments:
        used = sum((instructions_per_pe(mapping.kernels[i]) for i in seg), Counter())
        if used and max(used.values()) > entries:
            pe, n = used.most_common(1)[0]
            raise MappingError(f"co-resident kernels {seg}: PE {pe} holds {n} instructions, more "
                               f"than pe_array.instruction_entries = {entries}")
        spans = {tuple((t.lo, t.hi) for t in mapping.kernels[i].tiles) for i in seg}
        if len(spans) > 1:
            raise MappingError(f"co-resident kernels {seg} are tiled differently")


# --- bounds ------------------------------------------------------------------------------------

def issue_slots(spec: ButterflySpec, groups: tuple[StageGroup, ...], nodes: list[int]) -> int:
    """Closed form of the ops the program issues: kernel i runs nb * n / 2^f_i vector
    iterations of nodes_i ops each (every op takes one PE issue slot)."""
    return sum(spec.blocks * (spec.n >> g.count) * k for g, k in zip(groups, nodes))


def roofline(om: OrchestratedMapping, dram_bytes: int) -> dict[str, float]:
    """Lower bounds in cycles: issue (ops / (PEs x issue_width), `issue_width` ops per PE per
    cycle, docs/architecture.md#issue-width) and DRAM (bytes / dram.bytes_per_cycle); `bound`
    is the larger (the roofline of this program)."""
    arch = om.arch
    slots = issue_slots(om.spec, om.mapping.program.stage_groups,
                        [len(k.kernel.nodes) for k in om.mapping.kernels])
    issue = slots / (arch.pe_array.num_pes * arch.pe_array.issue_width)
    dram = dram_bytes / arch.dram.bytes_per_cycle
    return {"issue_slots": slots, "issue_bound": issue, "dram_bound": dram,
            "bound": max(issue, dram)}


def minimal_dram_bytes(spec: ButterflySpec, word_bytes: int) -> int:
    """Input once, output once, every coefficient table once: what a single residency moves
    at most (constant twiddles are never loaded, so a run may move a little less)."""
    words = spec.blocks * spec.n * spec.lanes
    cin = 1 if (not spec.complex_data or spec.real_input) else 2
    cout = 1 if (not spec.complex_data or spec.real_output) else 2
    bias = spec.n if spec.bias else 0
    return (words * (cin + cout) + coefficient_words(spec) + bias) * word_bytes


__all__ = [
    "ORCHESTRATIONS",
    "FusionChoice",
    "OrchestratedMapping",
    "OrchestrationPlan",
    "SPMCapacityError",
    "choose_stages_per_kernel",
    "issue_slots",
    "map_butterfly",
    "minimal_dram_bytes",
    "plan_orchestration",
    "roofline",
    "round_trips",
    "spm_residency_limit",
    "striped_rows",
]
