"""Memo-hit tiles of one kernel computed in one vectorised pass (the fast engine's tile loop).

A tile whose timing the memo supplies (`fast_memo._TimingMemo.recall`: the same iteration count,
live lanes and SPM address pattern up to an allowed shift) still has its values computed; in
`fast._run_tile` that is one round of small numpy calls per node per tile, which dominates a
kernel of many small tiles (the attention workload's 26 tiles of about 1000 iterations). Here
a run of consecutive memo-hit tiles is computed as one tile of all their iterations:

- each tile's timing is decided first, tile by tile and in order, by the memo's own exact test
  on the same address pattern `fast._issue_node` builds (lane-0 SPM words per memory node,
  an indirect access's from its index load's values); a tile the memo does not know runs the
  ordinary path (`fast._run_tile`), after the pending run of hits is committed, so buffers see
  the updates in tile order;
- the pass is legal only for a kernel none of whose loads reads a buffer the kernel writes
  (`batch_applies`): every tile then reads the buffers as they were before the kernel, as it
  would tile by tile (a tile reads before it commits);
- values per node are the same elementwise numpy calls on longer arrays (the same bits);
  an accumulator flushes where its lane-0 address or copy changes, as in `fast._flushes`, and
  at the end of every tile (a register never carries over a tile boundary); updates commit
  in (tile, cycle, iteration, node) order, which is tile by tile in the semantics' order
  (`semantics.commit_order`), through `fast._apply_writes` with the tile as the high bits
  of the cycle.

Every counter comes from the memo as before; tile results, output bits and memo statistics
equal the tile-by-tile path. Off with DATAFLOW_TILE_BATCH=0. `tests/test_fast_shortcuts.py::
test_batched_memo_hits_are_exact` (reference stepper, on against off, and a kernel whose
accumulator runs reach across tile boundaries, which fails when the pass forgets the tile
ends). docs/architecture.md#batched-memo-hits.
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict

import numpy as np

from dataflow.dfg.ops import Op
from dataflow.pe_array import fast, fast_fold, fast_memo, fast_tile_jit
from dataflow.pe_array.common import Counters, lane_addresses, spm_base, tile_result
from dataflow.pe_array.fast_policy import FOLD_JIT_ENV, compiled_fold_pays
from dataflow.pe_array.result import TileResult
from dataflow.pe_array.semantics import (
    ACC_IDENTITY,
    ACC_UFUNC,
    apply_op,
    commit_order,
    operands,
)

#: Environment switch of the batched pass: on unless 0 (or false, no, off).
BATCH_ENV = "DATAFLOW_TILE_BATCH"
#: Tiles whose values came from a batched pass, and the passes, over the process (tests read
#: it to prove the shortcut was taken).
BATCH_STATS = {"tiles": 0, "passes": 0, "compiled": 0}
#: Tile index in the high bits of a batched update's cycle (a tile's cycles stay below it).
_TILE_SHIFT = 40
#: iterations x nodes x lanes from which a tile runs tile by tile: its numpy calls are long
#: enough to pay for themselves (a GEMM's grouped MACC folds beat the generic loop)
TILE_MAX_WORK = 1 << 19
#: iterations x nodes x lanes of one pass at most (past it the pending tiles commit): the
#: compiled pass holds every node's values, 4 bytes each (32 MiB)
MAX_WORK = 1 << 23

def batch_enabled() -> bool:
    return os.environ.get(BATCH_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def batch_applies(ctx, timing) -> bool:
    """Whether `run_tiles` runs the kernel: the tile memo is on, the switch is, the kernel has
    more than one tile, no load reads a buffer the kernel writes, and every index is loaded."""
    if timing is None or len(ctx.km.tiles) < 2 or not batch_enabled():
        return False
    nodes = ctx.km.kernel.nodes
    written = {n.buffer for n in nodes if n.op.is_memory and n.op.writes_spm}
    return not any((n.op in (Op.LOAD, Op.GATHER) and n.buffer in written)
                   # an index the pattern reads from a buffer, not computed (`_index`)
                   or (n.op.is_memory and n.addr.index_stride
                       and nodes[n.inputs[0]].op not in (Op.LOAD, Op.GATHER))
                   for n in nodes)


def run_tiles(ctx, ct: Counters, timing) -> list[TileResult]:
    """Every tile of the kernel: memo hits batched (module doc), the others tile by tile."""
    km, kernel = ctx.km, ctx.km.kernel
    counts = _op_counts(ctx)
    out: list[TileResult] = []
    pending: list[tuple] = []
    work = 0
    for ti, tile in enumerate(km.tiles):
        dom, n, w = layout = fast.tile_layout(ctx, ti, tile, timing.layouts)
        if n == 0:
            out.append(tile_result(kernel, ti, 0, 0, 0, km, ctx.arch, tile, ctx.fetched))
            continue
        big = n * len(kernel.nodes) * ctx.lanes >= TILE_MAX_WORK
        known = None if big else timing.recall(w, _pattern(ctx, w, dom, ti, tile), ti)
        if known is None:  # the ordinary path times it (its recall misses again, no effect)
            _commit_batch(ctx, pending)
            pending, work = [], 0
            out.append(fast._run_tile(ctx, ct, ti, tile, timing, layout))
            continue
        fast_memo.MEMO_STATS["tiles"] += 1
        fast_memo.MEMO_STATS["hits"] += 1
        tile_counts, stall = known
        tile_counts.add_to(ct)
        for op, per_iteration, per_lane in counts:
            ct.op_counts[op] += per_iteration * n + per_lane * w.live
        pending.append((ti, dom, w))
        work += n * len(kernel.nodes) * ctx.lanes
        if work >= MAX_WORK:  # host memory: a pass holds (nodes, iterations, lanes) values
            _commit_batch(ctx, pending)
            pending, work = [], 0
        out.append(tile_result(kernel, ti, n, w.n_cycles + stall, stall, km, ctx.arch, tile,
                               ctx.fetched))
    _commit_batch(ctx, pending)
    return out


def _op_counts(ctx) -> list[tuple[str, int, int]]:
    """(op, nodes counted per iteration, nodes counted per live lane) as `_issue_node` counts."""
    per: dict[str, list[int]] = {}
    for node in ctx.km.kernel.nodes:
        per.setdefault(node.op.value, [0, 0])[node.id in ctx.vec] += 1
    return [(op, a, b) for op, (a, b) in per.items()]


def _shape(ctx, node) -> tuple[int, int]:
    """(lanes, stride) of a node's access, as `fast._addresses` makes them."""
    if node.id not in ctx.vec:
        return 1, 0
    if node.addr.span:
        return ctx.lanes, 1
    return ctx.lanes, node.addr.coef(ctx.km.kernel.vector_var)


