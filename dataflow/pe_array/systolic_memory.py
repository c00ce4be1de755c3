"""SCALE-Sim 3.0.0's memory model of a systolic array with a user-set DRAM bandwidth
(`InterfaceBandwidth: USER`), ported from its source for the systolic path.

SCALE-Sim gives each operand its own double-buffered SRAM and its own DRAM link; this module
follows, per kernel (one SCALE-Sim layer):

* `compute/systolic_compute_{os,ws,is}.py`: the prefetch orders and the demand lines
  (`dataflow.pe_array.systolic_demand`);
* `memory/read_buffer.py`: the SRAM holds `capacity` words, half active (`active_buf_frac`
  0.5); the fetch order is cut into sets of ceil(capacity / 100) words, the active buffer is
  the first ceil(active / set) sets, the rest of the buffer the next ones. The first demand
  prefetches the active half before cycle 0 (ceil(active / bw) DRAM lines, bw words a cycle,
  or the whole operand if smaller); a demand whose set is not active shifts the window by
  the prefetch half and issues a prefetch of ceil(prefetch / bw) lines right after the
  previous one (response one cycle later), and the demand line waits for it. The wait is
  counted as SCALE-Sim counts it (`service_reads`): `offset += p` and again `+= p` when p > 0,
  so a positive wait counts twice and a negative one shortens the line's offset;
* `memory/write_buffer.py`: ofmap words fill the SRAM; when more than the drain half is
  held and no drain is running, it drains (ceil(drain / bw) lines at bw words a cycle); a
  write finding the SRAM full waits for the running drain; the rest drains after the last
  demand line;
* `memory/double_buffered_scratchpad_mem.py`: a line's stall is the largest of the three
  buffers' waits, stalls accumulate into the cycle of the next line; "Total Cycles" is the
  last ofmap write's cycle, "Total Cycles (incl. prefetch)" runs from the first prefetch
  (before cycle 0) to the end of the last ofmap drain (`single_layer_sim.calc_report_data`).

Operand addresses are those of the GEMM (each element of A, B and C its own address) unless the
caller passes the ifmap's: a convolution's im2col matrix repeats ifmap pixels, which SCALE-Sim's
addresses share (`scalesim_im2col_addresses`); an address hits wherever it sits in the window
(docs/conventions.md#scale-sim-convolution-and-user-bandwidth).

Speed (issue 14). The model is SCALE-Sim's, not its per-word simulation: the ofmap writes per
demand line follow in closed form from the fold geometry (`systolic_demand.write_counts`); a
read SRAM whose every set is active (the operand fits its active half) never prefetches again,
which its sizes alone decide, so its fetch order and demand are built only for an SRAM that
refetches (`_read_buffer`); and the service loop steps only the lines where something happens
-- a prefetch, a drain starting, a write waiting -- storing the words of the quiet lines
between them at once (`_quiet_lines`). Each shortcut gives the figures the per-line loop gives
(tests/test_scalesim_memory.py runs both). The pure-Python pieces (the ofmap SRAM, the
constants, the timeline record) live in `systolic_timing`, whose numpy-free path serves the
ofmap SRAM the same way when no read SRAM refetches (docs/conventions.md#timing-only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dataflow.arch.spec import ArchSpec
from dataflow.mapper.mapping import SystolicMapping
from dataflow.pe_array.result import ArrayResult, SystemTimeline
from dataflow.pe_array.systolic_demand import (
    fetch_sizes,
    prefetch_orders,
    read_demand,
    write_counts,
)
from dataflow.pe_array.systolic_timing import (  # the light pieces, shared with the fast path
    ACTIVE_BUF_FRAC,
    READ_HIT_LATENCY,
    READ_PORT_LATENCY,
    SETS_PER_BUFFER,
    SystolicMemoryTimeline,
    WriteBuffer,
    link_words_per_cycle,
    sram_words,
)


def scalesim_im2col_addresses(h: int, w: int, r: int, s: int, c: int, stride: int
                              ) -> np.ndarray:
    """SCALE-Sim's ifmap operand matrix of a convolution (`compute/operand_matrix.py`): row
    per output pixel (oh = ow = ceil((H - R) / S) + 1 sizing), column per window element in
    (filter row, filter column, channel) order, address (row W + column) C + channel of an
    H x W x C ifmap, -1 where the window hangs over the edge."""
    oh, ow = -(-(h - r) // stride) + 1, -(-(w - s) // stride) + 1
    oy, ox = np.divmod(np.arange(oh * ow), ow)
    fr, fs, ch = np.unravel_index(np.arange(r * s * c), (r, s, c))
    row = oy[:, None] * stride + fr[None, :]
    col = ox[:, None] * stride + fs[None, :]
    addr = (row * w + col) * c + ch[None, :]
    return np.where((row < h) & (col < w), addr, -1)


# ---- the SRAMs (memory/read_buffer.py, memory/write_buffer.py) ----

@dataclass(frozen=True)
class _ReadBuffer:
    """A read SRAM's prefetch geometry and the demand lines at which it issues prefetches."""

    first_fill_lines: int  # DRAM lines of the first (active-half) prefetch
    prefetch_lines: int  # DRAM lines of every later prefetch
    prefetch_at_line: np.ndarray  # demand line of each later prefetch, in order


