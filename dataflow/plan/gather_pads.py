"""Row pitches for gathered operands (docs/conventions.md#gather-lines): a buffer whose rows a
line-ordered kernel gathers, with rows that start on fewer than all SPM lines, is stored at a
pitch of cols + pad words so that a row may start on any line (`gather_pads`, `apply_pads`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dataflow.arch.spec import AddressMapping, ArchSpec
from dataflow.dfg.graph import BufferFetch, Kernel, Program
from dataflow.dfg.ops import Op
from dataflow.plan.gather_lines import orderable, shared_order


def pad_gathered_rows(program: Program, buffer: str, pad: int) -> Program:
    """Input `buffer`, gathered by rows of `cols` words (every access to it a gather of index
    stride cols, within the row), stored with a row pitch of cols + pad words (pad words zero,
    left on chip: the DMA moves the cols words of each row, `Buffer.pitch`). On interleaved
    lines a row of cols = 8 SPM rows starts on one of two lines; at a pitch of 9 SPM rows on
    any of 16, which gives `line_order` room (docs/conventions.md#gather-lines)."""
    if pad <= 0:
        return program
    data = program.input_map[buffer]
    strides = {n.addr.index_stride for k in program.kernels for n in k.nodes
               if n.buffer == buffer}
    if len(strides) != 1 or not (cols := strides.pop()) or data.size % cols:
        raise ValueError(f"pad_gathered_rows({buffer!r}): not a buffer of gathered rows")

    def rewrite(n):
        if n.buffer != buffer:
            return n
        return dataclasses.replace(n, addr=dataclasses.replace(n.addr, index_stride=cols + pad))

    rows = data.size // cols
    padded = np.zeros((rows, cols + pad), dtype=data.dtype)
    padded[:, :cols] = data.reshape(rows, cols)
    size = rows * (cols + pad)
    kernels = tuple(dataclasses.replace(
        k, nodes=tuple(rewrite(n) for n in k.nodes),
        buffers=tuple(dataclasses.replace(b, size=size, pitch=(cols, cols + pad))
                      if b.name == buffer else b for b in k.buffers)) for k in program.kernels)
    inputs = tuple((name, padded.ravel() if name == buffer else x) for name, x in program.inputs)
    return dataclasses.replace(program, kernels=kernels, inputs=inputs)


def gather_pads(program: Program, arch: ArchSpec) -> tuple[tuple[str, int], ...]:
    """(buffer, pad words) for each input whose rows an orderable kernel gathers, when its
    rows of cols words start on fewer than all lines: a pitch of cols + pad words, pad the
    fewest whole SPM rows that make the pitch's rows prime to the line count, lets a row
    start on any line (interleaved lines only; docs/conventions.md#gather-lines)."""
    spm = arch.spm
    if spm.address_mapping != AddressMapping.INTERLEAVED:
        return ()
    shared = shared_order(program)
    ordered = set(shared[2]) if shared else set()
    out = []
    for name, data in program.inputs:
        nodes = [(k, n) for k in program.kernels for n in k.nodes if n.buffer == name]
        strides = {n.addr.index_stride for _, n in nodes}
        if not nodes or len(strides) != 1 or any(n.op is not Op.GATHER for _, n in nodes):
            continue
        cols = strides.pop()
        if cols % spm.words_per_row or data.size % cols \
                or any(b.fetch != BufferFetch.WHOLE for k, _ in nodes for b in k.buffers
                       if b.name == name):
            continue
        if not all(_within_row(k, n.addr, cols)
                   and (k.name in ordered or orderable(k, program) is not None)
                   for k, n in nodes):
            continue
        rows = cols // spm.words_per_row
        pad = next(p for p in range(spm.lines) if math.gcd(rows + p, spm.lines) == 1)
        if pad:
            out.append((name, pad * spm.words_per_row))
    return tuple(out)


def _within_row(kernel: Kernel, addr, cols: int) -> bool:
    """Whether a gather's words stay within the row of cols words its index picks: its terms
    are dense loops' variables with nonnegative coefficients, whose largest values and the
    constant stay below cols."""
    top = addr.const
    extents = {lp.var: lp.extent for lp in kernel.loops if lp.is_dense}
    for v, c in addr.terms:
        if v not in extents or c < 0:
            return False
        top += c * (extents[v] - 1)
    return addr.const >= 0 and top + max(addr.span - 1, 0) < cols


def apply_pads(program: Program, pads: tuple[tuple[str, int], ...]) -> Program:
    for name, pad in pads:
        program = pad_gathered_rows(program, name, pad)
    return program