def _pattern(ctx, w, dom, ti: int, tile) -> list[tuple]:
    """The tile's address pattern exactly as `fast._issue_node` records it (buffer, lane-0
    SPM words as a `_Shifted`, lowest and highest word; an indirect access's words shared
    without its constant), computing no value but the index loads' lane 0."""
    lane0: dict[int, np.ndarray] = {}
    shared: dict = {}
    spm: dict[str, int] = {}
    pattern = []
    for node, terms, reach in _memory_nodes(ctx):
        off = spm.get(node.buffer)
        if off is None:
            sbase, wlo = spm_base(ctx.km, node.buffer, ti, tile)
            off = spm[node.buffer] = sbase - wlo
        if node.addr.index_stride:
            key = (terms, node.inputs[0], node.lane, node.addr.index_stride)
            got = shared.get(key)
            if got is None:
                b = fast._affine_base(w, dom, terms) + node.addr.index_stride * _index(
                    ctx, w, dom, node.inputs[0], lane0, node.lane or 0)
                got = shared[key] = (b, int(b.min()), int(b.max()))
            base, lo, hi = got
        else:
            base = fast._affine_base(w, dom, terms)
            if terms not in w.base_range:
                w.base_range[terms] = (int(base.min()), int(base.max()))
            lo, hi = w.base_range[terms]
        off += node.addr.const
        pattern.append((node.buffer, fast_memo._Shifted(base, off), lo + off + min(0, reach),
                        hi + off + max(0, reach)))
    return pattern


