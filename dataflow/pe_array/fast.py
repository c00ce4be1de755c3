"""The fast engine: one tile at a time, vectorised over all iterations with numpy.

Same semantics as `reference.py`, which steps every cycle: the tile's n iterations are cut
into U contiguous chunks of W = ceil(n / U); iteration k runs on body copy k div W in wave
k mod W, so node n of it issues at cycle wave*II + t(copy, n). An ACC node accumulates in its
PE's register and reads-modifies-writes the SPM once per run of consecutive same-address
iterations of its copy. A held load reads the SPM only in the iterations whose address differs
from its copy's previous one (docs/conventions.md#held-loads). SPM row accesses are counted
per (cycle, line) from the real address streams; a cycle whose busiest line needs p
port-cycles stalls the whole (lock-step) array p - 1 cycles. SPM updates commit in the order
`semantics.py` defines (cycle, iteration, node, lane), which also says how each op writes
back.

SCATTER_ACC (PIT's SWrite with accumulate, docs/references.md#pit) is an ACC whose address adds a
loaded index: it combines in the register over a run like ACC and read-modify-writes once per
run; every update to one word is applied in commit order, so the value is exact for that order.
Port cost: distinct SPM rows of one access are one row access each, as for any vector access,
but lanes that hit the same word must be serialised: the r-th lane to hit a word goes in the
r-th row access, so a row costs as many write accesses as its most-hit word has hits (its reads,
like every read of one row in one cycle, are one broadcast access). Different copies (PEs)
updating the same row in one cycle are separate accesses, as always, and serialise on the
line's ports (the stall arithmetic below).

Shortcuts that keep the results identical (accumulator runs folded by length, `fast_fold.py`;
addresses as lane 0 plus a stride; the tile timing memo, `fast_memo.py`):
docs/architecture.md#engine-speed-exact-shortcuts-of-the-fast-engine; address sums shared per
term set, compiled gathers, grouped MACC folds: docs/architecture.md#sharing-and-compiled-gathers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.domain import enumerate_domain
from dataflow.dfg.graph import Node
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import KernelMapping, Tile
from dataflow.pe_array import fast_reads
from dataflow.pe_array.common import (
    Counters,
    lane_addresses,
    spm_base,
    tile_result,
)
from dataflow.pe_array.fast_fold import (
    group_macc_fold,
    macc_fold,
    macc_groups_on,
    segment_fold,
)
from dataflow.pe_array.fast_memo import MEMO_STATS, RUNS, _Shifted, _TileCounts, _TimingMemo
from dataflow.pe_array.fast_policy import compiled_fold_pays
from dataflow.pe_array.result import TileResult
from dataflow.pe_array.semantics import (
    ACC_IDENTITY,
    ACC_UFUNC,
    apply_op,
    commit,
    commit_order,
    operands,
    stored_value,
)


@dataclass(frozen=True, eq=False)
class _Kernel:
    """What every tile of one mapped kernel reads: the mapping, the arch, lanes per access,
    the vector nodes, and `times[copy, node]`, the node's issue time in its copy (cycles)."""

    km: KernelMapping
    arch: ArchSpec
    dtype: object
    lanes: int
    vec: frozenset
    times: np.ndarray
    bufs: dict[str, np.ndarray]
    fetched: dict[str, int]
    # (iteration, copy, wave, all-live scalar mask) arrays by tile iteration count: tiles of
    # one size share them (read-only)
    layouts: dict = field(default_factory=dict)
    # MACC node id -> the ids of its group: MACCs of one term set and the same two inputs,
    # each taking one lane of input 0 (a GEMM's outer product), folded in one compiled call
    macc_groups: dict = field(default_factory=dict)
    # node id -> its lane-0 address's loop terms (`_affine_terms`), computed once per kernel
    terms: dict = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class _Waves:
    """Where a tile's n iterations run: iteration k on copy k // waves in wave k % waves;
    `active[k]` lanes of iteration k are live (`mask`, (n, lanes); `live` in all, `full` when
    every lane of every iteration is); the tile's schedule lasts `n_cycles` cycles before
    stalls."""

    n: int
    k: np.ndarray
    copy: np.ndarray
    wave: np.ndarray
    waves: int
    n_cycles: int
    active: np.ndarray
    mask: np.ndarray
    live: int = 0
    full: bool = False
    ones_mask: np.ndarray | None = None  # (n, 1) all live: a scalar access's mask, shared
    # per tile: affine address sums by term set (`_affine_base`), flush iterations by term set
    bases: dict = field(default_factory=dict)
    base_range: dict = field(default_factory=dict)
    flush_sel: dict = field(default_factory=dict)
    group_regs: dict = field(default_factory=dict)  # a MACC group's folded registers by node
    # a dense nest's loop values per axis in loop order (`enumerate_domain`'s order is their
    # row-major product), else None
    axes: dict | None = None


