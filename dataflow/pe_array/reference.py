"""The reference engine: steps every cycle, every PE, every SPM line. Slow; small cases only.

Semantics (the same as `fast.py`'s, which must give identical `ArrayResult`s; neither engine
imports the other, and the value and write-back rules both follow live in `semantics.py`):
- A tile's n iterations are cut into U contiguous chunks of W = ceil(n / U): iteration k runs
  on body copy k div W in wave k mod W. A PE holds up to `pe_array.issue_width` ops per slot
  (time mod II), each on its own functional unit; in cycle c it executes the ops in slot
  c mod II, in placement order, each for the wave whose start `wave * II + time` equals c
  (docs/architecture.md#issue-width: the order within a PE changes nothing observable).
- All PEs of the array move in lock step: when the SPM line accesses issued in one cycle need
  more port-cycles than a line has ports, the whole array waits for the busiest line.
- SPM updates (acc, accmax, store, scatter) commit in (cycle, iteration, node) order, at the
  end of the cycle they issue in (`semantics.commit_order`, `semantics.commit`). An acc
  adds into (an accmax takes the maximum with) its PE's register and flushes (one SPM
  read-modify-write) when its copy's next iteration targets another address or the copy's
  chunk ends. A scatter_acc is an acc whose address adds a loaded index; lanes of one access
  that hit the same word take one write access per repeat (see `fast.py`).
- A held load reads the SPM only when its address differs from its copy's previous
  iteration's (docs/conventions.md#held-loads); its value is the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.domain import iterate_domain
from dataflow.dfg.graph import Node, vector_nodes
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import KernelMapping, Placement, Tile
from dataflow.pe_array.common import (
    Counters,
    buffer_arrays,
    gather_fetch_words,
    spm_base,
    tile_result,
)
from dataflow.pe_array.result import ArrayResult, TileResult
from dataflow.pe_array.semantics import (
    ACC_IDENTITY,
    ACC_UFUNC,
    apply_op,
    commit,
    commit_order,
    operands,
    stored_value,
)
from dataflow.spm.lines import StoreQueues, line_of_row, port_cycles


@dataclass(frozen=True, eq=False)
class _Kernel:
    """What every cycle of one mapped kernel reads: the mapping, the arch, lanes per access,
    the vector nodes, each PE's ops per slot (`slot_of[pe][time mod II]`, PEs in row-major
    order, a slot's ops in placement order) and the routes into each (copy, node)."""

    km: KernelMapping
    arch: ArchSpec
    dtype: object
    lanes: int
    vec: frozenset
    slot_of: dict[tuple[int, int], dict[int, list[Placement]]]
    routes_into: dict[tuple[int, int], list]
    bufs: dict[str, np.ndarray]
    fetched: dict[str, int]
    trace: bool


@dataclass
class _Tile:
    """One tile in progress: its iterations, waves per copy, node values per (iteration,
    node), accumulation registers per (copy, node), stall cycles so far, store queues."""

    index: int
    tile: Tile
    iters: list[dict[str, int]]
    waves: int
    sq: StoreQueues | None
    values: dict[tuple[int, int], object] = field(default_factory=dict)
    regs: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    stall: int = 0


@dataclass(frozen=True)
class _Update:
    """One SPM update issued in a cycle, committed at the cycle's end."""

    iteration: int
    node: int
    op: Op
    buffer: str
    addr: np.ndarray
    vals: np.ndarray


@dataclass
class _Cycle:
    """One cycle's SPM traffic: rows read (one access per row: the line broadcasts it), row
    writes per line, and the updates to commit."""

    cycle: int
    read_rows: set[int]
    writes_line: np.ndarray
    updates: list[_Update] = field(default_factory=list)