_MEMORY_NODES: OrderedDict = OrderedDict()


def _memory_nodes(ctx) -> list[tuple]:
    """(node, lane-0 loop terms, what the last lane adds to lane 0) of each memory node."""
    key = (id(ctx.km.kernel), ctx.lanes)
    got = _MEMORY_NODES.get(key)
    if got is None or got[0] is not ctx.km.kernel:
        specs = []
        for node in ctx.km.kernel.nodes:
            if node.op.is_memory:
                width, stride = _shape(ctx, node)
                specs.append((node, fast._affine_terms(ctx, node), (width - 1) * stride))
        got = _MEMORY_NODES[key] = (ctx.km.kernel, specs)
        while len(_MEMORY_NODES) > 64:
            _MEMORY_NODES.popitem(last=False)
    return got[1]


def _a0(ctx, w, dom, node, lane0: dict) -> np.ndarray:
    """Lane 0's buffer word per iteration (`fast._addresses`' a0); an indirect access's index
    is its input's lane-0 value, read from the buffer (its input is a load; `_index`)."""
    a = fast._affine_base(w, dom, fast._affine_terms(ctx, node))
    if node.addr.const:
        a = a + node.addr.const
    if node.addr.index_stride:
        a = a + node.addr.index_stride * _index(ctx, w, dom, node.inputs[0], lane0,
                                                node.lane or 0)
    return a


def _index(ctx, w, dom, nid: int, lane0: dict, lane: int = 0) -> np.ndarray:
    """Lane `lane` of load `nid`'s value as int64, as `_issue_node` reads an index (`_gather`
    zeroes a dead lane 0; `batch_applies` holds every index a load's value; a lane past 0 is
    a word of a row load, docs/conventions.md#nonzero-unroll)."""
    got = lane0.get((nid, lane))
    if got is None:
        src = ctx.km.kernel.nodes[nid]
        buf = ctx.bufs[src.buffer]
        a = _a0(ctx, w, dom, src, lane0) + lane
        width, _ = _shape(ctx, src)
        if width == 1 or w.full or (src.addr.span and src.id in ctx.vec):
            got = buf[a].astype(np.int64)
        else:
            live = w.mask[:, 0]
            got = np.where(live, buf[np.where(live, a, 0)], 0).astype(buf.dtype).astype(
                np.int64)
        lane0[(nid, lane)] = got
    return got


