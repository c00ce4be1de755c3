"""Facts about a mapped kernel that both engines read the same way (no timing logic here)."""

from __future__ import annotations

import numpy as np

from dataflow.dfg.domain import enumerate_domain
from dataflow.dfg.graph import BufferFetch, BufferRole, Kernel
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import KernelMapping, Tile
from dataflow.pe_array.result import ArrayResult, TileResult


def spm_base(km: KernelMapping, buffer: str, tile_index: int, tile: Tile) -> tuple[int, int]:
    """(SPM word of the buffer's first touched word, that word's buffer address) for a tile.

    Streamed buffers alternate between the two halves of their double buffer."""
    alloc = km.allocation_map[buffer]
    if not alloc.streamed:
        return alloc.base, 0
    base = alloc.base if tile_index % 2 == 0 else alloc.base_alt
    return base, tile.window_map[buffer][0]


def buffer_arrays(kernel: Kernel, inputs: dict[str, np.ndarray], dtype) -> dict[str, np.ndarray]:
    """Working copies of every buffer: inputs as given, outputs and temps filled with their
    `init` value (zero unless the kernel says otherwise)."""
    out = {}
    for b in kernel.buffers:
        if b.name in inputs:
            out[b.name] = inputs[b.name]
        else:
            out[b.name] = np.full(b.size, b.init, dtype=dtype)
    return out


def lane_addresses(base, coef_vec: int, lanes: int):
    """Element addresses of a vector access: base + lane * coef (base may be an array)."""
    return np.asarray(base)[..., None] + coef_vec * np.arange(lanes)


def gather_fetch_words(kernel: Kernel, inputs: dict[str, np.ndarray], arch) -> dict[str, int]:
    """Words an indirect (gather) DMA brings in for each `fetch="gather"` buffer: the distinct
    SPM rows (bursts of `words_per_row` words, 32 B on the default arch) that the kernel's
    gathers touch over its whole domain, times the row size. Computed from the index data
    itself (the gathers' index loads read input buffers, never written in the kernel), so both
    engines see the same figure. PIT's SRead fetches only the nonzero micro-tiles from memory
    (docs/references.md#pit); a tile narrower than a burst still moves whole bursts (a 32 x 1 tile
    costs 32 bursts), our stated assumption about the DMA's granularity."""

    out: dict[str, int] = {}
    wpr = arch.spm.words_per_row
    lanes = arch.pe_array.simd_lanes if kernel.vector_var else 1
    dom = None
    for b in kernel.buffers:
        if b.fetch != BufferFetch.GATHER:
            continue
        if dom is None:
            dom = enumerate_domain(kernel, lanes)
        n = len(dom[kernel.loops[0].var])
        rows = []
        for node in kernel.nodes:
            if node.buffer != b.name:
                continue
            idx = kernel.nodes[node.inputs[0]]
            ia = np.full(n, idx.addr.const, dtype=np.int64)
            for v, c in idx.addr.terms:
                ia = ia + c * dom[v]
            a = np.full(n, node.addr.const, dtype=np.int64)
            for v, c in node.addr.terms:
                a = a + c * dom[v]
            ia = ia + (node.lane or 0)  # a lane of a row load: its word l
            a = a + node.addr.index_stride * np.asarray(inputs[idx.buffer])[ia].astype(np.int64)
            cv = node.addr.coef(kernel.vector_var) if kernel.vector_var else 0
            if cv:
                act = np.minimum(lanes, kernel.vector_extent - dom[kernel.vector_var])
                first, last = a, a + (act - 1) * cv
                lo, hi = np.minimum(first, last) // wpr, np.maximum(first, last) // wpr
                # a vector access spans the rows lo..hi (contiguous when |cv| == 1)
                span = int((hi - lo).max()) + 1 if n else 1
                for s in range(span):
                    rows.append((lo + s)[lo + s <= hi])
            else:
                rows.append(a // wpr)
        touched = np.unique(np.concatenate(rows)) if rows else np.zeros(0, np.int64)
        out[b.name] = min(b.size, len(touched) * wpr)
    return out


def dma_words(km: KernelMapping, b, index: int) -> int:
    """Words of buffer `b` the DMA moves for tile `index`: a streamed buffer's window every
    tile; a resident input before the first tile and a resident output after the last; none
    for one handed over in the SPM (docs/conventions.md#moe-buffers-handed-over-in-the-spm)."""
    if b.on_chip:
        return 0
    if km.allocation_map[b.name].streamed:
        lo, hi = km.tiles[index].window_map[b.name]
        return b.dma_words(lo, hi)
    first, last = index == 0, index == len(km.tiles) - 1
    once = (first and b.role == BufferRole.INPUT) or (last and b.role == BufferRole.OUTPUT)
    return b.dma_words(0, b.size) if once else 0


def tile_result(kernel, index, iterations, compute_cycles, stall, km: KernelMapping, arch,
                tile: Tile, fetched: dict[str, int] | None = None):
    """DMA traffic of a tile: streamed windows each tile, resident buffers once (inputs read
    before the first tile, outputs written after the last); a `fetch="gather"` input moves
    only `fetched[name]` words (`gather_fetch_words`)."""

    wb = arch.word_bytes
    rd = wr = 0
    transfers = []
    for b in kernel.buffers:
        words = dma_words(km, b, index)
        if words and not km.allocation_map[b.name].streamed and b.fetch == BufferFetch.GATHER \
                and fetched is not None:
            words = fetched[b.name]
        if b.role == BufferRole.INPUT:
            rd += words * wb
        elif b.role == BufferRole.OUTPUT:
            wr += words * wb
        if words and b.role in (BufferRole.INPUT, BufferRole.OUTPUT):
            transfers.append((b.name, "read" if b.role == BufferRole.INPUT else "write",
                              words * wb))
    return TileResult(kernel=kernel.name, index=index, iterations=iterations,
                      compute_cycles=compute_cycles, stall_cycles_spm_conflict=stall,
                      dram_bytes_read=rd, dram_bytes_written=wr, dram_transfers=tuple(transfers))


class Counters:
    """The per-kernel tallies both engines keep (they differ only in how they fill them)."""

    def __init__(self, arch):
        lines = arch.spm.lines
        self.busy = np.zeros((arch.pe_array.rows, arch.pe_array.cols), dtype=np.int64)
        self.reads_line = np.zeros(lines, dtype=np.int64)
        self.writes_line = np.zeros(lines, dtype=np.int64)
        self.conflicts_line = np.zeros(lines, dtype=np.int64)
        self.op_counts = {op.value: 0 for op in Op}
        self.link_word_hops = 0
        self.tiles: list = []

    def result(self, kernel: Kernel, bufs: dict[str, np.ndarray], trace=None):
        ops = self.op_counts
        outputs = tuple((b.name, bufs[b.name]) for b in kernel.buffers
                        if b.role == BufferRole.OUTPUT)
        return ArrayResult(kernel=kernel.name, tiles=tuple(self.tiles), pe_busy_cycles=self.busy,
                           spm_reads_per_line=self.reads_line, spm_writes_per_line=self.writes_line,
                           spm_conflicts_per_line=self.conflicts_line,
                           op_counts=tuple(sorted((k, v) for k, v in ops.items() if v)),
                           link_word_hops=self.link_word_hops,
                           macs=sum(v for k, v in ops.items() if Op(k).multiplies),
                           outputs=outputs, trace=trace)
