"""The reference engine: steps every cycle, every PE, every SPM line. Slow; small cases only.

Semantics (shared with `fast.py`, which must give identical `ArrayResult`s):
- A tile's n iterations are cut into U contiguous chunks of W = ceil(n / U): iteration k runs
  on body copy k div W in wave k mod W. A PE holds one op per slot
  (time mod II); in cycle c it executes the op in slot c mod II for the wave whose start
  `wave * II + time` equals c.
- All PEs of the array move in lock step: when the SPM line accesses issued in one cycle need
  more port-cycles than a line has ports, the whole array waits for the busiest line.
- SPM updates (acc, accmax, store, scatter) commit in (cycle, iteration, node) order. An acc
  adds into (an accmax takes the maximum with) its PE's register and flushes (one SPM
  read-modify-write) when its copy's next iteration targets another address or the copy's
  chunk ends. A scatter_acc is an acc whose address adds a loaded index; lanes of one access
  that hit the same word take one write access per repeat (see `fast.py`).
"""

from __future__ import annotations

import numpy as np

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.domain import iterate_domain
from dataflow.dfg.graph import vector_nodes
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import KernelMapping
from dataflow.pe_array.common import (
    Counters,
    buffer_arrays,
    gather_fetch_words,
    spm_base,
    tile_result,
)
from dataflow.pe_array.result import ArrayResult
from dataflow.pe_array.semantics import ACC_IDENTITY, ACC_UFUNC, apply_op, commit
from dataflow.spm.lines import StoreQueues, line_of_row, port_cycles