@dataclass(frozen=True, eq=False)
class _Writes:
    """SPM updates of one node: per update its issue cycle, iteration, addresses and values
    ((m, width)), and which lanes are live."""

    cycle: np.ndarray
    iteration: np.ndarray
    node: int
    addr: np.ndarray
    vals: np.ndarray
    mask: np.ndarray
    op: Op
    buffer: str


@dataclass
class _TileAccesses:
    """A tile's SPM traffic as it is issued: row reads (cycle, row), row writes as
    cycle * lines + line keys, and the updates to commit at the end of the tile."""

    reads: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    write_keys: list[np.ndarray] = field(default_factory=list)
    writes: list[_Writes] = field(default_factory=list)
    # row counts deferred until the tile's timing is known not to be memoised:
    # (node, addresses, live lanes, cycles) per access stream
    rows: list[tuple] = field(default_factory=list)
    # per memory node: (buffer, SPM word of lane 0 per iteration (`_Shifted`), lowest and
    # highest SPM word any lane may touch); the tile's address pattern (`_TimingMemo`)
    pattern: list[tuple[str, _Shifted, int, int]] = field(default_factory=list)
    indirect: dict = field(default_factory=dict)  # (terms, index, stride) -> (words, lo, hi)


def _issue_times(km: KernelMapping) -> np.ndarray:
    """times[copy, node]: the cycle a node issues in its copy's schedule."""
    times = np.zeros((km.copies, len(km.kernel.nodes)), dtype=np.int64)
    for p in km.placements:
        times[p.copy, p.node] = p.time
    return times


def tile_layout(ctx: _Kernel, ti: int, tile: Tile, layouts: dict | None) -> tuple:
    """(domain, iterations, `_Waves`) of a tile: an earlier run's (`_RunMemo`) when kept, else
    made (and kept); (None, 0, None) for an empty tile."""
    got = layouts.get(ti) if layouts is not None else None
    if got is not None and got[0] == (tile.lo, tile.hi):
        _, dom, n, w = got
        w.group_regs.clear()
        return dom, n, w
    kernel = ctx.km.kernel
    dom = enumerate_domain(kernel, ctx.lanes, (tile.lo, tile.hi))
    n = len(dom[kernel.loops[0].var])
    if n == 0:
        return None, 0, None
    w = _waves(ctx, dom, n, _dense_axes(ctx, tile))
    if layouts is not None:
        RUNS.put_layout(layouts, ti, ((tile.lo, tile.hi), dom, n, w))
    return dom, n, w