def run_kernel_reference(km: KernelMapping, arch: ArchSpec, inputs: dict[str, np.ndarray], dtype,
                         trace: bool = False) -> ArrayResult:
    """Run one mapped kernel cycle by cycle; with `trace`, every issue as (cycle, PE, op)."""
    kernel = km.kernel
    bufs = buffer_arrays(kernel, inputs, dtype)
    ctx = _Kernel(km=km, arch=arch, dtype=dtype,
                  lanes=arch.pe_array.simd_lanes if kernel.vector_var else 1,
                  vec=frozenset(vector_nodes(kernel)), slot_of=_slots(km),
                  routes_into=_routes_into(km), bufs=bufs,
                  # indirect-DMA words per gather-fetched input
                  fetched=gather_fetch_words(kernel, inputs, arch), trace=trace)
    ct = Counters(arch)
    events: list[tuple[int, tuple[int, int], str]] = []
    elapsed = 0  # cycles of the tiles before this one, stalls included
    for ti, tile in enumerate(km.tiles):
        res = _run_tile(ctx, ct, events, elapsed, ti, tile)
        ct.tiles.append(res)
        elapsed += res.compute_cycles
    return ct.result(kernel, bufs, tuple(events) if trace else None)


def _slots(km: KernelMapping) -> dict[tuple[int, int], dict[int, list[Placement]]]:
    """slot_of[pe][time mod II]: the placements a PE issues in that slot (up to
    `pe_array.issue_width`, in placement order), PEs in row-major order (the order the array
    is scanned each cycle)."""
    slot_of: dict[tuple[int, int], dict[int, list[Placement]]] = {}
    for p in km.placements:
        slot_of.setdefault(p.pe, {}).setdefault(p.time % km.ii, []).append(p)
    return dict(sorted(slot_of.items()))


def _routes_into(km: KernelMapping) -> dict[tuple[int, int], list]:
    """The routes that carry an operand into each (copy, node)."""
    routes: dict[tuple[int, int], list] = {}
    for r in km.routes:
        routes.setdefault((r.copy, r.dst), []).append(r)
    return routes


