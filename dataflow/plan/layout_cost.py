"""SPM port-conflict stalls of a mapped kernel without running its values (the layout search's
cost, `spm_layout.choose_layout`; docs/planning_speed.md).

The fast engine (`pe_array.fast`) counts a tile's SPM row accesses per (cycle, line) from the
address streams and stalls the lock-step array by the port arithmetic of `spm.lines`; the
values it computes and commits play no part in that count when no address depends on data.
`kernel_stalls` repeats exactly that count for such kernels (plain loads and stores, affine
addresses: every butterfly stage kernel), skipping the values, the op counts and the DMA
figures, and returns None for any other kernel (the caller then runs the engine).
`tests/test_planning_speed.py` holds it equal to the engine's `stall_cycles_spm_conflict` on
random layouts.

Store queues (`spm.write_queue_depth`) are stepped cycle by cycle as `spm.lines.StoreQueues`
does (its arithmetic in plain integers), but a cycle that starts with empty queues and asks
no line for more than its ports is skipped: it retires its stores in the cycle and stalls
nothing, so the count is unchanged.
"""

from __future__ import annotations

import numpy as np

from dataflow.arch.spec import ArchSpec, SPMSpec
from dataflow.dfg.domain import enumerate_domain
from dataflow.dfg.graph import vector_nodes
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import KernelMapping
from dataflow.pe_array.common import lane_addresses, spm_base
from dataflow.pe_array.fast_reads import NO_ROW, read_keys
from dataflow.spm.lines import line_of_row, port_cycles


def timing_only(km: KernelMapping) -> bool:
    """Whether `kernel_stalls` can count `km`: every SPM access a plain LOAD or STORE at an
    affine address (no accumulation, scatter or loaded index)."""
    return all(not n.op.is_memory
               or (n.op in (Op.LOAD, Op.STORE) and not n.addr.index_stride)
               for n in km.kernel.nodes)