def run_kernel_reference(km: KernelMapping, arch: ArchSpec, inputs: dict[str, np.ndarray], dtype,
                         trace: bool = False) -> ArrayResult:
    kernel = km.kernel
    spm = arch.spm
    lanes = arch.pe_array.simd_lanes if kernel.vector_var else 1
    vec = vector_nodes(kernel)
    bufs = buffer_arrays(kernel, inputs, dtype)
    fetched = gather_fetch_words(kernel, inputs, arch)  # indirect-DMA words per gather-fetched input
    U, II = km.copies, km.ii
    rows, cols = arch.pe_array.rows, arch.pe_array.cols
    slot_of: dict[tuple[int, int], dict[int, object]] = {}
    for p in km.placements:
        slot_of.setdefault(p.pe, {})[p.time % II] = p
    routes_into: dict[tuple[int, int], list] = {}
    for r in km.routes:
        routes_into.setdefault((r.copy, r.dst), []).append(r)
    ct = Counters(arch)
    busy, op_counts, tiles = ct.busy, ct.op_counts, ct.tiles
    link_word_hops = 0
    events = []
    elapsed = 0
    for ti, tile in enumerate(km.tiles):
        iters = list(iterate_domain(kernel, lanes, (tile.lo, tile.hi)))
        n = len(iters)
        if n == 0:
            tiles.append(tile_result(kernel, ti, 0, 0, 0, km, arch, tile, fetched))
            continue
        waves = -(-n // U)
        n_cycles = (waves - 1) * II + km.schedule_length
        values: dict[tuple[int, int], object] = {}
        regs: dict[tuple[int, int], np.ndarray] = {}
        stall = 0
        sq = StoreQueues(spm) if spm.write_queue_depth else None
        for cyc in range(n_cycles):
            rd = np.zeros(spm.lines, dtype=np.int64)
            wr = np.zeros(spm.lines, dtype=np.int64)
            pending = []
            read_rows: set[int] = set()
            for r in range(rows):
                for c in range(cols):
                    p = slot_of.get((r, c), {}).get(cyc % II)
                    if p is None or cyc < p.time:
                        continue
                    wave = (cyc - p.time) // II
                    k = p.copy * waves + wave
                    if wave >= waves or k >= n:
                        continue
                    node = kernel.nodes[p.node]
                    env = iters[k]
                    act = (min(lanes, kernel.vector_extent - env[kernel.vector_var])
                           if kernel.vector_var else 1)
                    is_vec = node.id in vec
                    busy[r, c] += 1
                    op_counts[node.op.value] += act if is_vec else 1
                    for route in routes_into.get((p.copy, node.id), ()):
                        link_word_hops += len(route.links) * (act if route.src in vec else 1)
                    if trace:
                        events.append((elapsed + cyc + stall, (r, c), node.op.value))
                    if not node.op.is_memory:
                        values[(k, node.id)] = apply_op(
                            node.op, [values[(k, i)] for i in node.inputs], dtype, node.value)
                        continue
                    base = node.addr.const + sum(
                        cf * env[v] for v, cf in node.addr.terms if v != kernel.vector_var)
                    if node.addr.index_stride:
                        base += node.addr.index_stride * int(values[(k, node.inputs[0])])
                    if is_vec:
                        cv = node.addr.coef(kernel.vector_var)
                        base += cv * env[kernel.vector_var]
                        addrs = [base + lane * cv for lane in range(act)]
                    else:
                        addrs = [base]
                    if node.op.accumulates:
                        v = np.asarray(values[(k, node.inputs[-1])], dtype=dtype)
                        v = np.broadcast_to(v, (lanes,)) if is_vec else v.reshape(1)
                        key = (p.copy, node.id)
                        start = np.full(len(v), ACC_IDENTITY[node.op], dtype)
                        regs[key] = ACC_UFUNC[node.op](regs.get(key, start), v)
                        nxt = k + 1
                        same = (wave + 1 < waves and nxt < n
                                and _address(node, iters[nxt], kernel, bufs)
                                == _address(node, env, kernel, bufs))
                        if same:
                            continue  # keep accumulating in the register: no SPM access
                        values[(k, node.id)] = regs.pop(key)
                    sbase, wlo = spm_base(km, node.buffer, ti, tile)
                    if node.op is Op.SCATTER_ACC:  # the r-th lane on a word: the r-th access
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
                            read_rows.add(row)  # one row read once per cycle (broadcast)
                        if node.op.writes_spm:
                            wr[int(line_of_row(row, spm))] += 1
                    buf = bufs[node.buffer]
                    if node.op in (Op.LOAD, Op.GATHER):
                        if is_vec:
                            v = np.zeros(lanes, dtype=buf.dtype)
                            v[:act] = buf[addrs]
                        else:
                            v = buf[addrs[0]]
                        values[(k, node.id)] = v
                    else:
                        src = np.asarray(values[(k, node.id if node.op.accumulates else node.inputs[-1])])
                        src = np.broadcast_to(src, (lanes,)) if is_vec else src.reshape(1)
                        pending.append((k, node.id, node.op, node.buffer,
                                        np.array(addrs, dtype=np.int64), src[:len(addrs)]))
            for row in read_rows:
                rd[int(line_of_row(row, spm))] += 1
            if sq is not None:
                s_t, need = sq.cycle(rd, wr)
            else:
                need = port_cycles(rd, wr, spm) - 1
                s_t = int(need.max())
            stall += s_t
            ct.reads_line += rd
            ct.writes_line += wr
            ct.conflicts_line += need
            for k, nid, op, bname, addrs, src in sorted(pending, key=lambda e: (e[0], e[1])):
                commit(op, bufs[bname], addrs, src)
        if sq is not None:
            s_t, extra = sq.drain()
            stall += s_t
            ct.conflicts_line += extra
        tiles.append(tile_result(kernel, ti, n, n_cycles + stall, stall, km, arch, tile, fetched))
        elapsed += n_cycles + stall
    ct.link_word_hops = link_word_hops
    return ct.result(kernel, bufs, tuple(events) if trace else None)


def _address(node, env, kernel, bufs) -> int:
    """Lane-0 word address of an access in iteration `env`; an indirect one adds its loaded
    index (read from the buffer: a kernel never loads a buffer it writes)."""
    a = node.addr.const + sum(cf * env[v] for v, cf in node.addr.terms)
    if node.addr.index_stride:
        idx = kernel.nodes[node.inputs[0]]
        a += node.addr.index_stride * int(bufs[idx.buffer][_address(idx, env, kernel, bufs)])
    return a
