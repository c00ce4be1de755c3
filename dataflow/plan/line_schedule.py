"""Line-aware copy delays for a modulo schedule: a reservation table over (cycle, SPM line,
port) built from the accesses whose lines are known before any data is
(docs/conventions.md#sparse-line-model).

An access is *static* when its address is affine in the loop variables (dense loads and stores,
row loads of packed panels, the loads of a CSR operand's values and indices): its SPM row in
every iteration of a tile follows from the loop domain and the buffer's allocation, so the line
it lands on in each cycle of the modulo schedule is known when the schedule is made. A gather
(`B[crd[p]]`) is *data-dependent*: its line is a value. The table counts, per (cycle, line),
the row reads and writes of the static accesses exactly as the engine does (reads of one row in
one cycle are one access; `spm/lines.py:port_cycles`), for a sample of the first tile's waves.

`line_aware_delays` then chooses, copy by copy, a delay of 0 .. lines - 1 whole IIs, or a
multiple of words_per_row up to lines times that (a scalar stream moves one row in
words_per_row waves), (a delay
keeps every modulo reservation -- issue slots, units, links -- where the mapper put it, so the
schedule stays legal) that minimises, lexicographically:

1. the stall cycles the static accesses alone would cause (a line asked for more rows in one
   cycle than it has ports), so these are avoided by construction where any delay avoids them;
2. the (cycle, line)s left with no free read port, where a data-dependent gather would stall:
   the gather policy -- spare ports are spread over the lines and cycles, so a gather finds
   one on whichever line its index picks;
3. the delay itself (no move when nothing gains).
"""

from __future__ import annotations

import numpy as np

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.domain import enumerate_domain
from dataflow.dfg.graph import vector_nodes
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import KernelMapping
from dataflow.pe_array.common import spm_base
from dataflow.spm.lines import line_of_row

#: waves of the first tile the table is built over (the pattern of a modulo schedule repeats;
#: a sample keeps planning fast on long tiles)
SAMPLE_WAVES = 512

LINE_NOTE = "copies delayed by the line-aware reservation table"


def static_nodes(km: KernelMapping) -> list:
    """Nodes whose SPM rows follow from the loop domain: affine loads and stores (an
    accumulation touches the SPM at its flushes only, a gather through a loaded index)."""
    return [n for n in km.kernel.nodes
            if n.op in (Op.LOAD, Op.STORE) and not n.addr.index_stride]