def _run_tile(ctx: _Kernel, ct: Counters, ti: int, tile: Tile,
              timing: _TimingMemo | None = None, layout: tuple | None = None) -> TileResult:
    """One tile: issue every node over all iterations, count SPM ports, commit the updates."""
    km, kernel = ctx.km, ctx.km.kernel
    dom, n, w = layout or tile_layout(ctx, ti, tile, timing.layouts if timing else None)
    if n == 0:
        return tile_result(kernel, ti, 0, 0, 0, km, ctx.arch, tile, ctx.fetched)
    acc = _TileAccesses()
    vals: dict[int, np.ndarray] = {}
    for node in kernel.nodes:
        _issue_node(ctx, ct, w, dom, vals, acc, node, ti, tile)
    known = timing.recall(w, acc.pattern, ti) if timing is not None else None
    MEMO_STATS["tiles"] += 1
    MEMO_STATS["hits"] += known is not None
    if known is None:
        before = _TileCounts.of(ct)
        _count_busy_and_links(ctx, ct, w)
        for node, at, cyc in acc.rows:
            cyc = _cycles(ctx, w, node) if cyc is None else cyc
            fast_reads.count_rows(ctx, acc, node, at, cyc, ti, tile)
        stall = fast_reads.port_stalls(acc, ct, ctx.arch.spm, w.n_cycles)
        if timing is not None:
            timing.remember(w, acc.pattern, _TileCounts.of(ct).minus(before), stall, ti)
    else:
        counts, stall = known
        counts.add_to(ct)
    _apply_writes(acc.writes, ctx.bufs)
    return tile_result(kernel, ti, n, w.n_cycles + stall, stall, km, ctx.arch, tile, ctx.fetched)


def _dense_axes(ctx: _Kernel, tile: Tile) -> dict[str, np.ndarray] | None:
    """Each loop's values when every loop is dense (the tile's range of the outer one, the
    vector loop in steps of the lanes): the domain is their row-major product."""
    kernel = ctx.km.kernel
    if not all(lp.is_dense for lp in kernel.loops):
        return None
    axes = {kernel.loops[0].var: np.arange(tile.lo, tile.hi, dtype=np.int64)}
    for lp in kernel.loops[1:]:
        step = ctx.lanes if lp.var == kernel.vector_var else 1
        axes[lp.var] = np.arange(0, lp.extent, step, dtype=np.int64)
    return axes