def _commit_batch(ctx, pending: list[tuple]) -> None:
    """Values and SPM updates of consecutive memo-hit tiles, computed as one tile."""
    if not pending:
        return
    BATCH_STATS["tiles"] += len(pending)
    BATCH_STATS["passes"] += 1
    km, kernel = ctx.km, ctx.km.kernel
    doms = [d for _, d, _ in pending]
    ws = [w for _, _, w in pending]
    cat = (lambda xs: xs[0]) if len(pending) == 1 else np.concatenate
    dom = {v: cat([d[v] for d in doms]) for v in doms[0]}
    copy, wave = cat([w.copy for w in ws]), cat([w.wave for w in ws])
    k = cat([w.k for w in ws])
    mask = cat([w.mask for w in ws])
    ones = np.ones((len(k), 1), dtype=bool)
    full = all(w.full for w in ws)
    ends = np.cumsum([w.n for w in ws]) - 1  # each tile's last iteration
    tile_hi = np.repeat(np.array([ti for ti, _, _ in pending], dtype=np.int64) << _TILE_SHIFT,
                        [w.n for w in ws])
    if _compiled_pass(ctx, pending, dom, copy, wave, k, mask, ones, full, ends, tile_hi):
        return
    vals: dict[int, np.ndarray] = {}
    writes = []
    for node in kernel.nodes:
        if not node.op.is_memory:
            vals[node.id] = apply_op(node.op, operands(node, [vals[i] for i in node.inputs]),
                                     ctx.dtype, node.value)
            continue
        a = _affine_sum(ctx, dom, node)
        if node.addr.const:
            a = a + node.addr.const
        if node.addr.index_stride:
            a = a + node.addr.index_stride * vals[node.inputs[0]][:, node.lane or 0].astype(
                np.int64)
        width, stride = _shape(ctx, node)
        if width == 1:
            at = fast._Lanes(a, 0, 1, ones, full=True)
        elif node.addr.span:
            live = np.arange(ctx.lanes) < node.addr.span
            at = fast._Lanes(a, 1, width, np.broadcast_to(live, (len(a), width)),
                             full=bool(live.all()))
        else:
            at = fast._Lanes(a, stride, width, mask, full=full)
        if node.op.accumulates:
            flush = np.ones(len(a), dtype=bool)
            flush[:-1] = (a[1:] != a[:-1]) | (copy[1:] != copy[:-1])
            flush[ends] = True
            sel = np.flatnonzero(flush)
            if node.op is Op.MACC and compiled_fold_pays(at.mask.size, ctx.dtype):
                reg = fast_fold.macc_fold(ctx, vals, node, at.mask.shape, sel)
            else:
                src = fast._lane_values(vals, node, at.mask, ctx.dtype)
                reg = fast_fold.segment_fold(ACC_UFUNC[node.op], ACC_IDENTITY[node.op], src,
                                             sel, ctx.dtype)
            cyc = wave[sel] * km.ii + ctx.times[copy[sel], node.id] + tile_hi[sel]
            writes.append(fast._Writes(cyc, k[sel], node.id,
                                       lane_addresses(a[sel], stride, width), reg,
                                       at.mask[sel], node.op, node.buffer))
        elif node.op in (Op.LOAD, Op.GATHER):
            vals[node.id] = fast._gather(ctx.bufs[node.buffer], at)
        else:
            addr = at.words()
            cyc = wave * km.ii + ctx.times[copy, node.id] + tile_hi
            writes.append(fast._Writes(cyc, k, node.id, addr,
                                       fast._lane_values(vals, node, addr, ctx.dtype), at.mask,
                                       node.op, node.buffer))
    fast._apply_writes(writes, ctx.bufs)


def _affine_sum(ctx, dom, node) -> np.ndarray:
    """Lane 0's affine sum over the batch's domain (`fast._affine_base` over all iterations)."""
    terms = fast._affine_terms(ctx, node)
    n = len(next(iter(dom.values())))
    base = np.zeros(n, dtype=np.int64)
    for v, c in terms:
        base += dom[v] if c == 1 else dom[v] * c
    return base


#: kernel programs for the compiled pass (`fast_tile_jit.program`) by (id(kernel), lanes)
_PROGRAMS: OrderedDict = OrderedDict()
#: iterations x nodes x lanes of a pass from which it runs compiled with numba not yet loaded
COMPILED_MIN_WORK = 1 << 20


def _compiled_pays(work: int) -> bool:
    """The folds' switch (`FOLD_JIT_ENV`: 0 never, always) decides first; else compiled
    once numba is loaded, or for a pass of at least `COMPILED_MIN_WORK` element steps: numpy
    spends some 3-5 ns on each (several ms a pass), and a memo-hit pass is a warm repeat of
    a kernel, which a process running it once does not get to."""
    choice = os.environ.get(FOLD_JIT_ENV, "").strip().lower()
    if choice in ("0", "false", "no", "off"):
        return False
    return choice == "always" or "numba" in sys.modules or work >= COMPILED_MIN_WORK


def _program(ctx):
    key = (id(ctx.km.kernel), ctx.lanes)
    got = _PROGRAMS.get(key)
    if got is None or got[0] is not ctx.km.kernel:
        got = _PROGRAMS[key] = (ctx.km.kernel, fast_tile_jit.program(ctx, _shape))
        while len(_PROGRAMS) > 64:
            _PROGRAMS.popitem(last=False)
    _PROGRAMS.move_to_end(key)
    return got[1]


