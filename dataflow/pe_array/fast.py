"""The fast engine: one tile at a time, vectorised over all iterations with numpy.

Same semantics as `reference.py`, which steps every cycle: the tile's n iterations are cut
into U contiguous chunks of W = ceil(n / U); iteration k runs on body copy k div W in wave
k mod W, so node n of it issues at cycle wave*II + t(copy, n). An ACC node accumulates in its
PE's register and reads-modifies-writes the SPM once per run of consecutive same-address
iterations of its copy. SPM row accesses
are counted per (cycle, line) from the real address streams; a cycle whose busiest line needs p
port-cycles stalls the whole (lock-step) array p - 1 cycles. SPM updates apply in (cycle,
iteration, node) order.

SCATTER_ACC (PIT's SWrite with accumulate, docs/references.md#pit) is an ACC whose address adds a
loaded index: it combines in the register over a run like ACC and read-modify-writes once per
run. Read-modify-write ordering: every update to one word is applied, in (cycle, iteration,
node, lane) order, so the value is exact for that order (np.add.at applies repeated indices in
sequence). Port cost: distinct SPM rows of one access are one row access each, as for any
vector access, but lanes that hit the same word must be serialised: the r-th lane to hit a word
goes in the r-th row access, so a row costs as many write accesses as its most-hit word has
hits (its reads, like every read of one row in one cycle, are one broadcast access). Different copies (PEs) updating the same row in one cycle are separate accesses,
as always, and serialise on the line's ports (the stall arithmetic below).
"""

from __future__ import annotations

import numpy as np

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.domain import enumerate_domain
from dataflow.dfg.graph import vector_nodes
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import KernelMapping
from dataflow.pe_array.common import (
    Counters,
    buffer_arrays,
    gather_fetch_words,
    lane_addresses,
    spm_base,
)
from dataflow.pe_array.common import (
    tile_result as _tile_result,
)
from dataflow.pe_array.result import ArrayResult
from dataflow.pe_array.semantics import ACC_IDENTITY, ACC_UFUNC, apply_op, commit, commit_order
from dataflow.spm.lines import StoreQueues, line_of_row, port_cycles