def _run_tile(ctx: _Kernel, ct: Counters, events: list, elapsed: int, ti: int,
              tile: Tile) -> TileResult:
    """One tile, cycle by cycle, then its store queues drain."""
    km, kernel, spm = ctx.km, ctx.km.kernel, ctx.arch.spm
    iters = list(iterate_domain(kernel, ctx.lanes, (tile.lo, tile.hi)))
    n = len(iters)
    if n == 0:
        return tile_result(kernel, ti, 0, 0, 0, km, ctx.arch, tile, ctx.fetched)
    st = _Tile(index=ti, tile=tile, iters=iters, waves=-(-n // km.copies),
               sq=StoreQueues(spm) if spm.write_queue_depth else None)
    n_cycles = (st.waves - 1) * km.ii + km.schedule_length
    for cyc in range(n_cycles):
        _step_cycle(ctx, ct, st, events, elapsed, cyc)
    if st.sq is not None:
        s_t, extra = st.sq.drain()
        st.stall += s_t
        ct.conflicts_line += extra
    return tile_result(kernel, ti, n, n_cycles + st.stall, st.stall, km, ctx.arch, tile,
                       ctx.fetched)


def _step_cycle(ctx: _Kernel, ct: Counters, st: _Tile, events: list, elapsed: int,
                cyc: int) -> None:
    """One array cycle: every PE issues its slot's ops, the SPM ports serve the cycle's row
    accesses (stalling the whole array), then the cycle's updates commit."""
    now = _Cycle(cycle=cyc, read_rows=set(),
                 writes_line=np.zeros(ctx.arch.spm.lines, dtype=np.int64))
    for pe, slots in ctx.slot_of.items():
        for p in slots.get(cyc % ctx.km.ii, ()):
            if cyc < p.time:
                continue
            wave = (cyc - p.time) // ctx.km.ii
            k = p.copy * st.waves + wave
            if wave >= st.waves or k >= len(st.iters):
                continue
            if ctx.trace:
                events.append((elapsed + cyc + st.stall, pe,
                               ctx.km.kernel.nodes[p.node].op.value))
            _issue(ctx, ct, st, now, p, wave, k)
    st.stall += _serve_ports(ctx, ct, st, now)
    _commit_cycle(ctx, now)


def _issue(ctx: _Kernel, ct: Counters, st: _Tile, now: _Cycle, p: Placement, wave: int,
           k: int) -> None:
    """Placement `p` executes iteration k: counts, then its value or its SPM access."""
    kernel = ctx.km.kernel
    node = kernel.nodes[p.node]
    env = st.iters[k]
    act = (min(ctx.lanes, kernel.vector_extent - env[kernel.vector_var])
           if kernel.vector_var else 1)
    is_vec = node.id in ctx.vec
    ct.busy[p.pe] += 1
    ct.op_counts[node.op.value] += act if is_vec else 1
    for route in ctx.routes_into.get((p.copy, node.id), ()):
        ct.link_word_hops += len(route.links) * (act if route.src in ctx.vec else 1)
    if not node.op.is_memory:
        st.values[(k, node.id)] = apply_op(
            node.op, operands(node, [st.values[(k, i)] for i in node.inputs]), ctx.dtype,
            node.value)
        return
    addrs = _lane_addresses(ctx, st, node, env, k, act)
    if node.op.accumulates and not _accumulate(ctx, st, p, node, wave, k):
        return  # keep accumulating in the register: no SPM access
    if not _held(ctx, st, node, wave, k):
        _count_rows(ctx, st, now, node, addrs)
    _access(ctx, st, now, node, k, addrs)


def _lane_addresses(ctx: _Kernel, st: _Tile, node: Node, env: dict[str, int], k: int,
                    act: int) -> list[int]:
    """Word addresses of the access's `act` live lanes (one for a scalar access); an indirect
    one adds its loaded index times the stride."""
    kernel = ctx.km.kernel
    base = node.addr.const + sum(cf * env[v] for v, cf in node.addr.terms
                                 if v != kernel.vector_var or node.addr.span)
    if node.addr.index_stride:
        idx = np.asarray(st.values[(k, node.inputs[0])]).reshape(-1)
        base += node.addr.index_stride * int(idx[node.lane or 0])
    if node.id not in ctx.vec:
        return [base]
    if node.addr.span:  # consecutive words, lanes along memory
        return [base + lane for lane in range(min(node.addr.span, ctx.lanes))]
    cv = node.addr.coef(kernel.vector_var)
    base += cv * env[kernel.vector_var]
    return [base + lane * cv for lane in range(act)]


def _accumulate(ctx: _Kernel, st: _Tile, p: Placement, node: Node, wave: int, k: int) -> bool:
    """Combine iteration k's value into the PE's register; True when the register flushes
    (the copy's next iteration targets another address, or the copy's chunk ends), leaving
    the register's value as the node's value of iteration k."""
    v = np.asarray(stored_value(node, [st.values[(k, i)] for i in node.inputs], ctx.dtype),
                   dtype=ctx.dtype)
    v = np.broadcast_to(v, (ctx.lanes,)) if node.id in ctx.vec else v.reshape(1)
    key = (p.copy, node.id)
    start = np.full(len(v), ACC_IDENTITY[node.op], ctx.dtype)
    st.regs[key] = ACC_UFUNC[node.op](st.regs.get(key, start), v)
    nxt = k + 1
    kernel = ctx.km.kernel
    same = (wave + 1 < st.waves and nxt < len(st.iters)
            and _address(node, st.iters[nxt], kernel, ctx.bufs)
            == _address(node, st.iters[k], kernel, ctx.bufs))
    if same:
        return False
    st.values[(k, node.id)] = st.regs.pop(key)
    return True


def _held(ctx: _Kernel, st: _Tile, node: Node, wave: int, k: int) -> bool:
    """Whether a held load reuses its PE's register (docs/conventions.md#held-loads): its
    copy's previous iteration (the wave before, in the same chunk) read the same address."""
    if not node.hold or wave == 0:
        return False
    kernel = ctx.km.kernel
    return (_address(node, st.iters[k - 1], kernel, ctx.bufs)
            == _address(node, st.iters[k], kernel, ctx.bufs))


def _count_rows(ctx: _Kernel, st: _Tile, now: _Cycle, node: Node, addrs: list[int]) -> None:
    """The SPM rows an access touches: each distinct row once, and for SCATTER_ACC the r-th
    lane on a word in the r-th write access of its row."""
    spm = ctx.arch.spm
    sbase, wlo = spm_base(ctx.km, node.buffer, st.index, st.tile)
    if node.op is Op.SCATTER_ACC:
        seen: dict[int, int] = {}
        ranked = set()
        for a in addrs:
            ranked.add(((sbase + a - wlo) // spm.words_per_row, seen.get(a, 0)))
            seen[a] = seen.get(a, 0) + 1
        spm_rows = [row for row, _ in sorted(ranked)]
    else:
        spm_rows = sorted({(sbase + a - wlo) // spm.words_per_row for a in addrs})
    for row in spm_rows:
        if node.op.reads_spm:
            now.read_rows.add(row)
        if node.op.writes_spm:
            now.writes_line[int(line_of_row(row, spm))] += 1


def _access(ctx: _Kernel, st: _Tile, now: _Cycle, node: Node, k: int, addrs: list[int]) -> None:
    """A load's value (dead lanes zero), or an update queued for the end of the cycle."""
    buf = ctx.bufs[node.buffer]
    is_vec = node.id in ctx.vec
    if node.op in (Op.LOAD, Op.GATHER):
        if is_vec:
            v = np.zeros(ctx.lanes, dtype=buf.dtype)
            v[:len(addrs)] = buf[addrs]
        else:
            v = buf[addrs[0]]
        st.values[(k, node.id)] = v
        return
    src = np.asarray(st.values[(k, node.id if node.op.accumulates else node.inputs[-1])])
    src = np.broadcast_to(src, (ctx.lanes,)) if is_vec else src.reshape(1)
    now.updates.append(_Update(k, node.id, node.op, node.buffer,
                               np.array(addrs, dtype=np.int64), src[:len(addrs)]))


def _serve_ports(ctx: _Kernel, ct: Counters, st: _Tile, now: _Cycle) -> int:
    """Stall cycles of this cycle: the busiest line's port-cycles beyond one (or the store
    queues' verdict); counts reads, writes and conflict cycles per line into `ct`."""
    spm = ctx.arch.spm
    rd = np.zeros(spm.lines, dtype=np.int64)
    for row in now.read_rows:
        rd[int(line_of_row(row, spm))] += 1
    if st.sq is not None:
        s_t, need = st.sq.cycle(rd, now.writes_line)
    else:
        need = port_cycles(rd, now.writes_line, spm) - 1
        s_t = int(need.max())
    ct.reads_line += rd
    ct.writes_line += now.writes_line
    ct.conflicts_line += need
    return s_t


def _commit_cycle(ctx: _Kernel, now: _Cycle) -> None:
    """Commit the cycle's updates in the semantics' order."""
    if not now.updates:
        return
    order = commit_order([now.cycle] * len(now.updates), [u.iteration for u in now.updates],
                         [u.node for u in now.updates])
    for i in order:
        u = now.updates[i]
        commit(u.op, ctx.bufs[u.buffer], u.addr, u.vals)


def _address(node: Node, env: dict[str, int], kernel, bufs: dict[str, np.ndarray]) -> int:
    """Lane-0 word address of an access in iteration `env`; an indirect one adds its loaded
    index (read from the buffer: a kernel never loads a buffer it writes)."""
    a = node.addr.const + sum(cf * env[v] for v, cf in node.addr.terms)
    if node.addr.index_stride:
        idx = kernel.nodes[node.inputs[0]]
        # a gather selecting lane l of a row load reads the row's word l
        at = _address(idx, env, kernel, bufs) + (node.lane or 0)
        a += node.addr.index_stride * int(bufs[idx.buffer][at])
    return a
