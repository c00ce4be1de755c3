"""The fast engine's SPM port accounting, split out of `fast.py`: the row accesses of each
access stream (`count_rows`: its distinct rows among live lanes, a SCATTER_ACC's lanes that hit
one word serialised by `same_word_rank`), then the tile's stall cycles from the reads and
writes per (cycle, line) (`port_stalls`, through the store queues where the SPM has them).
Reads are counted with numpy keys (`read_keys`) or compiled loops (`_compiled_read_counts`,
under the folds' rent-or-buy policy, docs/architecture.md#compiled-loops-rent-or-buy). `acc`
is the tile's `fast._TileAccesses`, `at` an access's `fast._Lanes`, `ctx` the `fast._Kernel`."""

from __future__ import annotations

import functools

import numpy as np

from dataflow.arch.spec import SPMSpec
from dataflow.dfg.graph import Node
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import Tile
from dataflow.pe_array.common import Counters, spm_base
from dataflow.pe_array.fast_policy import compiled_fold_pays
from dataflow.spm.lines import StoreQueues, line_of_row, port_cycles

#: Row index of an inactive lane in the row arrays (sorts before every real row).
NO_ROW = -1


def read_keys(reads, spm) -> np.ndarray:
    """(cycle * lines + line) per row read; reads of one row in one cycle are one access
    (the line broadcasts it)."""
    if not reads:
        return np.zeros(0, np.int64)
    cyc = np.concatenate([c for c, _ in reads])
    row = np.concatenate([r for _, r in reads])
    span = int(row.max()) + 1
    keys = np.sort(cyc * span + row)  # sort + run-ends: far faster than np.unique's hashing
    uniq = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
    return (uniq // span) * spm.lines + line_of_row(uniq % span, spm)


def _compiled_read_counts(reads, spm: SPMSpec, n_cycles: int) -> np.ndarray | None:
    """`read_keys` counted per (cycle, line) in compiled loops, when the fold policy says
    compiled code pays (`_compiled_fold_pays`: numba loaded, or numpy's time would pass its
    start-up): reads bucketed by cycle (a counting sort), a row read again in its cycle
    skipped (`last[row]` holds the cycle that read it last), each first read counted on its
    row's line. None where numpy counts them."""
    if not reads:
        return None
    total = sum(len(c) for c, _ in reads)
    if not compiled_fold_pays(4 * total, np.float32):
        return None
    cyc = np.concatenate([c for c, _ in reads])
    row = np.concatenate([r for _, r in reads])
    rows = int(row.max()) + 1
    if int(row.min()) < 0 or rows > 1 << 26:
        return None
    line = np.asarray(line_of_row(np.arange(rows, dtype=np.int64), spm), dtype=np.int64)
    rd = np.zeros((n_cycles, spm.lines), dtype=np.int64)
    _compiled_reads()(cyc, row, line, rd)
    return rd


def _read_count_loops(cyc, row, line, rd):  # pragma: no cover - compiled by numba
    n_cycles = rd.shape[0]
    start = np.zeros(n_cycles + 1, dtype=np.int64)
    for i in range(cyc.shape[0]):
        start[cyc[i] + 1] += 1
    for c in range(n_cycles):
        start[c + 1] += start[c]
    order = np.empty(cyc.shape[0], dtype=np.int64)
    fill = start[:n_cycles].copy()
    for i in range(cyc.shape[0]):
        order[fill[cyc[i]]] = i
        fill[cyc[i]] += 1
    last = np.full(line.shape[0], -1, dtype=np.int64)
    for j in range(cyc.shape[0]):
        i = order[j]
        r = row[i]
        if last[r] != cyc[i]:
            last[r] = cyc[i]
            rd[cyc[i], line[r]] += 1


@functools.cache
def _compiled_reads():
    import numba

    return numba.njit(cache=True)(_read_count_loops)


def same_word_rank(words: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """rank[e, l]: how many earlier active lanes of access e hit the same word as lane l
    (0 for the first). Lanes with equal rank can share one row access (`fast.py`'s module
    doc)."""
    rank = np.zeros(words.shape, dtype=np.int64)
    for lane in range(1, words.shape[1]):
        same = (words[:, :lane] == words[:, lane:lane + 1]) & mask[:, :lane]
        rank[:, lane] = same.sum(axis=1)
    return rank


def count_rows(ctx, acc, node: Node, at, cyc: np.ndarray, ti: int, tile: Tile) -> None:
    """Record the SPM row accesses of each access: its distinct rows among live lanes, and for
    SCATTER_ACC one write access per rank of same-word lanes (see `fast.py`'s module doc)."""
    spm = ctx.arch.spm
    sbase, wlo = spm_base(ctx.km, node.buffer, ti, tile)
    width, m = at.width, at.mask
    if node.op is not Op.SCATTER_ACC and abs(at.stride) * (width - 1) < spm.words_per_row:
        _count_rows_narrow(acc, node, sbase - wlo + at.a0, at, cyc, spm)
        return
    addr = at.words()
    srow = (sbase + (addr - wlo)) // spm.words_per_row
    if node.op is Op.SCATTER_ACC:
        srow = srow * width + same_word_rank(addr, m)
    srow = np.where(m, srow, NO_ROW)
    srow.sort(axis=1)
    first = np.ones_like(srow, dtype=bool)
    first[:, 1:] = srow[:, 1:] != srow[:, :-1]
    first &= srow != NO_ROW
    if node.op is Op.SCATTER_ACC:
        srow = np.where(srow != NO_ROW, srow // width, NO_ROW)
    ev, lane = np.nonzero(first)
    if node.op.reads_spm:
        acc.reads.append((cyc[ev], srow[ev, lane]))
    if node.op.writes_spm:
        acc.write_keys.append(cyc[ev] * spm.lines + line_of_row(srow[ev, lane], spm))


def _count_rows_narrow(acc, node: Node, word0: np.ndarray, at, cyc: np.ndarray,
                       spm: SPMSpec) -> None:
    """`count_rows` for an access whose lanes span less than a row (a scalar, or a vector of
    stride s with |s| * (lanes - 1) < words_per_row): it touches the row of its first live
    lane and, when it differs, the row of its last. Live lanes are always a prefix (lanes past
    a loop's end, or past a span), so the last live lane is lane (live - 1). O(n), no sort."""
    stride, m = at.stride, at.mask
    if at.full:
        live = np.full(len(word0), at.width, dtype=np.int64)
    else:
        live = m.sum(axis=1) if m.shape[1] > 1 else m[:, 0].astype(np.int64)
    wpr = spm.words_per_row
    first = word0 // wpr
    last = (word0 + (live - 1) * stride) // wpr
    some = live > 0
    two = some & (last != first)
    cyc_rows = np.concatenate((cyc[some], cyc[two]))
    rows = np.concatenate((first[some], last[two]))
    if node.op.reads_spm:
        acc.reads.append((cyc_rows, rows))
    if node.op.writes_spm:
        acc.write_keys.append(cyc_rows * spm.lines + line_of_row(rows, spm))


def port_stalls(acc, ct: Counters, spm: SPMSpec, n_cycles: int) -> int:
    """Stall cycles of the tile from its row accesses per (cycle, line); counts reads, writes
    and conflict cycles per line into `ct`."""
    size = n_cycles * spm.lines
    rd = _compiled_read_counts(acc.reads, spm, n_cycles)
    if rd is None:
        rd = np.bincount(read_keys(acc.reads, spm),
                         minlength=size).reshape(n_cycles, spm.lines)
    keys = np.concatenate(acc.write_keys) if acc.write_keys else np.zeros(0, np.int64)
    wr = np.bincount(keys, minlength=size).reshape(n_cycles, spm.lines)
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
    return stall
