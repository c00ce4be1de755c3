"""`--timing-only` of a dense GEMM on a systolic array without numpy: the closed forms of
`dataflow.pe_array.systolic` and SCALE-Sim's memory model (`systolic_memory`) in integer
arithmetic, wherever no read SRAM refetches (docs/conventions.md#timing-only).

A whole `dataflow simulate --timing-only` process is mostly imports: numpy alone costs about as
much as the rest of the run. Every figure of a timing-only GEMM follows from M, N, K, the
dataflow, the array and the SRAM sizes, in closed form per fold group:

* compute cycles: ⌈Sr/R⌉·⌈Sc/C⌉ folds of `fold_cycles` each (`systolic.closed_form_cycles`);
* SRAM word accesses (`systolic._sram_accesses`) and PE busy cycles (`systolic._busy`): every
  fold reads its operand tiles once and keeps its rr x cc PEs busy T cycles;
* SCALE-Sim's memory model (`systolic_memory.systolic_memory`) when neither read SRAM
  refetches (every set of its operand is in its active half: `_read_buffer` then records no
  prefetch, so no demand line waits for a read). What is left is the ofmap SRAM
  (`WriteBuffer`, shared with `systolic_memory`), served line by line as `_service` serves it,
  with the words each demand line writes summed in closed form per fold (`_Written`) instead of
  an array of every line: runs of quiet lines are found by bisection and stored at once, the
  lines where a drain starts or a write waits go through `WriteBuffer.write`. When the words
  written fit its drain half (SCALE-Sim-sized SRAMs) nothing drains before the end: one quiet
  run, no stall, "Total Cycles" are the compute cycles, and the ofmap drains after the last
  demand line, ⌈words / bw⌉ DRAM lines back to back.

Anything else -- a read SRAM that refetches (its fetch order and demand are per-word arrays),
an arch that is not a systolic preset of three SRAMs, a flag the fast path does not take --
returns None from `timing_only_result`, and the caller runs the full path
(`matmul_workloads._timing_only`), which also raises its errors. `tests/test_systolic_timing.py`
holds the two paths' JSON equal field by field.

The light pieces of the memory model (its constants, the timeline record, the DRAM-link and
SRAM sizes, the ofmap SRAM, the notes) live here, imported by `systolic_memory`, so both paths
share them; the result is put together by the same `assemble_result` and `energy_breakdown`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from dataflow.arch.spec import ArchSpec, PEKind
from dataflow.errors import UserError
from dataflow.pe_array.assemble import assemble_result, energy_breakdown
from dataflow.pe_array.result import ArrayResult, KernelResult, TileResult
from dataflow.pe_array.roofline import floors

ACTIVE_BUF_FRAC = 0.5  # single_layer_sim.py: active_buf_frac for every SRAM
SETS_PER_BUFFER = 100  # read_buffer.prepare_hashed_buffer: ceil(total / 100) words a set
READ_HIT_LATENCY = 1  # read_buffer.hit_latency
READ_PORT_LATENCY = 1  # read_port.latency (no Ramulator trace)
DATAFLOWS = ("os", "ws", "is")
#: most folds the fast path times: each is a `TileResult`, as in the full path, which for more
#: (a GEMM the full path refuses for its operands' memory, or times for minutes) runs instead
MAX_FOLDS = 1 << 18


@dataclass(frozen=True)
class SystolicMemoryTimeline:
    """One kernel's SCALE-Sim USER-bandwidth figures, in cycles (SCALE-Sim's 0-based count)."""

    total_cycles: int  # "Total Cycles": the last ofmap write's cycle, stalls included
    total_cycles_incl_prefetch: int  # "Total Cycles (incl. prefetch)"
    stall_cycles: int  # "Stall Cycles"
    prefetch_cycles: int  # DRAM lines of the first fill, before cycle 0
    link_words_per_cycle: int  # each of the three DRAM links
    dram_words_read: int  # ifmap and filter prefetches, as SCALE-Sim counts them (whole lines)
    dram_words_written: int  # ofmap words drained
    sram_words: tuple[int, int, int]  # ifmap, filter, ofmap SRAM sizes


def link_words_per_cycle(arch: ArchSpec) -> int:
    """Words a cycle on each operand's DRAM link: the arch's DRAM bandwidth shared by the
    SRAMs (`spm.lines`, one per operand), whole words (SCALE-Sim's lines are whole words)."""
    words = int(arch.dram.bytes_per_cycle // (arch.word_bytes * arch.spm.lines))
    if words < 1:
        raise UserError(f"{arch.name}: dram.bytes_per_cycle {arch.dram.bytes_per_cycle} gives "
                        f"less than one word a cycle to each of the {arch.spm.lines} SRAMs")
    return words


def sram_words(arch: ArchSpec) -> tuple[int, int, int]:
    """(ifmap, filter, ofmap) SRAM sizes in words: the systolic preset's SPM lines 0, 1, 2
    (`spm.capacity_words_per_line` each)."""
    if arch.spm.lines != 3:
        raise UserError(f"{arch.name}: a systolic array needs spm.lines = 3 (ifmap, filter, "
                        f"ofmap SRAMs), got {arch.spm.lines}")
    return (arch.spm.capacity_words_per_line,) * 3


def memory_notes(mems: tuple[SystolicMemoryTimeline, ...]) -> tuple[str, ...]:
    """One line per kernel with SCALE-Sim's figures that `SimResult` has no field for."""
    return tuple(
        f"SCALE-Sim memory (kernel {i}): Total Cycles {m.total_cycles}, Total Cycles (incl. "
        f"prefetch) {m.total_cycles_incl_prefetch}, Stall Cycles {m.stall_cycles}; SRAMs "
        f"{'/'.join(map(str, m.sram_words))} words, {m.link_words_per_cycle} words/cycle a "
        f"DRAM link" for i, m in enumerate(mems))


# ---- the ofmap SRAM (memory/write_buffer.py) ----

class WriteBuffer:
    """memory/write_buffer.py's ofmap SRAM, word by word where its state changes (pure Python:
    `systolic_memory` and the timing path share it)."""

    def __init__(self, words: int, bw: int):
        self.total = words
        self.drain_size = words - int(math.ceil(words * ACTIVE_BUF_FRAC))
        self.bw = bw
        self.free = words
        self.drain_end = 0
        self.line_fill = 0  # words in the open trace line
        # the closed trace lines: how many, and the words of those closed before they were
        # full (`_close_line`); every other line holds `bw` words
        self.trace_count = 0
        self.partial_lines: dict[int, int] = {}
        self.drained_lines = 0
        self.dram_stop = None

    def _store(self, k: int) -> None:
        self.free -= k
        words = self.line_fill + k
        self.trace_count += words // self.bw
        self.line_fill = words % self.bw

    def _close_line(self) -> None:  # append_to_trace_mat(force=True)
        if self.line_fill:
            self.partial_lines[self.trace_count] = self.line_fill
            self.trace_count += 1
            self.line_fill = 0

    def _drain(self, start: int) -> int:  # empty_drain_buf
        lines = min(math.ceil(self.drain_size / self.bw), self.trace_count - self.drained_lines)
        if lines == 0:
            return start
        last = self.partial_lines.get(self.drained_lines + lines - 1, self.bw)
        self.free += (lines - 1) * self.bw + last
        self.drained_lines += lines
        end = start + lines - 1
        self.dram_stop = end if self.dram_stop is None else max(self.dram_stop, end)
        return end

    def write(self, n: int, cycle: int) -> int:
        """Store `n` words demanded at `cycle` (service_writes); the cycle the line is done."""
        current = cycle
        threshold = self.total - self.drain_size
        while n:
            if current < self.drain_end:  # a drain runs: a write into a full SRAM waits
                bulk = min(n, self.free - 1)
            else:  # more than the drain half held: start a drain
                bulk = min(n, self.free - threshold)
            if bulk > 0:  # words that change nothing but the count
                self._store(bulk)
                n -= bulk
                continue
            self._store(1)
            n -= 1
            if current < self.drain_end:
                if not self.free > 0:
                    current = self.drain_end
            elif self.free < threshold:
                self._close_line()
                self.drain_end = self._drain(current)
        return current

    def drain_all(self, cycle: int) -> None:  # empty_all_buffers
        self._close_line()
        while self.drained_lines < self.trace_count:
            self.drain_end = self._drain(cycle)
            cycle = self.drain_end + 1


# ---- the closed forms ----

def _dims(df: str, m: int, n: int, k: int) -> tuple[int, int, int]:
    """(Sr, Sc, T) as `systolic.systolic_dims`."""
    return {"os": (m, n, k), "ws": (k, n, m), "is": (k, m, n)}[df]


def fetch_sizes(df: str, m: int, n: int, k: int, rows: int, cols: int) -> tuple[int, int]:
    """Entries (padding included) of the ifmap and filter fetch orders, as
    `systolic_demand.fetch_sizes`."""
    if df == "os":
        return -(-m // rows) * rows * k, -(-n // cols) * cols * k
    if df == "ws":
        return -(-k // rows) * rows * m, -(-n // cols) * cols * k
    return -(-m // cols) * cols * k, -(-k // rows) * rows * n


def _never_refetches(stored: int, words: int) -> bool:
    """`systolic_memory._read_buffer`'s test that every set of an operand of `stored` words is
    in the active half of a `words`-word SRAM (then it records no later prefetch)."""
    active = int(math.ceil(words * ACTIVE_BUF_FRAC))
    per_set = math.ceil(words / SETS_PER_BUFFER)
    num_sets = stored // per_set + 1
    return min(math.ceil(active / per_set), num_sets) >= num_sets


def _diagonal_prefix(p: int, q: int, s: int) -> int:
    """How many (i, j), 0 <= i < p, 0 <= j < q, have i + j <= s: the words of a p x q
    wavefront written by its s-th line (`systolic_demand.diagonal_counts` summed)."""
    if s < 0:
        return 0
    a = min(p - 1, s)  # rows i = 0 .. a reach line s; those with i <= s - q + 1 in full
    full = min(a, s - q + 1) + 1 if s - q + 1 >= 0 else 0
    lo = full  # rows lo .. a reach s - i + 1 words each
    n = a - lo + 1
    return q * full + (n * (s + 1) - (lo + a) * n // 2 if n > 0 else 0)


class _Written:
    """`systolic_demand.write_counts` summed: ofmap words written by demand lines 0 .. j, in
    closed form per fold (folds column-folds outer, each writing its p x cc wavefront from line
    `first` of its `per_fold`)."""

    def __init__(self, df: str, m: int, n: int, k: int, rows: int, cols: int):
        self.os = df == "os"
        self.sr, self.sc, self.t = _dims(df, m, n, k)
        self.rows, self.cols = rows, cols
        self.per_fold = fold_cycles(df, rows, cols, self.t)
        self.nfr = -(-self.sr // rows)
        self.lines = self.nfr * -(-self.sc // cols) * self.per_fold
        self.total = self.through(self.lines - 1)

    def through(self, j: int) -> int:
        if j < 0:
            return 0
        j = min(j, self.lines - 1)
        f, o = divmod(j, self.per_fold)
        fc, fr = divmod(f, self.nfr)
        rr, cc = min(self.rows, self.sr - fr * self.rows), min(self.cols, self.sc - fc * self.cols)
        rows_before = min(fr * self.rows, self.sr)
        if self.os:  # p = rr, from line T + R - 1 - rr
            before = min(fc * self.cols, self.sc) * self.sr + cc * rows_before
            return before + _diagonal_prefix(rr, cc, o - (self.t + self.rows - 1 - rr))
        before = (min(fc * self.cols, self.sc) * self.nfr + cc * fr) * self.t
        return before + _diagonal_prefix(self.t, cc, o - (2 * self.rows - 1))

    def last_at_most(self, lo: int, hi: int, limit: int) -> int:
        """The first j in [lo, hi) with `through(j)` > limit (hi if none): numpy's
        searchsorted(side="right") on the cumulative words."""
        while lo < hi:
            mid = (lo + hi) // 2
            if self.through(mid) <= limit:
                lo = mid + 1
            else:
                hi = mid
        return lo


def _service_writes(written: _Written, ofmap: WriteBuffer) -> tuple[int, int, int | None]:
    """`systolic_memory._service` when no read SRAM prefetches (every read wait is 0): every
    demand line in order, the runs of quiet lines (`systolic_memory._quiet_lines`) stored at
    once, the others through `WriteBuffer.write`, whose waits delay the lines after it. Lines
    that write nothing count as quiet (they change nothing). (stall, total, last_out)."""
    lines = written.lines
    stall = total = 0
    last_out = None
    pos = 0
    threshold = ofmap.total - ofmap.drain_size
    while pos < lines:
        before = written.through(pos - 1)
        running = pos + min(max(ofmap.drain_end - stall - pos, 0), lines - pos)
        quiet = written.last_at_most(pos, running, before + ofmap.free - 1)
        if quiet == running:
            quiet = written.last_at_most(running, lines, before + ofmap.free - threshold)
        if quiet > pos:
            last = quiet - 1
            ofmap._store(written.through(last) - before)
            cycle = last + stall
            total = max(total, cycle)
            last_out = cycle if last == lines - 1 else None
            pos = quiet
            continue
        cycle = pos + stall
        done = ofmap.write(written.through(pos) - before, cycle)
        total = max(total, done)
        last_out = done if pos == lines - 1 else None
        stall += max(0, done - cycle)
        pos += 1
    return stall, total, last_out


def read_once_memory(df: str, m: int, n: int, k: int, rows: int, cols: int, arch: ArchSpec
                     ) -> SystolicMemoryTimeline | None:
    """`systolic_memory.systolic_memory` of a GEMM whose read SRAMs never refetch (see the
    module docstring), None for any other: the ofmap SRAM's service in `_service_writes`."""
    bw = link_words_per_cycle(arch)
    sizes = sram_words(arch)
    if not (_never_refetches(m * k, sizes[0]) and _never_refetches(k * n, sizes[1])):
        return None
    written = _Written(df, m, n, k, rows, cols)
    ofmap = WriteBuffer(sizes[2], bw)
    stall, total, last_out = _service_writes(written, ofmap)
    lines = written.lines
    last_out = lines - 1 + stall if last_out is None else last_out
    total = max(total, last_out)
    ofmap.drain_all(last_out)
    fills = [min(math.ceil(int(math.ceil(w * ACTIVE_BUF_FRAC)) / bw), math.ceil(f / bw))
             for w, f in zip(sizes[:2], fetch_sizes(df, m, n, k, rows, cols))]
    first = max(fills)
    stop = ofmap.dram_stop if ofmap.dram_stop is not None else total
    return SystolicMemoryTimeline(
        total_cycles=total, total_cycles_incl_prefetch=stop + first, stall_cycles=stall,
        prefetch_cycles=first, link_words_per_cycle=bw, dram_words_read=sum(fills) * bw,
        dram_words_written=written.total, sram_words=sizes)


def fold_cycles(df: str, rows: int, cols: int, t: int) -> int:
    """Cycles of one fold (`systolic.fold_cycles`)."""
    return (0 if df == "os" else rows) + (rows - 1) + (cols - 1) + t


def closed_form_cycles(df: str, m: int, n: int, k: int, rows: int, cols: int) -> int:
    """SCALE-Sim-convention compute cycles (`systolic.closed_form_cycles`)."""
    sr, sc, t = _dims(df, m, n, k)
    return -(-sr // rows) * -(-sc // cols) * fold_cycles(df, rows, cols, t) - 1


def sram_accesses(df: str, m: int, n: int, k: int, rows: int, cols: int
                  ) -> tuple[list[int], list[int]]:
    """`systolic._sram_accesses` summed over the folds: (ifmap, filter, -) word reads and
    (-, -, ofmap) word writes. A fold reads its stationary tile once and its streamed operand
    T times a row (os: both operands, T times each row and column)."""
    sr, sc, t = _dims(df, m, n, k)
    fr, fc = -(-sr // rows), -(-sc // cols)
    if df == "os":
        return [fc * sr * t, fr * t * sc, 0], [0, 0, sr * sc]
    stationary, streamed = sr * sc, fc * t * sr
    reads = [streamed, stationary, 0] if df == "ws" else [stationary, streamed, 0]
    return reads, [0, 0, fr * t * sc]


class Counts(tuple):
    """Per-line counts as a tuple, with what `SimResult` asks of its numpy arrays (`sum`,
    `tolist`, `size`): the fast path's `spm_*_per_line`."""

    __slots__ = ()

    @property
    def size(self) -> int:
        return len(self)

    def sum(self) -> int:
        return sum(self, 0)

    def tolist(self) -> list:
        return list(self)


class BusyGrid:
    """`systolic._busy` without the array: PE (r, c) is busy T cycles in each fold that covers
    it, i.e. T x (row folds covering r) x (column folds covering c). `SimResult` asks it for
    `size` and `sum()`; `tolist()` gives the R x C grid."""

    def __init__(self, t: int, row_cover: list[int], col_cover: list[int]):
        self.t, self.row_cover, self.col_cover = t, row_cover, col_cover

    @property
    def size(self) -> int:
        return len(self.row_cover) * len(self.col_cover)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.row_cover), len(self.col_cover)

    def sum(self) -> int:
        return self.t * sum(self.row_cover) * sum(self.col_cover)

    def tolist(self) -> list[list[int]]:
        return [[self.t * r * c for c in self.col_cover] for r in self.row_cover]


def _cover(extent: int, size: int) -> list[int]:
    """How many folds of `size` over `extent` cover each of the `size` positions."""
    full, last = divmod(extent, size)
    return [full + (i < last) for i in range(size)]


def timing_only_result(spec: ArchSpec, m: int, n: int, k: int, dataflow: str | None,
                       engine: str = "fast", workload: str = "gemm", t0: float | None = None):
    """The `SimResult` of `simulate("gemm", spec, m=, n=, k=, dataflow=, timing_only=True)`
    computed in closed form without numpy, or None where the full path must run (see the
    module docstring). `t0`: the run's start for `wall_seconds`."""
    t0 = time.perf_counter() if t0 is None else t0
    df = dataflow or "os"
    if (spec.pe_array.kind != PEKind.SYSTOLIC or df not in DATAFLOWS or engine not in
            ("fast", "reference") or min(m, n, k) <= 0):
        return None
    sr, sc, _ = _dims(df, m, n, k)
    if -(-sr // spec.pe_array.rows) * -(-sc // spec.pe_array.cols) > MAX_FOLDS:
        return None
    try:
        mem = read_once_memory(df, m, n, k, spec.pe_array.rows, spec.pe_array.cols, spec)
    except UserError:  # the full path raises it
        return None
    if mem is None:
        return None
    rows, cols = spec.pe_array.rows, spec.pe_array.cols
    t = _dims(df, m, n, k)[2]
    per_fold = fold_cycles(df, rows, cols, t)
    wb = spec.word_bytes
    macs = m * n * k
    reads, writes = sram_accesses(df, m, n, k, rows, cols)
    lines = spec.spm.lines
    reads, writes = Counts(reads[:lines]), Counts(writes[:lines])
    tiles = []  # `systolic._tiles`: column folds outer
    for c0 in range(0, sc, cols):
        cc = min(cols, sc - c0)
        for r0 in range(0, sr, rows):
            rr = min(rows, sr - r0)
            rd, wr = (rr * t + t * cc, rr * cc) if df == "os" else (rr * cc + t * rr, t * cc)
            tiles.append(TileResult("gemm", len(tiles), rr * cc, per_fold, 0, rd * wb, wr * wb))
    compute = len(tiles) * per_fold
    spans = tuple(("gemm", i, i * per_fold, (i + 1) * per_fold) for i in range(len(tiles)))
    span = mem.total_cycles + 1  # `systolic_memory.run_systolic_system`
    rd, wr = mem.dram_words_read * wb, mem.dram_words_written * wb
    # the kernel's `ArrayResult` as `systolic.run_systolic_fast` gives it (no outputs), for
    # the energy model; its per-PE and per-line counts are the light ones above
    counts = {"pe_busy_cycles": BusyGrid(t, _cover(sr, rows), _cover(sc, cols)),
              "spm_reads_per_line": reads, "spm_writes_per_line": writes,
              "spm_conflicts_per_line": Counts((0,) * lines)}
    array = ArrayResult(kernel="gemm", tiles=tuple(tiles), op_counts=(("mac", macs),),
                        link_word_hops=0, macs=macs, outputs=(), **counts)
    energy = energy_breakdown([array], spec, rd + wr, 1)
    operands = m * k + k * n  # read once (`roofline.program_roofline`; no DMA transfers kept)
    kernel = KernelResult(kernel="gemm", start_cycle=0, end_cycle=span, compute_cycles=compute,
                          ii=1, mii=1, copies=1, tiles=array.tiles,
                          roofline=floors(spec, macs, operands, 0))
    return assemble_result(
        spec, workload=workload, engine=engine, counts=counts, energy_pj=energy,
        cycles=span - 1, compute_cycles=compute - 1, stall_cycles_spm_conflict=0,
        stall_cycles_dram=mem.stall_cycles, stall_cycles_reconfiguration=0,
        stall_cycles_dependency=0, macs=macs, dram_bytes_read=rd, dram_bytes_written=wr,
        kernels=(kernel,), output=None, tile_spans=spans,
        roofline=floors(spec, macs, operands, m * n), notes=memory_notes((mem,)),
        values_computed=False, values_match_reference=None, max_abs_error=None,
        mapping_summary=f"gemm: systolic {df} on {rows}x{cols}, GEMM M={m} N={n} K={k}",
        wall_seconds=time.perf_counter() - t0)
