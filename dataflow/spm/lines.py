"""How SPM word addresses map to rows and lines (the multi-line scratchpad's address policy)."""

from __future__ import annotations

import numpy as np

from dataflow.arch.spec import SPMSpec


def line_of_row(row: np.ndarray | int, spm: SPMSpec):
    """Line holding SPM row `row`.

    `interleaved`: consecutive rows on consecutive lines (row mod lines), so streams spread over
    all lines. `blocked`: each line holds one contiguous range of capacity_words_per_line words.
    `xor`: interleaved, with the line index XOR-folded with the higher row bits (lines a power
    of two), the bank hashing of GPU shared memory and multi-bank SPMs, so streams whose rows
    are a multiple of `lines` apart still land on different lines.
    """
    if spm.address_mapping == "interleaved":
        return row % spm.lines
    if spm.address_mapping == "xor":
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
