"""`map_program(program, arch) -> Mapping`: the mapper's entry point."""

from __future__ import annotations

import heapq

from dataflow.arch.spec import ArchSpec, PEKind
from dataflow.cachefiles import BoundedCache
from dataflow.dfg.graph import Kernel, Program, vector_nodes
from dataflow.mapper.bounds import issue_copies, rec_mii, res_mii
from dataflow.mapper.legality import check_kernel_mapping, check_mapping
from dataflow.mapper.mapping import KernelMapping, Mapping, MappingError, SystolicMapping
from dataflow.mapper.schedule import (
    DEFAULT_EFFORT,
    Effort,
    anneal,
    delay_sources,
    schedule_kernel,
)
from dataflow.mapper.tiling import tile_and_allocate

DATAFLOWS = ("os", "ws", "is")
SCHEDULE_MEMO_ENTRIES = 512  # (arch, body, copies, II) attempts kept per process (LRU)

#: `schedule_kernel`'s outcome per (arch, body, copies, II): legal placements and routes, or
#: the failure sentence (docs/planning_speed.md#schedules-of-identical-bodies)
SCHEDULES = BoundedCache(SCHEDULE_MEMO_ENTRIES)


def body_key(kernel: Kernel) -> tuple:
    """Everything of a kernel `schedule_kernel` reads: each node's op, inputs and vector-ness
    (link flits). Not addresses, buffers or loops: bodies with equal keys get the same
    placements and routes, and differ only in tiles, SPM allocation and register pressure,
    which `check_kernel_mapping` checks per kernel."""
    vec = vector_nodes(kernel)
    return tuple((n.op, n.inputs, n.id in vec) for n in kernel.nodes)


def _schedule(kernel: Kernel, arch: ArchSpec, copies: int, ii: int, diag: list[str],
              effort: Effort = DEFAULT_EFFORT):
    """`schedule_kernel`, memoised on (arch, `body_key`, copies, II, effort). It is
    deterministic (its random moves are seeded), so a hit returns what the call would: the
    stage bodies a butterfly repeats across layers, FNet's sequence and hidden FFTs, and the
    copy counts `stage_mapping._more_copies` and a retry with more slack probe again are
    scheduled once."""
    key = (arch, body_key(kernel), copies, ii, effort)
    hit = SCHEDULES.get(key)
    if hit is None:
        why: list[str] = []
        got = schedule_kernel(kernel, arch, copies, ii, why, effort)
        if got is not None:
            got = (tuple(got[0]), tuple(got[1]))
        hit = (got, why[-1] if why else None)
        SCHEDULES.put(key, hit)
    got, message = hit
    if message is not None:
        diag.append(message)
    return got


def _score(copies: int, ii: int) -> tuple[float, int]:
    """Throughput (iterations per cycle) first; at equal throughput the shorter II (fewer
    copies: less fill and drain per tile)."""
    return (copies / ii, -ii)


IMPROVERS = (None, "anneal")


def map_kernel(kernel: Kernel, arch: ArchSpec, copies: int | None = None,
               max_ii_slack: int = 8, max_tile_rows: int | None = None,
               improve: str | None = None, seed: int = 0,
               late_sources: bool = False, effort: Effort = DEFAULT_EFFORT) -> KernelMapping:
    """Modulo-schedule `kernel`, choosing the number of body copies that maximises throughput
    (copies / II). `improve="anneal"` runs simulated annealing on the chosen schedule (shorter
    schedule, fewer link hops; same II). `late_sources`: each source load issued as late as
    its consumers allow (`schedule.delay_sources`: shorter register lifetimes, so a body
    whose operands wait on a long chain fits the registers). `effort`:
    `schedule_kernel`'s placement attempts and negotiation limits. Raises MappingError naming the
    resource that ran out, with the numbers, when nothing fits."""
    if improve not in IMPROVERS:
        raise MappingError(f"unknown improvement pass {improve!r}; choose one of {IMPROVERS}")
    n_nodes = len(kernel.nodes)
    pes = arch.pe_array.num_pes
    limit = arch.pe_array.instruction_entries
    if n_nodes > pes * limit:
        raise MappingError(
            f"kernel {kernel.name!r} has {n_nodes} nodes but the array holds "
            f"pe_array.rows x cols x instruction_entries = {pes} x {limit} = {pes * limit}")
    for n in kernel.nodes:
        try:
            arch.fu_for(n.op.value)
        except KeyError as exc:
            raise MappingError(f"kernel {kernel.name!r} node %{n.id}: {exc.args[0]} "
                               "(pe_array.functional_units)") from None
    tiles, allocs = tile_and_allocate(kernel, arch, max_tile_rows)
    rec = rec_mii(kernel, arch)
    # as many copies as issue at II 1 (docs/architecture.md#issue-width), down to one
    candidates = [copies] if copies else list(range(max(1, issue_copies(kernel, arch)), 0, -1))
    best, why = _best_schedule(kernel, arch, candidates, rec, max_ii_slack, allocs, tiles,
                               late_sources, effort)
    if best is None:
        u = min(why) if why else 1
        raise MappingError(f"kernel {kernel.name!r}: no legal modulo schedule found up to "
                           f"II = MII + {max_ii_slack} ({len(candidates)} copy counts tried); "
                           f"with {u} cop{'y' if u == 1 else 'ies'} {why.get(u, '')}")
    if improve == "anneal":
        placements, routes = anneal(kernel, arch, best.ii, best.placements, best.routes, seed=seed)
        km = _kernel_mapping(kernel, best.copies, best.ii, best.res_mii, best.rec_mii,
                             (placements, routes), allocs, tiles,
                             notes=((f"annealed: schedule length {best.schedule_length} -> "
                                     f"{max(p.time + p.latency for p in placements)}"),))
        try:
            check_kernel_mapping(km, arch)
            best = km
        except MappingError:
            pass  # keep the legal schedule; annealing only ever offers improvements
    return best