def same_word_rank(words: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """rank[e, l]: how many earlier active lanes of access e hit the same word as lane l
    (0 for the first). Lanes with equal rank can share one row access; see the module doc."""
    rank = np.zeros(words.shape, dtype=np.int64)
    for lane in range(1, words.shape[1]):
        same = (words[:, :lane] == words[:, lane:lane + 1]) & mask[:, :lane]
        rank[:, lane] = same.sum(axis=1)
    return rank


def run_kernel_fast(km: KernelMapping, arch: ArchSpec, inputs: dict[str, np.ndarray], dtype) -> ArrayResult:
    kernel = km.kernel
    spm = arch.spm
    lanes = arch.pe_array.simd_lanes if kernel.vector_var else 1
    vec = vector_nodes(kernel)
    bufs = buffer_arrays(kernel, inputs, dtype)
    fetched = gather_fetch_words(kernel, inputs, arch)  # indirect-DMA words per gather-fetched input
    U, II = km.copies, km.ii
    times = np.zeros((U, len(kernel.nodes)), dtype=np.int64)
    for p in km.placements:
        times[p.copy, p.node] = p.time
    ct = Counters(arch)
    busy, op_counts = ct.busy, ct.op_counts
    tiles = ct.tiles
    link_word_hops = 0
    for ti, tile in enumerate(km.tiles):
        dom = enumerate_domain(kernel, lanes, (tile.lo, tile.hi))
        n = len(dom[kernel.loops[0].var])
        if n == 0:
            tiles.append(_tile_result(kernel, ti, 0, 0, 0, km, arch, tile, fetched))
            continue
        k = np.arange(n, dtype=np.int64)
        waves = -(-n // U)  # each copy runs one contiguous chunk of `waves` iterations
        copy, wave = k // waves, k % waves
        n_cycles = (waves - 1) * II + km.schedule_length
        if kernel.vector_var:
            act = np.minimum(lanes, kernel.vector_extent - dom[kernel.vector_var])
        else:
            act = np.ones(n, dtype=np.int64)
        mask = np.arange(lanes)[None, :] < act[:, None]
        per_copy = np.bincount(copy, minlength=U)
        for p in km.placements:
            busy[p.pe] += per_copy[p.copy]
        for r in km.routes:
            words = act if r.src in vec else np.ones(n, dtype=np.int64)
            link_word_hops += len(r.links) * int(words[copy == r.copy].sum())
        vals: dict[int, np.ndarray] = {}
        acc_key = []  # (cycle*lines+line) row writes
        rd_key = []
        writes = []  # (cycle, k, node, addr (n,L) or (n,), vals, mask, op)
        for node in kernel.nodes:
            cyc = wave * II + times[copy, node.id]
            is_vec = node.id in vec
            op_counts[node.op.value] += int(act.sum()) if is_vec else n
            if not node.op.is_memory:
                vals[node.id] = apply_op(node.op, [vals[i] for i in node.inputs], dtype, node.value)
                continue
            a = np.full(n, node.addr.const, dtype=np.int64)
            for v, c in node.addr.terms:
                if v != kernel.vector_var:
                    a = a + c * dom[v]
            if node.addr.index_stride:
                a = a + node.addr.index_stride * vals[node.inputs[0]][:, 0].astype(np.int64)
            cv = node.addr.coef(kernel.vector_var) if kernel.vector_var else 0
            if is_vec:
                a = a[:, None] + dom[kernel.vector_var][:, None] * cv
                addr = lane_addresses(a[:, 0], cv, lanes)
                m = mask
            else:
                addr = a[:, None]
                m = np.ones((n, 1), dtype=bool)
            if node.op.accumulates:
                # accumulate in the PE's register; one SPM read-modify-write per run of
                # same-address iterations on a copy
                flush = np.ones(n, dtype=bool)
                lane0 = addr[:, 0]
                flush[:-1] = (lane0[1:] != lane0[:-1]) | (copy[1:] != copy[:-1])
                run = np.concatenate(([0], np.cumsum(flush[:-1])))
                src = np.asarray(vals[node.inputs[-1]])
                src = np.broadcast_to(src if src.ndim == 2 else src.reshape(-1, 1), addr.shape)
                reg = np.full((int(run[-1]) + 1, addr.shape[1]), ACC_IDENTITY[node.op], dtype=dtype)
                ACC_UFUNC[node.op].at(reg, run, src.astype(dtype))
                sel = np.flatnonzero(flush)
                writes.append((cyc[sel], k[sel], node.id, addr[sel], reg[run[sel]], m[sel],
                               node.op, node.buffer))
                addr_s, m_s, cyc_s = addr[sel], m[sel], cyc[sel]
            else:
                addr_s, m_s, cyc_s = addr, m, cyc
            # SPM rows touched by each access (distinct rows among active lanes)
            sbase, wlo = spm_base(km, node.buffer, ti, tile)
            srow = (sbase + (addr_s - wlo)) // spm.words_per_row
            width = addr_s.shape[1]
            if node.op is Op.SCATTER_ACC:  # same-word lanes serialise: one row access per rank
                srow = srow * width + same_word_rank(addr_s, m_s)
            srow = np.where(m_s, srow, -1)
            srow.sort(axis=1)
            first = np.ones_like(srow, dtype=bool)
            first[:, 1:] = srow[:, 1:] != srow[:, :-1]
            first &= srow >= 0
            if node.op is Op.SCATTER_ACC:
                srow = np.where(srow >= 0, srow // width, -1)
            ev, lane = np.nonzero(first)
            if node.op.reads_spm:
                rd_key.append((cyc_s[ev], srow[ev, lane]))
            if node.op.writes_spm:
                acc_key.append(cyc_s[ev] * spm.lines + line_of_row(srow[ev, lane], spm))
            safe = np.where(m, addr, 0)
            if node.op in (Op.LOAD, Op.GATHER):
                v = np.where(m, bufs[node.buffer][safe], 0).astype(bufs[node.buffer].dtype)
                vals[node.id] = v
            elif not node.op.accumulates:
                src = np.asarray(vals[node.inputs[-1]])
                src = np.broadcast_to(src if src.ndim == 2 else src.reshape(-1, 1), addr.shape)
                writes.append((cyc, k, node.id, addr, src, m, node.op, node.buffer))
        # port arithmetic per (cycle, line)
        size = n_cycles * spm.lines
        rd = np.bincount(_read_keys(rd_key, spm), minlength=size)
        wr = np.bincount(np.concatenate(acc_key) if acc_key else np.zeros(0, np.int64), minlength=size)
        rd = rd.reshape(n_cycles, spm.lines)
        wr = wr.reshape(n_cycles, spm.lines)
        if spm.write_queue_depth:
            sq = StoreQueues(spm)
            stall = 0
            for t in range(n_cycles):
                s_t, extra = sq.cycle(rd[t], wr[t])
                stall += s_t
                ct.conflicts_line += extra
            s_t, extra = sq.drain()
            stall += s_t
            ct.conflicts_line += extra
        else:
            need = port_cycles(rd, wr, spm) - 1
            stall = int(need.max(axis=1).sum())
            ct.conflicts_line += need.sum(axis=0)
        ct.reads_line += rd.sum(axis=0)
        ct.writes_line += wr.sum(axis=0)
        _apply_writes(writes, bufs)
        tiles.append(_tile_result(kernel, ti, n, n_cycles + stall, stall, km, arch, tile, fetched))
    ct.link_word_hops = link_word_hops
    return ct.result(kernel, bufs)


def _read_keys(rd_key, spm) -> np.ndarray:
    """(cycle * lines + line) per row read; reads of one row in one cycle are one access
    (the line broadcasts it)."""
    if not rd_key:
        return np.zeros(0, np.int64)
    cyc = np.concatenate([c for c, _ in rd_key])
    row = np.concatenate([r for _, r in rd_key])
    span = int(row.max()) + 1
    keys = np.sort(cyc * span + row)  # sort + run-ends: far faster than np.unique's hashing
    uniq = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
    return (uniq // span) * spm.lines + line_of_row(uniq % span, spm)


def _apply_writes(writes, bufs) -> None:
    """Commit SPM updates in the semantics' order (cycle, iteration, node), lanes in lane order."""
    if not writes:
        return
    cyc = np.concatenate([w[0] for w in writes])
    k = np.concatenate([w[1] for w in writes])
    node = np.concatenate([np.full(len(w[0]), w[2]) for w in writes])
    order = commit_order(cyc, k, node)
    offsets = np.cumsum([0] + [len(w[0]) for w in writes])
    which = np.searchsorted(offsets, order, side="right") - 1
    local = order - offsets[which]
    # consecutive events of one write node commit together (np.add.at keeps their order)
    breaks = np.flatnonzero(np.diff(which)) + 1
    for run in np.split(np.arange(len(order)), breaks):
        if not len(run):
            continue
        _, _, _, addr, vals, m, op, buf = writes[which[run[0]]]
        idx = local[run]
        commit(op, bufs[buf], addr[idx][m[idx]], vals[idx][m[idx]])