def _compiled_pass(ctx, pending, dom, copy, wave, k, mask, ones, full, ends, tile_hi) -> bool:
    """The batch's values and updates by `fast_tile_jit` (one compiled call), committed; False
    where numpy's pass runs instead (an op numba may round otherwise, the policy)."""
    n = len(k)
    if not _compiled_pays(n * len(ctx.km.kernel.nodes) * ctx.lanes):
        return False
    prog = _program(ctx)
    if prog is None:
        return False
    got = fast_tile_jit.image(prog, ctx.bufs)
    if got is None:
        return False
    img, offs = got
    aff = np.empty((len(prog["terms"]), n), dtype=np.int64)
    for t, terms in enumerate(prog["terms"]):
        aff[t] = 0
        for v, c in terms:
            aff[t] += dom[v] if c == 1 else dom[v] * c
    active = (np.asarray(mask.sum(axis=1), dtype=np.int64) if not full
              else np.full(n, ctx.lanes, dtype=np.int64))
    tile_end = np.zeros(n, dtype=bool)
    tile_end[ends] = True
    vals, sel, cnt, a0w = fast_tile_jit.run(prog, img, offs, aff, active,
                                            np.ascontiguousarray(copy), tile_end, ctx.lanes)
    km = ctx.km
    if _compiled_commit(ctx, prog, vals, sel, cnt, a0w, active, wave, copy, k, tile_hi):
        BATCH_STATS["compiled"] += 1
        return True
    writes = []
    for s, node in enumerate(prog["writers"]):
        width, stride = _shape(ctx, node)
        if node.id not in ctx.vec:
            m = ones
        elif node.addr.span:
            m = np.broadcast_to(np.arange(ctx.lanes) < node.addr.span, (n, ctx.lanes))
        else:
            m = mask
        if node.op.accumulates:
            at = sel[s, :cnt[s]]
            reg = vals[s, :cnt[s], :width]
        else:
            at = np.arange(n)
            reg = vals[s, :, :width]
        cyc = wave[at] * km.ii + ctx.times[copy[at], node.id] + tile_hi[at]
        writes.append(fast._Writes(cyc, k[at], node.id, lane_addresses(a0w[s, at], stride, width),
                                   reg, m[at], node.op, node.buffer))
    fast._apply_writes(writes, ctx.bufs)
    BATCH_STATS["compiled"] += 1
    return True


def _compiled_commit(ctx, prog, vals, sel, cnt, a0w, active, wave, copy, k, tile_hi) -> bool:
    """The pass's updates committed by `fast_tile_jit.commit` in `semantics.commit_order`
    (tile, cycle, iteration, node; lanes in order), each applied as `semantics.commit`
    applies it one after another; False (numpy's `_apply_writes` commits) unless every
    written buffer is float32."""
    names = list(dict.fromkeys(n.buffer for n in prog["writers"]))
    bufs = [ctx.bufs[b] for b in names]
    if not prog["writers"] or any(b.dtype != np.float32 or b.ndim != 1 for b in bufs):
        return False
    km, n = ctx.km, len(k)
    cyc, its, node, slot, row, at = [], [], [], [], [], []
    for s, w in enumerate(prog["writers"]):
        e = sel[s, :cnt[s]] if w.op.accumulates else np.arange(n)
        cyc.append(wave[e] * km.ii + ctx.times[copy[e], w.id] + tile_hi[e])
        its.append(k[e])
        node.append(np.full(len(e), w.id, dtype=np.int64))
        slot.append(np.full(len(e), s, dtype=np.int64))
        row.append(np.arange(len(e), dtype=np.int64) if w.op.accumulates else e)
        at.append(e)
    cat = (lambda xs: xs[0]) if len(cyc) == 1 else np.concatenate
    order = commit_order(cat(cyc), cat(its), cat(node))
    offs = np.cumsum([0] + [len(b) for b in bufs])
    img = np.concatenate(bufs) if len(bufs) > 1 else bufs[0]
    shape = np.array([_shape(ctx, w) for w in prog["writers"]], dtype=np.int64).reshape(-1, 2)
    fast_tile_jit.commit(order, cat(slot), cat(row), cat(at), prog, names, shape, offs, a0w,
                         vals, active, img)
    if len(bufs) > 1:
        for b, lo in zip(bufs, offs):
            b[:] = img[lo:lo + len(b)]
    return True