def _best_schedule(kernel, arch, candidates, rec, max_ii_slack, allocs, tiles,
                   late_sources=False, effort=DEFAULT_EFFORT):
    """(the best legal mapping or None, copies -> last reason an attempt failed).

    Best first: (copies, II) pairs are tried in falling `_score` order, each copy count from
    its MII up to MII + max_ii_slack, so the first legal schedule is the best one there is and
    nothing worse is ever scheduled (trying every copy count from the most down scheduled
    hundreds of large bodies on a large array first, each beaten later by fewer copies at a
    shorter II)."""
    heap = []
    for u in candidates:
        res = res_mii(kernel, arch, u)
        mii = max(res, rec)
        heap.append((tuple(-x for x in _score(u, mii)), u, mii, mii, res))
    heapq.heapify(heap)
    why: dict[int, str] = {}
    while heap:
        _, u, ii, mii, res = heapq.heappop(heap)
        if ii < mii + max_ii_slack:
            heapq.heappush(heap, (tuple(-x for x in _score(u, ii + 1)), u, ii + 1, mii, res))
        diag: list[str] = []
        got = _schedule(kernel, arch, u, ii, diag, effort)
        if got is None:
            why[u] = f"at II = {ii}: {diag[-1]}" if diag else f"at II = {ii}"
            continue
        if late_sources:
            got = delay_sources(kernel, arch, ii, *got)
        km = _kernel_mapping(kernel, u, ii, res, rec, got, allocs, tiles)
        try:
            check_kernel_mapping(km, arch)
        except MappingError as exc:
            why[u] = f"at II = {ii}: {exc}"
            continue
        return km, why
    return None, why


def _kernel_mapping(kernel, copies, ii, res, rec, got, allocs, tiles, notes=()) -> KernelMapping:
    placements, routes = got
    placements = sorted(placements, key=lambda p: (p.copy, p.node))
    length = max(p.time + p.latency for p in placements)
    return KernelMapping(kernel=kernel, copies=copies, ii=ii, res_mii=res, rec_mii=rec,
                         schedule_length=length, placements=tuple(placements),
                         routes=tuple(routes), allocations=allocs, tiles=tiles, notes=notes)


def map_program(program: Program, arch: ArchSpec, dataflow: str | None = None,
                verify: bool = True, **options) -> Mapping:
    """Map every kernel of `program` onto `arch`.

    On a systolic array a dense GEMM kernel gets a `SystolicMapping` with `dataflow` (os, ws,
    is; default os). On a reconfigurable array kernels are modulo-scheduled and run one after
    another (reconfiguring in between).
    """
    if verify:
        program.verify()
    kernels = []
    for k in program.kernels:
        if arch.pe_array.kind == PEKind.SYSTOLIC:
            gemm = program.gemm
            if gemm is None:
                raise MappingError(f"systolic array {arch.name!r} runs only dense GEMM; "
                                   f"program {program.name!r} is not one")
            df = dataflow or "os"
            if df not in DATAFLOWS:
                raise MappingError(f"unknown systolic dataflow {df!r}; choose one of {DATAFLOWS}")
            kernels.append(SystolicMapping(kernel=k, dataflow=df, rows=arch.pe_array.rows,
                                           cols=arch.pe_array.cols, m=gemm.m, n=gemm.n,
                                           k=gemm.k, a_addresses=gemm.a_addresses))
        else:
            kernels.append(map_kernel(k, arch, **options))
    mapping = Mapping(program=program, arch=arch, kernels=tuple(kernels))
    if verify:
        check_mapping(mapping)
    return mapping