def _waves(ctx: _Kernel, dom: dict[str, np.ndarray], n: int,
           axes: dict[str, np.ndarray] | None = None) -> _Waves:
    """Each copy runs one contiguous chunk of ceil(n / copies) iterations, one per wave."""
    kernel, km = ctx.km.kernel, ctx.km
    waves = -(-n // km.copies)
    if kernel.vector_var:
        active = np.minimum(ctx.lanes, kernel.vector_extent - dom[kernel.vector_var])
    else:
        active = np.ones(n, dtype=np.int64)
    layout = ctx.layouts.get(n)
    if layout is None:
        chunks = -(-n // waves)  # copies that get iterations
        # k // waves and k % waves, without dividing n numbers
        layout = (np.arange(n, dtype=np.int64), np.repeat(np.arange(chunks), waves)[:n],
                  np.tile(np.arange(waves, dtype=np.int64), chunks)[:n],
                  np.ones((n, 1), dtype=bool))
        for a in layout:
            a.flags.writeable = False
        ctx.layouts.clear()  # host memory: one tile size's arrays
        ctx.layouts[n] = layout
    k, copy, wave, ones = layout
    full = bool(active.min() >= ctx.lanes)
    if full:
        mask = np.ones((n, ctx.lanes), dtype=bool)
    else:
        mask = np.arange(ctx.lanes)[None, :] < active[:, None]
    return _Waves(n=n, k=k, copy=copy, wave=wave, waves=waves,
                  n_cycles=(waves - 1) * km.ii + km.schedule_length, active=active,
                  mask=mask, live=int(active.sum()), full=full, ones_mask=ones, axes=axes)


def _count_busy_and_links(ctx: _Kernel, ct: Counters, w: _Waves) -> None:
    """Busy cycles per PE (one per iteration of its copy) and words moved over each link."""
    per_copy = np.bincount(w.copy, minlength=ctx.km.copies)
    for p in ctx.km.placements:
        ct.busy[p.pe] += per_copy[p.copy]
    starts = np.arange(0, w.n, w.waves)
    live = np.zeros(ctx.km.copies, dtype=np.int64)
    live[:len(starts)] = np.add.reduceat(w.active, starts)
    for r in ctx.km.routes:
        words = live[r.copy] if r.src in ctx.vec else per_copy[r.copy]
        ct.link_word_hops += len(r.links) * int(words)


def _issue_node(ctx: _Kernel, ct: Counters, w: _Waves, dom, vals: dict[int, np.ndarray],
                acc: _TileAccesses, node: Node, ti: int, tile: Tile) -> None:
    """All iterations of one node: its value, or its SPM accesses and updates."""
    is_vec = node.id in ctx.vec
    ct.op_counts[node.op.value] += w.live if is_vec else w.n
    if not node.op.is_memory:
        vals[node.id] = apply_op(node.op, operands(node, [vals[i] for i in node.inputs]),
                                 ctx.dtype, node.value)
        return
    at = _addresses(ctx, w, dom, vals, node)
    sbase, wlo = spm_base(ctx.km, node.buffer, ti, tile)
    reach = (at.width - 1) * at.stride  # what the last lane adds to lane 0
    if node.addr.index_stride:  # lane 0's SPM words: the indirect addresses shifted, shared
        # without the constant by nodes of one index and term set (the memo compares it once)
        key = (_affine_terms(ctx, node), node.inputs[0], node.lane, node.addr.index_stride)
        if key not in acc.indirect:
            b = at.a0 - node.addr.const if node.addr.const else at.a0
            acc.indirect[key] = (b, int(b.min()), int(b.max()))
        (base, lo, hi), off = acc.indirect[key], sbase - wlo + node.addr.const
    else:  # the tile's affine sum (shared by nodes of its term set) plus a constant
        terms = _affine_terms(ctx, node)
        base, off = w.bases[terms], sbase - wlo + node.addr.const
        if terms not in w.base_range:
            w.base_range[terms] = (int(base.min()), int(base.max()))
        lo, hi = w.base_range[terms]
    acc.pattern.append((node.buffer, _Shifted(base, off), lo + off + min(0, reach),
                        hi + off + max(0, reach)))
    if node.op.accumulates:
        flushes, sel = _flushes(ctx, w, vals, node, at)
        acc.writes.append(flushes)
        acc.rows.append((node, _Lanes(at.a0[sel], at.stride, at.width, flushes.mask,
                                      full=at.full), flushes.cycle))
        return
    if node.hold:
        acc.rows.append(_held_reads(ctx, w, node, at))
    else:
        acc.rows.append((node, at, None))  # issue cycles computed if the rows are counted
    buf = ctx.bufs[node.buffer]
    if node.op in (Op.LOAD, Op.GATHER):
        vals[node.id] = _gather(buf, at)
    else:
        addr = at.words()
        acc.writes.append(_Writes(_cycles(ctx, w, node), w.k, node.id, addr,
                                  _lane_values(vals, node, addr, ctx.dtype), at.mask, node.op,
                                  node.buffer))


@dataclass(frozen=True, eq=False)
class _Lanes:
    """The word addresses of an access stream without materialising them: lane l of access e
    is at a0[e] + l * stride, for `width` lanes; `mask` (e, width) says which are live (always
    a prefix of the lanes: past a loop's end, or past a span, lanes are dead); `full` when
    every lane is live."""

    a0: np.ndarray
    stride: int
    width: int
    mask: np.ndarray
    full: bool = False

    def words(self) -> np.ndarray:
        return lane_addresses(self.a0, self.stride, self.width)


def _gather(buf: np.ndarray, at: _Lanes) -> np.ndarray:
    """A load's values (e, width), dead lanes zero. Lanes at a positive stride are read as
    rows of a strided view of the buffer (one row copy per access, not one index per lane)."""
    if at.width == 1:
        return buf[at.a0][:, None]
    if at.stride <= 0 or len(at.a0) == 0 or int(at.a0.min()) < 0:
        addr = at.words()
        return np.where(at.mask, buf[np.where(at.mask, addr, 0)], 0).astype(buf.dtype)
    span = (at.width - 1) * at.stride
    if (buf.ndim == 1 and int(at.a0.max()) + span < len(buf)
            and compiled_fold_pays(4 * at.a0.size * at.width, np.float32)):
        out = np.empty((len(at.a0), at.width), dtype=buf.dtype)
        _compiled_gather()(buf, at.a0, at.stride, out)
        if not at.full:
            out[~at.mask] = 0
        return out
    flat = np.ascontiguousarray(buf)
    if int(at.a0.max()) + span >= len(flat):  # dead lanes of the last accesses run past the end
        flat = np.concatenate((flat, np.zeros(span + 1, dtype=flat.dtype)))
    rows = np.lib.stride_tricks.as_strided(
        flat, shape=(len(flat) - span, at.width),
        strides=(flat.itemsize, at.stride * flat.itemsize), writeable=False)
    out = rows[at.a0]
    if not at.full:
        out[~at.mask] = 0
    return out


def _affine_terms(ctx: _Kernel, node: Node) -> tuple:
    """The loop terms of a node's lane-0 address: all of them for a vector access (the vector
    loop's term is lane 0's), all but the vector loop's for a scalar one, unless it spans."""
    terms = ctx.terms.get(node.id)
    if terms is None:
        vv = ctx.km.kernel.vector_var
        terms = ctx.terms[node.id] = tuple(sorted(
            (v, c) for v, c in node.addr.terms if v != vv or node.addr.span or node.id in ctx.vec))
    return terms


def _affine_base(w: _Waves, dom, terms: tuple) -> np.ndarray:
    """sum of c * dom[v] over `terms`, once per tile and term set (`_Waves.bases`): nodes whose
    addresses differ only by their constant (a GEMM's MACCs into C's columns) share it. The
    array is read-only (every user adds to it into a new array)."""
    base = w.bases.get(terms)
    shape = tuple(len(vals) for vals in w.axes.values()) if w.axes is not None else ()
    if (base is None and shape and math.prod(shape) == w.n
            and all(v in w.axes for v, _ in terms)):  # a dense nest: broadcast along the axes
        grid = np.zeros((1,) * len(shape), dtype=np.int64)
        for v, c in terms:
            vals = w.axes[v]
            axis = list(w.axes).index(v)
            grid = grid + (c * vals).reshape((1,) * axis + (-1,) + (1,) * (len(shape) - axis - 1))
        base = np.ascontiguousarray(np.broadcast_to(grid, shape)).reshape(-1)
        base.flags.writeable = False
        w.bases[terms] = base
    if base is None:
        base = np.zeros(w.n, dtype=np.int64)
        tmp = np.empty(w.n, dtype=np.int64)
        for v, c in terms:
            if c == 1:
                base += dom[v]
            else:
                base += np.multiply(dom[v], c, out=tmp)
        base.flags.writeable = False
        w.bases[terms] = base
    return base


def _gather_loops(buf, a0, stride, out):  # pragma: no cover - compiled by numba
    """out[e, l] = buf[a0[e] + l * stride] (every lane inside `buf`)."""
    for e in range(a0.shape[0]):
        b = a0[e]
        for lane in range(out.shape[1]):
            out[e, lane] = buf[b + lane * stride]


@functools.cache
def _compiled_gather():
    import numba

    return numba.njit(cache=True)(_gather_loops)


def _addresses(ctx: _Kernel, w: _Waves, dom, vals, node: Node) -> _Lanes:
    """Word addresses and live lanes per iteration, `width` lanes for a vector access and one
    for a scalar one; an indirect access adds its loaded index times the stride."""
    kernel = ctx.km.kernel
    a = _affine_base(w, dom, _affine_terms(ctx, node))
    if node.addr.const:
        a = a + node.addr.const
    if node.addr.index_stride:
        a = a + node.addr.index_stride * vals[node.inputs[0]][:, node.lane or 0].astype(np.int64)
    if node.id not in ctx.vec:
        return _Lanes(a, 0, 1, w.ones_mask, full=True)
    if node.addr.span:  # consecutive words: lanes along memory, `span` of them live
        live = np.arange(ctx.lanes) < node.addr.span
        return _Lanes(a, 1, ctx.lanes, np.broadcast_to(live, (w.n, ctx.lanes)),
                      full=bool(live.all()))
    return _Lanes(a, node.addr.coef(kernel.vector_var), ctx.lanes, w.mask, full=w.full)


def _lane_values(vals, node: Node, addr: np.ndarray, dtype) -> np.ndarray:
    """The stored value (`semantics.stored_value`) broadcast to one value per address."""
    src = np.asarray(stored_value(node, [vals[i] for i in node.inputs], dtype))
    return np.broadcast_to(src if src.ndim == 2 else src.reshape(-1, 1), addr.shape)


def _held_reads(ctx: _Kernel, w: _Waves, node: Node, at: _Lanes) -> tuple:
    """A held load's SPM reads (docs/conventions.md#held-loads): only in the iterations whose
    lane-0 address differs from the copy's previous iteration's, or that start a copy's
    chunk; the others reuse the PE's register. (node, their addresses, their cycles)."""
    again = np.ones(w.n, dtype=bool)
    again[1:] = (at.a0[1:] != at.a0[:-1]) | (w.copy[1:] != w.copy[:-1])
    sel = np.flatnonzero(again)
    return node, _Lanes(at.a0[sel], at.stride, at.width, at.mask[sel], full=at.full), \
        _cycles(ctx, w, node, sel)


def _cycles(ctx: _Kernel, w: _Waves, node: Node, sel: np.ndarray | None = None) -> np.ndarray:
    """Issue cycle of `node` in each iteration (or in iterations `sel`): wave * II + its time
    in its copy's schedule."""
    if sel is None:
        return w.wave * ctx.km.ii + np.repeat(ctx.times[:, node.id], w.waves)[:w.n]
    return w.wave[sel] * ctx.km.ii + ctx.times[w.copy[sel], node.id]


def _flushes(ctx: _Kernel, w: _Waves, vals, node: Node,
             at: _Lanes) -> tuple[_Writes, np.ndarray]:
    """An accumulating node combines in its PE's register and writes the SPM once per run of
    same-address iterations on a copy, at the run's last iteration. Returns the flushes and
    the iterations they happen in."""
    # lane 0's address is an affine sum plus a constant unless indirect: nodes of one term set
    # flush in the same iterations (a run ends where the sum changes)
    key = None if node.addr.index_stride else _affine_terms(ctx, node)
    sel = w.flush_sel.get(key) if key is not None else None
    if sel is None:
        flush = np.ones(w.n, dtype=bool)
        lane0 = at.a0
        flush[:-1] = (lane0[1:] != lane0[:-1]) | (w.copy[1:] != w.copy[:-1])
        sel = np.flatnonzero(flush)
        if key is not None:
            w.flush_sel[key] = sel
    if node.op is Op.MACC and compiled_fold_pays(at.mask.size, ctx.dtype):
        if node.id in ctx.macc_groups and macc_groups_on():
            reg = group_macc_fold(ctx, w, vals, node, at.mask.shape, sel)
        else:
            reg = macc_fold(ctx, vals, node, at.mask.shape, sel)
    else:
        src = _lane_values(vals, node, at.mask, ctx.dtype)
        reg = segment_fold(ACC_UFUNC[node.op], ACC_IDENTITY[node.op], src, sel, ctx.dtype)
    addr = lane_addresses(at.a0[sel], at.stride, at.width)
    return _Writes(_cycles(ctx, w, node, sel), w.k[sel], node.id, addr, reg, at.mask[sel],
                   node.op, node.buffer), sel


def _group_maccs(ctx: _Kernel) -> None:
    """Fill `ctx.macc_groups`: MACC nodes with the same two inputs, each selecting a lane of
    input 0 (`Node.lane`), whose lane-0 addresses have one affine term set and no index, so
    they flush in the same iterations (`_flushes`); groups of two or more."""
    groups: dict[tuple, list[int]] = {}
    for n in ctx.km.kernel.nodes:
        if (n.op is Op.MACC and len(n.inputs) == 2 and n.lane is not None
                and not n.addr.index_stride):
            groups.setdefault((n.inputs, _affine_terms(ctx, n)), []).append(n.id)
    for ids in groups.values():
        if len(ids) > 1:
            for i in ids:
                ctx.macc_groups[i] = tuple(ids)


def _apply_writes(writes: list[_Writes], bufs: dict[str, np.ndarray]) -> None:
    """Commit a tile's SPM updates in the semantics' order, lanes in lane order.

    Consecutive updates (in commit order) of write nodes with one op and one buffer commit in
    one `commit` call: it applies its updates one after another in the order given, so one call
    over their concatenation equals one call per node. Values are cast to the buffer's dtype
    first, as `commit` casts them."""
    if not writes:
        return
    if len(writes) == 1:  # one node's updates (one op, one buffer): by cycle, then iteration
        w = writes[0]
        buf = bufs[w.buffer]
        order = np.lexsort((w.iteration, w.cycle))
        vals = np.broadcast_to(np.asarray(w.vals).astype(buf.dtype, copy=False), w.addr.shape)
        sel = w.mask[order]
        commit(w.op, buf, w.addr[order][sel], vals[order][sel])
        return
    cyc = np.concatenate([w.cycle for w in writes])
    k = np.concatenate([w.iteration for w in writes])
    node = np.concatenate([np.full(len(w.cycle), w.node) for w in writes])
    order = commit_order(cyc, k, node)
    kinds: dict[tuple, list[int]] = {}
    for j, w in enumerate(writes):
        kinds.setdefault((w.op, w.buffer), []).append(j)
    kind_of = np.empty(len(writes), dtype=np.int64)
    local = np.empty(len(order), dtype=np.int64)  # position within its kind's concatenation
    offsets = np.cumsum([0] + [len(w.cycle) for w in writes])
    stacked = []
    for ki, ((op, name), js) in enumerate(kinds.items()):
        kind_of[js] = ki
        width = max(writes[j].addr.shape[1] for j in js)
        dt = bufs[name].dtype
        parts_a, parts_v, parts_m, at = [], [], [], 0
        for j in js:
            w = writes[j]
            pad = ((0, 0), (0, width - w.addr.shape[1]))
            vals = np.broadcast_to(np.asarray(w.vals).astype(dt, copy=False), w.addr.shape)
            if pad[1][1]:
                parts_a.append(np.pad(w.addr, pad))
                parts_v.append(np.pad(vals, pad))
                parts_m.append(np.pad(w.mask, pad))
            else:
                parts_a.append(w.addr)
                parts_v.append(vals)
                parts_m.append(w.mask)
            local[offsets[j]:offsets[j + 1]] = at + np.arange(len(w.cycle))
            at += len(w.cycle)
        stacked.append((op, bufs[name], *(p[0] if len(p) == 1 else np.concatenate(p)
                                          for p in (parts_a, parts_v, parts_m))))
    which = np.searchsorted(offsets, order, side="right") - 1
    kind = kind_of[which]
    # updates of different buffers commute: each buffer's updates in commit order, one
    # `commit` call per run of one op among them (one call per buffer unless ops mix in it)
    names = list(dict.fromkeys(name for _, name in kinds))
    buffer_of = np.array([names.index(name) for _, name in kinds], dtype=np.int64)
    per_buffer = ([np.arange(len(order))] if len(names) == 1 else
                  [np.flatnonzero(buffer_of[kind] == b) for b in range(len(names))])
    for pos in per_buffer:
        breaks = np.flatnonzero(np.diff(kind[pos])) + 1
        for run in (np.split(pos, breaks) if len(breaks) else (pos,)):
            if not len(run):
                continue
            op, buf, a, v, m = stacked[kind[run[0]]]
            idx = local[order[run]]
            sel = m[idx]
            commit(op, buf, a[idx][sel], v[idx][sel])