def kernel_stalls(km: KernelMapping, arch: ArchSpec, tiles=None) -> int | None:
    """Sum of the engine's SPM port-conflict stall cycles over `tiles` (indices; all tiles by
    default) of `km`, or None when `timing_only(km)` is false."""
    if not timing_only(km):
        return None
    kernel = km.kernel
    lanes = arch.pe_array.simd_lanes if kernel.vector_var else 1
    vec = vector_nodes(kernel)
    times = np.zeros((km.copies, len(kernel.nodes)), dtype=np.int64)
    for p in km.placements:
        times[p.copy, p.node] = p.time
    mem = [n for n in kernel.nodes if n.op.is_memory]
    total = 0
    for ti in (range(len(km.tiles)) if tiles is None else tiles):
        tile = km.tiles[ti]
        dom = enumerate_domain(kernel, lanes, (tile.lo, tile.hi))
        n = len(dom[kernel.loops[0].var])
        if n == 0:
            continue
        k = np.arange(n, dtype=np.int64)
        waves = -(-n // km.copies)
        copy, wave = k // waves, k % waves
        n_cycles = (waves - 1) * km.ii + km.schedule_length
        if kernel.vector_var:
            active = np.minimum(lanes, kernel.vector_extent - dom[kernel.vector_var])
        else:
            active = np.ones(n, dtype=np.int64)
        mask = np.arange(lanes)[None, :] < active[:, None]
        reads, writes = [], []
        for (is_load, how), nodes in _access_groups(kernel, mem, vec).items():
            srow = _rows(km, arch, nodes, how, dom, ti, tile, n, lanes, mask)
            first = np.ones_like(srow, dtype=bool)
            first[..., 1:] = srow[..., 1:] != srow[..., :-1]
            first &= srow != NO_ROW
            which, ev, lane = np.nonzero(first)
            ids = np.array([node.id for node in nodes], dtype=np.int64)
            cyc = wave[ev] * km.ii + times[copy[ev], ids[which]]
            (reads if is_load else writes).append((cyc, srow[which, ev, lane]))
        total += _stalls(reads, writes, arch.spm, n_cycles)
    return total


def _access_groups(kernel, mem, vec) -> dict:
    """The memory nodes by (load?, lane rule): a scalar, a span of consecutive words, or a
    vector with its lane stride; each group's rows are computed as one array (`_rows`)."""
    groups: dict = {}
    for node in mem:
        if node.id not in vec:
            how = ("scalar",)
        elif node.addr.span:
            how = ("span",)
        else:
            how = ("vector", node.addr.coef(kernel.vector_var))
        groups.setdefault((node.op is Op.LOAD, how), []).append(node)
    return groups


def _rows(km, arch, nodes, how, dom, ti, tile, n, lanes, mask) -> np.ndarray:
    """(nodes, iterations, lanes) SPM rows the nodes of one `_access_groups` group touch
    (NO_ROW for an inactive lane), each iteration's rows sorted: the engine's addresses
    (`lane_addresses`, `spm_base`) for all nodes of the group at once."""
    kernel = km.kernel
    vv = kernel.vector_var
    a = np.empty((len(nodes), n), dtype=np.int64)
    for j, node in enumerate(nodes):
        row = np.full(n, node.addr.const, dtype=np.int64)
        for v, c in node.addr.terms:
            if v != vv or node.addr.span:
                row = row + c * dom[v]
        a[j] = row
    if how[0] == "scalar":
        addr, m = a[:, :, None], np.ones((1, n, 1), dtype=bool)
    elif how[0] == "span":
        addr = lane_addresses(a, 1, lanes)
        spans = np.array([node.addr.span for node in nodes], dtype=np.int64)
        m = np.broadcast_to((np.arange(lanes)[None, :] < spans[:, None])[:, None, :],
                            (len(nodes), n, lanes))
    else:
        cv = how[1]
        addr, m = lane_addresses(a + dom[vv][None, :] * cv, cv, lanes), mask[None, :, :]
    bases = np.array([spm_base(km, node.buffer, ti, tile) for node in nodes], dtype=np.int64)
    sbase, wlo = bases[:, 0, None, None], bases[:, 1, None, None]
    srow = np.where(m, (sbase + (addr - wlo)) // arch.spm.words_per_row, NO_ROW)
    srow.sort(axis=2)
    return srow


def _stalls(reads, writes, spm: SPMSpec, n_cycles: int) -> int:
    """The engine's `fast_reads.port_stalls` count (reads of one row in one cycle are one
    access, `read_keys`), without its per-line counters."""
    size = n_cycles * spm.lines
    rkeys = read_keys(reads, spm)
    if writes:
        wkeys = np.concatenate([c * spm.lines + line_of_row(r, spm) for c, r in writes])
    else:
        wkeys = np.zeros(0, np.int64)
    rd = np.bincount(rkeys, minlength=size).reshape(n_cycles, spm.lines)
    wr = np.bincount(wkeys, minlength=size).reshape(n_cycles, spm.lines)
    if not spm.write_queue_depth:
        return int((port_cycles(rd, wr, spm) - 1).max(axis=1).sum())
    return _queued_stalls(rd, wr, spm)


def _queued_stalls(rd: np.ndarray, wr: np.ndarray, spm: SPMSpec) -> int:
    """`StoreQueues` stepped over the cycles of `rd`, `wr` ((cycles, lines) row accesses) and
    drained, in plain integers (a few lines per cycle: numpy's per-call cost dominated), with
    the cycles that start with empty queues and fit the ports skipped."""
    R, W, D = spm.read_ports_per_line, spm.write_ports_per_line, spm.write_queue_depth
    n_cycles = rd.shape[0]
    busy = np.flatnonzero((rd > R).any(axis=1) | (wr > W).any(axis=1)).tolist()
    lines = range(spm.lines)
    # each cycle's issue cycles for its reads, max(1, max over lines of ceil(reads / R)),
    # for every cycle at once (the same integers the loop took per cycle)
    cycles_for_reads = np.maximum(1, (-(-rd // R)).max(axis=1)).tolist()
    writes = wr.tolist()
    q = [0] * spm.lines
    stall, t, nxt = 0, 0, 0
    while True:
        if not any(q):
            # empty queues: every cycle up to the next busy one retires its stores in place
            while nxt < len(busy) and busy[nxt] < t:
                nxt += 1
            if nxt == len(busy):
                break
            t = busy[nxt]
        if t >= n_cycles:
            break
        c, w_t = cycles_for_reads[t], writes[t]
        # per line: v - min(v, c W) retired, then ceil(max(v - D, 0) / W) extra cycles for
        # the longest queue beyond its depth (v >= 0; the same integers, fewer calls)
        e, cw = 0, c * W
        for i in lines:
            v = q[i] + w_t[i]
            v = v - cw if v > cw else 0
            q[i] = v
            if v > D:
                x = -(-(v - D) // W)
                if x > e:
                    e = x
        if e:
            ew = e * W
            q = [v - ew if v > ew else 0 for v in q]
        stall += c - 1 + e
        t += 1
    return stall + max(-(-v // W) for v in q)