class LineTable:
    """Row accesses of the static nodes of `km`'s first tile, per copy: (wave, node issue
    time, line, is_write) for every distinct row an access touches, over the first
    `SAMPLE_WAVES` waves."""

    def __init__(self, km: KernelMapping, arch: ArchSpec):
        self.km, self.arch = km, arch
        spm = arch.spm
        kernel = km.kernel
        lanes = arch.pe_array.simd_lanes if kernel.vector_var else 1
        tile = km.tiles[0]
        dom = enumerate_domain(kernel, lanes, (tile.lo, tile.hi))
        n = len(dom[kernel.loops[0].var])
        self.waves = -(-n // km.copies) if n else 0
        self.sample = min(self.waves, SAMPLE_WAVES)
        k = np.arange(n, dtype=np.int64)
        copy, wave = (k // self.waves, k % self.waves) if n else (k, k)
        keep = wave < self.sample
        times = {(p.copy, p.node): p.time for p in km.placements}
        vec = vector_nodes(kernel)
        self.per_copy: list[list[tuple]] = [[] for _ in range(km.copies)]
        for node in static_nodes(km):
            base, first = spm_base(km, node.buffer, 0, tile)
            a = np.full(n, node.addr.const, dtype=np.int64)
            for v, c in node.addr.terms:
                if v != kernel.vector_var or node.addr.span:
                    a = a + c * dom[v]
            if node.id in vec:
                width = node.addr.span or lanes
                cv = 1 if node.addr.span else node.addr.coef(kernel.vector_var)
                if not node.addr.span:
                    a = a + dom[kernel.vector_var] * cv
                words = a[:, None] + cv * np.arange(width)[None, :]
            else:
                words = a[:, None]
            rows = (words - first + base) // spm.words_per_row
            write = node.op.writes_spm
            for c in range(km.copies):
                sel = keep & (copy == c)
                r = rows[sel]
                w = np.repeat(wave[sel], r.shape[1])
                r = r.ravel()
                if len(r):  # one access per distinct row of the access
                    w, r = np.unique(np.stack([w, r]), axis=1)
                self.per_copy[c].append((w, times[(c, node.id)], line_of_row(r, spm), r,
                                         write))

    def counts(self, delays: list[int], upto: int) -> tuple[np.ndarray, np.ndarray]:
        """(reads, writes) per (cycle, line) of copies 0 .. upto - 1 delayed by `delays`
        IIs; reads of one row in one cycle counted once."""
        ii, spm = self.km.ii, self.arch.spm
        lines = spm.lines
        horizon = (self.sample + max(delays[:upto], default=0) + 1) * ii \
            + self.km.schedule_length
        rc, rr, wk = [], [], []
        for c in range(upto):
            for w, t, line, row, write in self.per_copy[c]:
                cyc = (w + delays[c]) * ii + t
                if write:
                    wk.append(cyc * lines + line)
                else:
                    rc.append(cyc)
                    rr.append(row)
        size = horizon * lines
        reads = np.zeros(size, dtype=np.int64)
        if rc:
            cyc, row = np.concatenate(rc), np.concatenate(rr)
            span = int(row.max()) + 1
            keys = np.sort(cyc * span + row)  # reads of one row in one cycle: one access
            keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
            reads = np.bincount((keys // span) * lines + line_of_row(keys % span, spm),
                                minlength=size)
        writes = (np.bincount(np.concatenate(wk), minlength=size) if wk
                  else np.zeros(size, dtype=np.int64))
        return reads.reshape(horizon, lines), writes.reshape(horizon, lines)

    def score(self, delays: list[int], upto: int) -> tuple[int, int]:
        """(stall cycles of the static accesses, (cycle, line)s with no free read port)."""
        spm = self.arch.spm
        reads, writes = self.counts(delays, upto)
        need = np.maximum(-(-reads // spm.read_ports_per_line),
                          -(-writes // spm.write_ports_per_line))
        stall = int(np.maximum(need.max(axis=1) - 1, 0).sum())
        full = int((reads >= spm.read_ports_per_line).sum())
        return stall, full


def line_aware_delays(km: KernelMapping, arch: ArchSpec) -> list[int] | None:
    """Per copy, the delay in IIs the reservation table chooses (see the module docstring);
    None when the kernel has no static access or one copy."""
    if km.copies < 2 or not static_nodes(km) or not km.tiles:
        return None
    table = LineTable(km, arch)
    if not table.sample:
        return None
    # a delay of d waves moves a stream of one row a wave d lines, a scalar stream (a word a
    # wave) d / words_per_row lines: both kinds of shift, each over all the lines
    lines, wpr = arch.spm.lines, arch.spm.words_per_row
    options = sorted(set(range(lines)) | {wpr * j for j in range(lines)})
    delays = [0] * km.copies
    for c in range(1, km.copies):
        best = None
        for d in options:
            delays[c] = d
            key = (*table.score(delays, c + 1), d)
            if best is None or key < best:
                best = key
        delays[c] = best[-1]
    return delays


def table_stalls(km: KernelMapping, arch: ArchSpec) -> int:
    """Stall cycles the static accesses of `km` (as scheduled) cause on the table's sample."""
    if not static_nodes(km) or not km.tiles:
        return 0
    table = LineTable(km, arch)
    return table.score([0] * km.copies, km.copies)[0] if table.sample else 0