def _read_buffer(fetch_size: int, stored: int, words: int, bw: int, orders) -> _ReadBuffer:
    """The SRAM of an operand with `stored` addresses (>= 0) in a fetch order of `fetch_size`
    entries; `orders()` gives (fetch order, its demand as (lines, addresses) chunks in service
    order), needed only when not every set is active (SCALE-Sim's `service_reads` then shifts
    the window). A chunk is scanned for its next miss at once, never the rest of the run."""
    active = int(math.ceil(words * ACTIVE_BUF_FRAC))
    prefetch = words - active
    per_set = math.ceil(words / SETS_PER_BUFFER)
    num_sets = stored // per_set + 1
    n_act = min(math.ceil(active / per_set), num_sets)
    n_pf = min(math.ceil(prefetch / per_set), num_sets - n_act)
    first = min(math.ceil(active / bw), math.ceil(fetch_size / bw))
    events = []
    if n_act < num_sets:  # else every set is active and every demand hits
        fetch, chunks = orders()
        addr = fetch[fetch >= 0]
        hit = _window_hits(addr, np.arange(addr.size) // per_set, num_sets, n_act)
        start = 0
        for demand_lines, demand_addr in chunks:
            pos = 0
            while pos < demand_addr.size:
                miss = np.flatnonzero(~hit(start)[demand_addr[pos:]])
                if miss.size == 0:
                    break
                pos += int(miss[0])
                while not hit(start)[demand_addr[pos]]:  # the while loop of service_reads
                    events.append(int(demand_lines[pos]))
                    start = (start + n_pf) % num_sets
    return _ReadBuffer(first, math.ceil(prefetch / bw), np.asarray(events, dtype=np.int64))


def _window_hits(addr: np.ndarray, set_id: np.ndarray, num_sets: int, n_act: int):
    """`hit(start)`: per address, whether one of the sets holding it is active when the active
    window starts at set `start` (`read_buffer.active_buffer_hit`: an address hits wherever it
    sits in the window)."""
    size = int(addr.max()) + 1
    cache: dict[int, np.ndarray] = {}

    def hit(start: int) -> np.ndarray:
        if start not in cache:
            row = np.zeros(size, dtype=bool)
            row[addr[(set_id - start) % num_sets < n_act]] = True
            cache[start] = row
        return cache[start]

    return hit


def _read_stall(buf: _ReadBuffer, n: int, cycle: int, issued: int) -> int:
    """The line's wait in `service_reads` for its `n` prefetches after `issued` earlier ones
    (prefetch j lands at -1 + j (lines + 1): each starts the cycle after the previous one)."""
    offset = READ_HIT_LATENCY
    for j in range(issued + 1, issued + n + 1):
        p = (-1 + j * (buf.prefetch_lines + READ_PORT_LATENCY)) - (cycle + offset)
        offset += p
        if p > 0:
            offset += p
    return offset - READ_HIT_LATENCY


def _read_buffers(sm: SystolicMapping, arch: ArchSpec, ifmap_addresses, bw: int):
    """The ifmap and filter SRAMs (`_read_buffer`); the fetch orders and demand are built only
    for one that refetches."""
    def orders(i: int):
        def get():
            return (prefetch_orders(sm, ifmap_addresses)[i],
                    read_demand(sm, i, ifmap_addresses))
        return get

    stored_if = (sm.m * sm.k if ifmap_addresses is None
                 else int(np.count_nonzero(np.asarray(ifmap_addresses) >= 0)))
    sizes = sram_words(arch)
    return tuple(_read_buffer(size, stored, words, bw, orders(i)) for i, (size, stored, words)
                 in enumerate(zip(fetch_sizes(sm), (stored_if, sm.k * sm.n), sizes)))


@dataclass
class _Service:
    """The service loop's state (`double_buffered_scratchpad_mem.service_memory_requests`)."""

    stall: int = 0
    total: int = 0
    last_out: int | None = None


def _quiet_lines(busy: np.ndarray, written: np.ndarray, pos: int, stop: int, stall: int,
                 ofmap: WriteBuffer) -> int:
    """How many of the busy lines from `pos` (before `stop`, the next one with a prefetch) store
    their words without changing anything but the count: each finds room in bulk
    (`WriteBuffer.write`: while a drain runs, all but one free word; else down to the drain
    threshold). `written[j]` is the ofmap words of busy lines 0..j."""
    before = int(written[pos - 1]) if pos else 0
    running = pos + int(np.searchsorted(busy[pos:stop], ofmap.drain_end - stall))
    lim = before + ofmap.free - 1  # words that fit while the drain runs
    quiet = pos + int(np.searchsorted(written[pos:running], lim, side="right"))
    if quiet < running:
        return quiet - pos
    lim = before + ofmap.free - (ofmap.total - ofmap.drain_size)
    return running + int(np.searchsorted(written[running:stop], lim, side="right")) - pos


def _service(bufs, ofmap: WriteBuffer, writes: np.ndarray) -> _Service:
    """Every demand line with work in order: the waits of its prefetches and writes delay the
    lines after it. Runs of quiet lines (`_quiet_lines`) are stored at once."""
    lines = writes.size
    # (bincount and masks, not np.unique: numpy 2.4's unique imports numpy.ma, 40 ms)
    counts = [np.bincount(b.prefetch_at_line, minlength=lines) for b in bufs]
    prefetching = np.flatnonzero(counts[0] + counts[1])
    busy = np.flatnonzero((writes > 0) | (counts[0] + counts[1] > 0))
    written = np.cumsum(writes[busy])
    next_prefetch = np.searchsorted(busy, prefetching)  # positions in busy, in order
    st, issued, pos, k = _Service(), [0, 0], 0, 0
    while pos < busy.size:
        while k < next_prefetch.size and next_prefetch[k] < pos:
            k += 1
        stop = int(next_prefetch[k]) if k < next_prefetch.size else busy.size
        quiet = _quiet_lines(busy, written, pos, stop, st.stall, ofmap) if pos < stop else 0
        if quiet:
            last = pos + quiet - 1
            ofmap._store(int(written[last] - (written[pos - 1] if pos else 0)))
            cycle = int(busy[last]) + st.stall
            st.total = max(st.total, cycle)
            st.last_out = cycle if busy[last] == lines - 1 else None
            pos = last + 1
            continue
        i = int(busy[pos])
        cycle = i + st.stall
        waits = []
        for b, buf in enumerate(bufs):
            n = int(counts[b][i])
            waits.append(_read_stall(buf, n, cycle, issued[b]))
            issued[b] += n
        done = ofmap.write(int(writes[i]), cycle)
        st.total = max(st.total, done)
        st.last_out = done if i == lines - 1 else None
        st.stall += int(max(*waits, done - cycle))
        pos += 1
    return st


def systolic_memory(sm: SystolicMapping, arch: ArchSpec,
                    ifmap_addresses: np.ndarray | None = None) -> SystolicMemoryTimeline:
    """SCALE-Sim's USER-bandwidth run of one systolic kernel (see the module docstring).
    `ifmap_addresses`: the M x K ifmap operand's addresses as SCALE-Sim numbers them (a
    convolution's im2col repeats pixels: `scalesim_im2col_addresses`; -1 over the edge); by
    default every element of A is its own address."""
    bw = link_words_per_cycle(arch)
    sizes = sram_words(arch)
    bufs = _read_buffers(sm, arch, ifmap_addresses, bw)
    ofmap = WriteBuffer(sizes[2], bw)
    writes = write_counts(sm)
    lines = writes.size
    st = _service(bufs, ofmap, writes)
    last_out = lines - 1 + st.stall if st.last_out is None else st.last_out
    # (the last line writing nothing: its service cycle is its own)
    total = max(st.total, last_out)
    ofmap.drain_all(last_out)
    first = max(b.first_fill_lines for b in bufs)
    stop = ofmap.dram_stop if ofmap.dram_stop is not None else total
    return SystolicMemoryTimeline(
        total_cycles=int(total), total_cycles_incl_prefetch=int(stop + first),
        stall_cycles=int(st.stall), prefetch_cycles=int(first), link_words_per_cycle=bw,
        dram_words_read=sum((b.first_fill_lines + b.prefetch_lines * b.prefetch_at_line.size)
                            * bw for b in bufs),
        dram_words_written=int(writes.sum()),
        sram_words=sizes)


def run_systolic_system(kernels: list[SystolicMapping], arrays: list[ArrayResult], arch: ArchSpec
                        ) -> tuple[SystemTimeline, tuple[SystolicMemoryTimeline, ...]]:
    """The system timeline of systolic kernels run one after another, each as one SCALE-Sim
    layer (`systolic_memory`): a kernel lasts its "Total Cycles" + 1 (a count, where SCALE-Sim
    reports the 0-based index of the last cycle; the caller takes the 1 off the whole run), its
    stalls are DRAM stalls, and its first fill is left out as SCALE-Sim leaves it out (it is
    in each kernel's `total_cycles_incl_prefetch`). Tiles are placed at their compute offsets
    in the kernel's span (SCALE-Sim does not place its stalls per fold)."""
    mems = tuple(systolic_memory(sm, arch, sm.a_addresses) for sm in kernels)
    spans, tile_spans, now = [], [], 0
    for mem, a in zip(mems, arrays):
        start = now
        for t in a.tiles:
            tile_spans.append((a.kernel, t.index, now, now + t.compute_cycles))
            now += t.compute_cycles
        now = start + mem.total_cycles + 1
        spans.append((start, now))
    return SystemTimeline(cycles=now, stall_cycles_dram=sum(m.stall_cycles for m in mems),
                          stall_cycles_reconfiguration=0, kernel_spans=tuple(spans),
                          tile_spans=tuple(tile_spans)), mems
