"""How SPM word addresses map to rows and lines (the multi-line scratchpad's address policy)."""

from __future__ import annotations

import numpy as np

from dataflow.arch.spec import AddressMapping, SPMSpec


def line_of_row(row: np.ndarray | int, spm: SPMSpec):
    """Line holding SPM row `row`.

    `interleaved`: consecutive rows on consecutive lines (row mod lines), so streams spread over
    all lines. `blocked`: each line holds one contiguous range of capacity_words_per_line words.
    `xor`: interleaved, with the line index XOR-folded with the higher row bits (lines a power
    of two), the bank hashing of GPU shared memory and multi-bank SPMs, so streams whose rows
    are a multiple of `lines` apart still land on different lines.
    """
    if spm.address_mapping == AddressMapping.INTERLEAVED:
        return row % spm.lines
    if spm.address_mapping == AddressMapping.XOR:
        bits = spm.lines.bit_length() - 1
        line = row & (spm.lines - 1)
        rest = row >> bits
        for _ in range(64 // max(1, bits)):
            if not np.any(rest):
                break
            line = line ^ (rest & (spm.lines - 1))
            rest = rest >> bits
        return line
    return (row * spm.words_per_row) // spm.capacity_words_per_line


def port_cycles(reads: np.ndarray, writes: np.ndarray, spm: SPMSpec) -> np.ndarray:
    """Cycles a line needs to serve `reads` and `writes` row accesses issued in one cycle."""
    r = -(-reads // spm.read_ports_per_line)
    w = -(-writes // spm.write_ports_per_line)
    return np.maximum(np.maximum(r, w), 1)


class StoreQueues:
    """Per-line store queues of `spm.write_queue_depth` entries (timing only: loads see queued
    stores, i.e. store-to-load forwarding, so values are those of the in-order semantics).

    One array cycle: reads need ceil(reads / read ports) port-cycles on their line, so the
    cycle lasts c = max(1, those) cycles; each line retires up to c x write ports of its queued
    and new stores; stores left beyond the depth stall the whole (lock-step) array until the
    fullest line is back within its depth, all lines retiring meanwhile. With depth 0 this is
    exactly `port_cycles`' rule. At the end of a tile the queues drain (`drain`)."""

    def __init__(self, spm: SPMSpec):
        self.spm = spm
        self.q = np.zeros(spm.lines, dtype=np.int64)

    def cycle(self, reads: np.ndarray, writes: np.ndarray) -> tuple[int, np.ndarray]:
        """(stall cycles of this array cycle, extra cycles per line)."""
        R, W, D = (self.spm.read_ports_per_line, self.spm.write_ports_per_line,
                   self.spm.write_queue_depth)
        read_c = -(-reads // R)
        c = max(1, int(read_c.max()))
        self.q += writes
        self.q -= np.minimum(self.q, c * W)
        extra = -(-np.maximum(self.q - D, 0) // W)
        e = int(extra.max())
        if e:
            self.q -= np.minimum(self.q, e * W)
        return c - 1 + e, np.maximum(read_c - 1, 0) + extra

    def drain(self) -> tuple[int, np.ndarray]:
        """Cycles until every queued store is in its line (the tile ends when they are)."""
        per_line = -(-self.q // self.spm.write_ports_per_line)
        self.q[:] = 0
        return int(per_line.max()), per_line
