"""Facts about a mapped kernel that both engines read the same way (no timing logic here)."""

from __future__ import annotations

import numpy as np

from dataflow.dfg.graph import Kernel
from dataflow.mapper.mapping import KernelMapping, Tile


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


def vector_nodes(kernel: Kernel) -> frozenset[int]:
    """Nodes whose value is a SIMD vector: memory nodes addressed by the vector variable, and
    anything computed from a vector except a lane sum (vsum), whose value is a scalar."""
    vec: set[int] = set()
    if kernel.vector_var is None:
        return frozenset()
    for n in kernel.nodes:
        if n.addr is not None and n.addr.coef(kernel.vector_var) or n.op.value not in ("load", "gather", "vsum") and any(i in vec for i in n.inputs):
            vec.add(n.id)
    return frozenset(vec)


def lane_addresses(base, coef_vec: int, lanes: int):
    """Element addresses of a vector access: base + lane * coef (base may be an array)."""
    return np.asarray(base)[..., None] + coef_vec * np.arange(lanes)


def tile_result(kernel, index, iterations, compute_cycles, stall, km: KernelMapping, arch, tile: Tile):
    """DMA traffic of a tile: streamed windows each tile, resident buffers once (inputs read
    before the first tile, outputs written after the last)."""
    from dataflow.pe_array.result import TileResult

    wb = arch.word_bytes
    rd = wr = 0
    transfers = []
    last = index == len(km.tiles) - 1
    for b in kernel.buffers:
        alloc = km.allocation_map[b.name]
        if alloc.streamed:
            lo, hi = tile.window_map[b.name]
            words = max(0, hi - lo)
        else:
            words = b.size if (index == 0 and b.role == "input") or (last and b.role == "output") else 0
        if b.role == "input":
            rd += words * wb
        elif b.role == "output":
            wr += words * wb
        if words and b.role in ("input", "output"):
            transfers.append((b.name, "read" if b.role == "input" else "write", words * wb))
    return TileResult(kernel=kernel.name, index=index, iterations=iterations,
                      compute_cycles=compute_cycles, stall_cycles_spm_conflict=stall,
                      dram_bytes_read=rd, dram_bytes_written=wr, dram_transfers=tuple(transfers))


class Counters:
    """The per-kernel tallies both engines keep (they differ only in how they fill them)."""

    def __init__(self, arch):
        from dataflow.dfg.ops import Op

        lines = arch.spm.lines
        self.busy = np.zeros((arch.pe_array.rows, arch.pe_array.cols), dtype=np.int64)
        self.reads_line = np.zeros(lines, dtype=np.int64)
        self.writes_line = np.zeros(lines, dtype=np.int64)
        self.conflicts_line = np.zeros(lines, dtype=np.int64)
        self.op_counts = {op.value: 0 for op in Op}
        self.link_word_hops = 0
        self.tiles: list = []

    def result(self, kernel: Kernel, bufs: dict[str, np.ndarray], trace=None):
        from dataflow.pe_array.result import ArrayResult

        ops = self.op_counts
        outputs = tuple((b.name, bufs[b.name]) for b in kernel.buffers if b.role == "output")
        return ArrayResult(kernel=kernel.name, tiles=tuple(self.tiles), pe_busy_cycles=self.busy,
                           spm_reads_per_line=self.reads_line, spm_writes_per_line=self.writes_line,
                           spm_conflicts_per_line=self.conflicts_line,
                           op_counts=tuple(sorted((k, v) for k, v in ops.items() if v)),
                           link_word_hops=self.link_word_hops, macs=ops["mul"] + ops["mac"],
                           outputs=outputs, trace=trace)
