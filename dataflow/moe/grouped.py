"""The `grouped` placement of a mixture-of-experts layer: every expert in one kernel.

`parallel` and `sequential` run one small kernel per expert, each paying a reconfiguration, a
DMA latency and its weights' transfer before it computes, and a dispatch kernel that copies
the tokens into expert order through DRAM. Here the experts are one grouped GEMM over the
dispatched rows:

    for e in experts, q in the panels of e (sparse), j in hidden (vector), kk in dim:
        w = W[e, kk, j]
        Yd[4q + u, j] += X[token_of_row[4q + u], kk] * w        u = 0 .. 3

Each expert's rows are padded to whole panels of `BLOCK_ROWS` (pad rows compute token 0 and
no choice reads them), so one weight row load feeds four rows' products, as a register block
(docs/conventions.md#register-blocking). X is gathered by token (the dispatch is folded into
the expert kernel: no Xd round trip through DRAM); W is affine in e, so the tiles over e
stream one expert's weights while the previous one computes. The compiler's generic search
(`plan.compile`: macc, the vector loop unrolled-and-jammed, copies sharing PEs) applies to all
experts at once. The program is gate -> experts ->
combine; the layer's values and floors are those of the other placements
(docs/conventions.md#register-blocking, section "MoE").

`compile_grouped` hands Yd from the experts to the combine in the SPM (`fetch="on_chip"`:
no write-back, no load; through DRAM when it does not fit), offers the gate compiled as the
dense GEMM it is (register blocks over packed X) and retiles the kernels by measuring the
whole program (docs/conventions.md#moe-buffers-handed-over-in-the-spm).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dataflow.dfg.graph import Addr, Buffer, BufferFetch, Kernel, Loop, Node, Program
from dataflow.dfg.lower import lower_gemm, run_passes
from dataflow.dfg.ops import Op
from dataflow.dynamic.lower import renamed
from dataflow.mapper.legality import check_mapping
from dataflow.mapper.map import map_kernel
from dataflow.mapper.mapping import KernelMapping, Mapping, MappingError
from dataflow.mapper.tiling import tile_and_allocate
from dataflow.moe.gating import Routing
from dataflow.moe.lower import combine_kernel, gate_kernel
from dataflow.plan.compile import compile_program
from dataflow.plan.retime import line_copies

#: dispatched rows per body (each expert's rows padded to a multiple): one weight row load
#: then feeds this many rows' products
BLOCK_ROWS = 4


def grouped_expert_kernel(panels: np.ndarray, tokens: int, dim: int, hidden: int,
                          block: int = BLOCK_ROWS, x_pitch: int | None = None,
                          x_buf: str = "X", yd_fetch: BufferFetch = BufferFetch.WHOLE,
                          x_fetch: BufferFetch = BufferFetch.WHOLE, x_base: int | None = None,
                          yd_base: int | None = None) -> Kernel:
    """Yd[r, :] = X[token_of_row[r], :] @ W[e] for the rows r of each expert e, `block` rows
    per body: panel q holds rows q * block .. q * block + block - 1, and expert e the panels
    panels[e] <= q < panels[e + 1] (a sparse loop, as a CSR row's nonzeros)."""
    experts, rows = len(panels) - 1, int(panels[-1]) * block
    pitch = dim if x_pitch is None else x_pitch
    nodes = [Node(0, Op.LOAD, buffer="W",
                  addr=Addr((("e", dim * hidden), ("kk", hidden), ("j", 1))), name="w")]
    carried = []
    for u in range(block):
        tok, x, mul, acc = (len(nodes) + i for i in range(4))
        nodes += [
            Node(tok, Op.LOAD, buffer="token_of_row", addr=Addr((("q", block),), const=u),
                 name=f"tok{u}"),
            Node(x, Op.GATHER, (tok,), buffer=x_buf, addr=Addr((("kk", 1),), index_stride=pitch),
                 name=f"x{u}"),
            Node(mul, Op.MUL, (x, 0), name=f"x{u}*w"),
            Node(acc, Op.ACC, (mul,), buffer="Yd",
                 addr=Addr((("q", block * hidden), ("j", 1)), const=u * hidden), name=f"y{u}+="),
        ]
        carried.append((acc, acc, 1))
    return Kernel(name="experts",
                  loops=(Loop("e", experts), Loop("q", pos="expert_panels", parent="e"),
                         Loop("j", hidden), Loop("kk", dim)),
                  nodes=tuple(nodes),
                  buffers=(Buffer("token_of_row", rows),
                           Buffer(x_buf, tokens * pitch, fetch=x_fetch, spm_base=x_base),
                           Buffer("W", experts * dim * hidden),
                           Buffer("Yd", rows * hidden, "output", fetch=yd_fetch,
                                  spm_base=yd_base)),
                  vector_var="j", carried=tuple(carried),
                  domain_arrays=(("expert_panels", np.asarray(panels, dtype=np.int64)),))


def padded_rows(routing: Routing, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(panels per expert as offsets, token of each padded row, padded row of each dispatched
    row): each expert's rows padded to a multiple of `block` with copies of token 0, whose
    results no choice reads."""
    n = routing.tokens_per_expert
    panels = np.concatenate(([0], np.cumsum(-(-n // block)))).astype(np.int64)
    token = np.zeros(int(panels[-1]) * block, dtype=np.int64)
    where = np.zeros(len(routing.token_of_row), dtype=np.int64)
    for e in range(len(n)):
        lo, hi = routing.offsets[e], routing.offsets[e + 1]
        dest = panels[e] * block + np.arange(hi - lo)
        token[dest] = routing.token_of_row[lo:hi]
        where[lo:hi] = dest
    return panels, token, where


def grouped_program(x, wg, w, routing: Routing, block: int = BLOCK_ROWS,
                    on_chip: bool = False, keep_x: bool = False) -> Program:
    """gate -> experts (one grouped kernel) -> combine, on the whole array. `on_chip`: the
    experts leave Yd in the SPM and the combine reads it there (no DRAM write and read back);
    `keep_x`: the gate reads the experts' copy of X (`X_PAD`) and leaves it in the SPM, where
    the experts gather from it (one DRAM read of X instead of two;
    docs/conventions.md#moe-buffers-handed-over-in-the-spm)."""
    (t, d), (e, _, h) = x.shape, w.shape
    k = routing.expert.shape[1]
    panels, token, where = padded_rows(routing, block)
    # the experts gather X's rows from a copy stored with one SPM row of pad per token when a
    # row is an even number of SPM rows long: a token's row then starts on another line than
    # its neighbour's, so the four rows' scalar gathers of one column do not all land on two
    # lines (`X_PAD`)
    pad = X_PAD if X_PAD and d % X_PAD == 0 and (d // X_PAD) % 2 == 0 else 0
    x_buf = "X" if not pad else "X_rows"
    # held buffers sit at fixed words in every kernel that holds them: X's rows from word 0,
    # Yd above them
    x_base = 0 if keep_x else None
    yd_base = -(-t * (d + pad) // HELD_ALIGN) * HELD_ALIGN if keep_x and on_chip else None
    yd_fetch = BufferFetch.ON_CHIP if on_chip else BufferFetch.WHOLE
    combine = combine_kernel(t, k, h)
    combine = dataclasses.replace(combine, buffers=tuple(
        dataclasses.replace(b, size=len(token) * h, fetch=yd_fetch, spm_base=yd_base)
        if b.name == "Yd" else b for b in combine.buffers))
    gate = gate_kernel(t, d, e)
    if keep_x:
        gate = _gate_reading(gate, x_buf, d + pad)

    def f32(v):
        return np.ascontiguousarray(v, dtype=np.float32).ravel()

    xp = np.zeros((t, d + pad), dtype=np.float32)
    xp[:, :d] = x
    experts = grouped_expert_kernel(
        panels, t, d, h, block, x_pitch=d + pad, x_buf=x_buf, yd_fetch=yd_fetch,
        x_fetch=BufferFetch.ON_CHIP if keep_x else BufferFetch.WHOLE, x_base=x_base,
        yd_base=yd_base)
    extra = (("X_rows", xp.ravel()),) if pad else ()
    return run_passes(Program(
        name=f"moe_grouped_{t}x{d}x{h}_e{e}_k{k}",
        kernels=(gate, experts, combine),
        inputs=(("X", f32(x)), *extra, ("Wg", f32(wg)), ("token_of_row", token), ("W", f32(w)),
                ("row_of", where[routing.row_of.ravel()]), ("gate", f32(routing.gate))),
        outputs=(("Y", (t, h)),), macs=t * d * e + len(routing.token_of_row) * d * h + t * k * h))


#: SPM words a held buffer's fixed base is rounded to (a whole number of SPM rows on every
#: preset)
HELD_ALIGN = 64


def _gate_reading(gate: Kernel, name: str, pitch: int) -> Kernel:
    """The gate reading X's rows from buffer `name`, `pitch` words apart, loaded whole and
    kept in the SPM from word 0 for the experts (`fetch="keep"`)."""
    tokens = gate.loops[0].extent

    def moved(n: Node) -> Node:
        if n.buffer != "X":
            return n
        terms = tuple((v, pitch if v == "i" else c) for v, c in n.addr.terms)
        return dataclasses.replace(n, buffer=name, addr=dataclasses.replace(n.addr, terms=terms))

    bufs = tuple(Buffer(name, tokens * pitch, fetch=BufferFetch.KEEP, spm_base=0)
                 if b.name == "X" else b for b in gate.buffers)
    return dataclasses.replace(gate, nodes=tuple(moved(n) for n in gate.nodes), buffers=bufs)


#: words of pad after each token's row of the experts' copy of X (`grouped_program`)
X_PAD = 8

#: SPM tiles tried for the grouped program's kernels (`retile_small_kernels`)
SMALL_KERNEL_TILES = (4, 2, 1)
#: the kernels retiled, in order: the small ones first, then the experts (fewer, larger
#: tiles of two or more experts' weights each: fewer DMA latencies, less overlap)
RETILED = ("combine", "gate", "experts")


def retile_small_kernels(mapping, arch, run, result=None):
    """(result, mapping) of the grouped program with the gate's and the combine's SPM tiles
    chosen by measuring the whole program: those kernels move a few hundred bytes to 2 KB per
    tile, and each transfer holds a DMA engine for the DRAM latency, so the mapper's 8 tiles
    (`mapper.tiling.MIN_TILES`, sized for overlap) run them at several times their compute;
    fewer, larger tiles pay the latency fewer times, and when the gate's loads land earlier
    the experts' weights are prefetched sooner (docs/conventions.md#moe-the-grouped-placement).
    The experts kernel is tried the same way last. `run(mapping)` simulates; the mapper's
    tiling stays a candidate, so the choice never loses to it; `result` is `run(mapping)`
    when the caller has it."""
    best_res, best = (run(mapping) if result is None else result), mapping
    for name in RETILED:
        i = next((i for i, km in enumerate(best.kernels) if km.kernel.name == name), None)
        if i is None:
            continue
        km = best.kernels[i]
        for tiles in SMALL_KERNEL_TILES:
            if len(km.tiles) <= tiles:
                continue
            for cand in _retiled(km, arch, -(-km.kernel.loops[0].extent // tiles)):
                trial = dataclasses.replace(
                    best, kernels=(*best.kernels[:i], cand, *best.kernels[i + 1:]))
                check_mapping(trial)
                res = run(trial)
                if res.cycles < best_res.cycles:
                    best_res, best = res, trial
    return best_res, best


def _retiled(km: KernelMapping, arch, rows: int) -> tuple[KernelMapping, ...]:
    """`km` in tiles of at most `rows` outer indices: its schedule as compiled (the search's
    post-passes kept; copies that split a tile's iterations then share fewer, longer tiles),
    and the kernel mapped afresh at that tiling."""
    tiles, allocs = tile_and_allocate(km.kernel, arch, max_tile_rows=rows)
    kept = dataclasses.replace(km, tiles=tiles, allocations=allocs)
    return kept, line_copies(map_kernel(km.kernel, arch, copies=km.copies,
                                        max_tile_rows=rows), arch)


@dataclasses.dataclass(frozen=True)
class GroupedCompile:
    """`compile_grouped`'s outcome: the simulated result and mapping of the chosen program,
    whether X and Yd were handed over in the SPM, and why not when they were not."""

    result: object  # SimResult
    mapping: object  # Mapping
    on_chip: bool
    note: str


def compile_grouped(x, wg, w, routing: Routing, arch, run, on_chip: bool = True
                    ) -> GroupedCompile:
    """The grouped program compiled and retiled (`retile_small_kernels`), with X and Yd handed
    over in the SPM (`on_chip`; docs/conventions.md#moe-buffers-handed-over-in-the-spm): the
    gate leaves the experts' copy of X there (one DRAM read of X), the experts leave Yd there
    for the combine (no write-back, no load). The same program with the gate compiled as the
    dense GEMM it is (its own layout of X, so the experts load theirs) is retiled too, and
    the faster kept. When the held buffers do not fit the SPM beside a kernel's others, the
    mapper refuses the handover (a MappingError naming them) and X and Yd go through DRAM, as
    the note says. `run(mapping)` simulates."""
    note, mapping = "", None
    if on_chip:
        try:
            mapping = compile_program(
                grouped_program(x, wg, w, routing, on_chip=True, keep_x=True), arch)
        except MappingError as err:
            note = f"X and Yd handed over through DRAM: held on chip they do not fit ({err})"
            on_chip = False
    if mapping is None:
        mapping = compile_program(grouped_program(x, wg, w, routing), arch)
    best = retile_small_kernels(mapping, arch, run)
    blocked = retile_small_kernels(_with_blocked_gate(mapping, x, wg, arch), arch, run)
    res, mapping = min((best, blocked), key=lambda rm: rm[0].cycles)
    return GroupedCompile(res, mapping, on_chip, note)


#: the GEMM lowering's buffers -> the gate's: X and Wg as the gate's blocking stores them
#: (packed in panels where `compile_gemm` chose that), and its logits
GATE_BUFFERS = {"A": "X_gate", "B": "Wg_gate", "C": "logits"}


def _renamed_mapping(km: KernelMapping, names: dict[str, str], name: str) -> KernelMapping:
    """`km` with its kernel named `name` and its buffers renamed (allocations, tile windows)."""
    tiles = tuple(dataclasses.replace(t, windows=tuple(sorted(
        (names.get(b, b), lo, hi) for b, lo, hi in t.windows))) for t in km.tiles)
    allocs = tuple(dataclasses.replace(a, buffer=names.get(a.buffer, a.buffer))
                   for a in km.allocations)
    return dataclasses.replace(km, kernel=renamed(km.kernel, names, name), allocations=allocs,
                               tiles=tiles)


def _with_blocked_gate(mapping: Mapping, x, wg, arch) -> Mapping:
    """`mapping` with its gate compiled as the dense GEMM it is: `compile_gemm`'s register
    blocks over packed panels of X (on mlx_4x4 8 rows of X share each Wg row load, 504
    compute cycles against the generic schedule's 856), its operands program inputs in the
    layout the blocking reads. A copy of X the generic gate kept in the SPM for the experts
    is then theirs to load (their schedule kept, their tiles and SPM allocation redone)."""
    gemm = compile_program(lower_gemm(x, wg), arch)
    gate = _renamed_mapping(gemm.kernels[0], GATE_BUFFERS, "gate")
    kept = {b.name for b in mapping.kernels[0].kernel.buffers if b.fetch == BufferFetch.KEEP}
    kms = [gate]
    for km in mapping.kernels[1:]:
        if any(b.name in kept and b.on_chip for b in km.kernel.buffers):
            kernel = dataclasses.replace(km.kernel, buffers=tuple(
                dataclasses.replace(b, fetch=BufferFetch.WHOLE, spm_base=None)
                if b.name in kept else b for b in km.kernel.buffers))
            tiles, allocs = tile_and_allocate(kernel, arch, max_tile_rows=max(
                t.hi - t.lo for t in km.tiles))
            km = dataclasses.replace(km, kernel=kernel, tiles=tiles, allocations=allocs)
        kms.append(km)
    prog = mapping.program
    prog = dataclasses.replace(
        prog, kernels=tuple(km.kernel for km in kms),
        inputs=prog.inputs + tuple((GATE_BUFFERS[n], v) for n, v in gemm.program.inputs))
    prog.verify()
    out = dataclasses.replace(mapping, program=prog, kernels=tuple(kms))
    check_mapping(out)
    return out
