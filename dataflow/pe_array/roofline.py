"""The roofline bound of a run and of each kernel
(docs/conventions.md#roofline-and-compulsory-bytes).

A run cannot finish in fewer cycles than the largest of three floors:

- compute: useful MACs / the array's peak MACs per cycle (PEs x SIMD lanes);
- DRAM: compulsory bytes / the DRAM's bytes per cycle, where compulsory means every operand read
  once and every result written once -- intermediates handed from kernel to kernel are left out,
  since a better compiler could keep them on chip;
- SPM ports: the compulsory words read (and written) by the array, a row at a time, over all
  lines' read (write) ports in one cycle.

`fraction_of_roofline` = bound / cycles (1.0 is the bound itself). The run's bound counts the
program's useful MACs (`Program.macs`, no padding). A kernel's bound counts the MACs that kernel
issues (the engine's count: the program says which MACs are useful only as a whole) and its own
inputs, each once, against the kernel's span on the system timeline; its write-backs are left
out, since they drain behind the next kernel. An operand the kernels read only in part (an
indirect DMA of the rows a gather touches, PIT's SRead) counts with the bytes the DMA moved for
it, so the bound never claims bytes the lowering does not need.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dataflow.arch.spec import ArchSpec, PEKind
from dataflow.pe_array.result import ArrayResult, Roofline

if TYPE_CHECKING:
    from dataflow.dfg.graph import Program

# dataflow.dfg.graph (numpy) is imported in the functions that read a program's buffers, so
# `floors` is numpy-free for the timing path (dataflow/pe_array/systolic_timing.py)


def floors(arch: ArchSpec, macs: int, words_read: int, words_written: int) -> Roofline:
    """The floors of `macs` useful MACs moving `words_read` in and `words_written` out once."""
    pe = arch.pe_array
    compute = macs / (pe.num_pes * pe.simd_lanes)
    dram = (words_read + words_written) * arch.word_bytes / arch.dram.bytes_per_cycle
    spm = 0.0
    if pe.kind != PEKind.SYSTOLIC:  # a systolic array's operand SRAMs have no line ports
        s = arch.spm
        rows_in, rows_out = (math.ceil(w / s.words_per_row) for w in (words_read, words_written))
        spm = max(rows_in / (s.lines * s.read_ports_per_line),
                  rows_out / (s.lines * s.write_ports_per_line))
    return Roofline(compute, dram, spm)


def _moved_words(arrays: list[ArrayResult], word_bytes: int) -> dict[str, list[int]]:
    """Words the DMA moved per buffer, one entry per kernel that moved it."""
    moved: dict[str, list[int]] = {}
    for a in arrays:
        per: dict[str, int] = {}
        for t in a.tiles:
            for name, _, nbytes in t.dram_transfers:
                per[name] = per.get(name, 0) + nbytes // word_bytes
        for name, words in per.items():
            moved.setdefault(name, []).append(words)
    return moved


def _compulsory(size: int, moved: list[int] | None, gathered: bool = False) -> int:
    """Once the whole operand, or what the DMA needed of it where that is less (nothing, for
    a gathered operand no DMA moved: its gathers selected no row)."""
    if not moved:
        return 0 if gathered else size
    return min(size, max(moved))


def _gathered(program: Program, name: str) -> bool:
    """Whether every kernel that reads buffer `name` fetches it by an indirect DMA."""
    from dataflow.dfg.graph import BufferFetch, BufferRole

    reads = [b for k in program.kernels for b in k.buffers
             if b.name == name and b.role == BufferRole.INPUT]
    return bool(reads) and all(b.fetch == BufferFetch.GATHER for b in reads)


def _program_compulsory(size: int, name: str, moved: dict[str, list[int]],
                        gathered: bool = False) -> int:
    """A program operand's compulsory words: as `_compulsory`; one the DMA never moved while
    it moved others (an imaginary part a real transform makes on chip) costs none -- a floor
    must not claim bytes the run does not need. Without any per-buffer record, the size."""
    if moved and name not in moved:
        return 0
    return _compulsory(size, moved.get(name), gathered)


def program_roofline(program: Program, arch: ArchSpec, arrays: list[ArrayResult],
                     dram_bytes: tuple[int, int] | None = None) -> Roofline:
    """The run's floors: the program's useful MACs, its inputs read once, its outputs written
    once (see the module docstring). `dram_bytes` = (read, written) by a DMA that is not the
    kernels' own (a butterfly residency loads for all its kernels at once): the compulsory
    words are capped at what it moved, so the floor never claims bytes the lowering does not
    need (a real transform's zero imaginary part, made on chip)."""
    moved = _moved_words(arrays, arch.word_bytes)
    useful = dict(program.useful_words)  # a padded input counts its unpadded words
    read = sum(_program_compulsory(useful.get(name, int(x.size)), name, moved,
                                   _gathered(program, name))
               for name, x in program.inputs)
    written = sum(_program_compulsory(math.prod(shape), name, moved)
                  for name, shape in program.outputs)
    if dram_bytes is not None:
        read = min(read, dram_bytes[0] // arch.word_bytes)
        written = min(written, dram_bytes[1] // arch.word_bytes)
    return floors(arch, program.macs, read, written)


def kernel_roofline(program: Program, arch: ArchSpec, index: int, array: ArrayResult,
                    own_dma: bool = True) -> Roofline:
    """One kernel's floors: the MACs it issues, each of its inputs once (see the docstring).
    `own_dma=False` for kernels co-resident on the array (butterfly residencies): their loads
    are the residency's, issued before some of them start, so only the run's DRAM floor holds
    and the kernel keeps its compute and SPM floors."""
    from dataflow.dfg.graph import BufferFetch, BufferRole

    kernel = program.kernels[index]
    moved = _moved_words([array], arch.word_bytes)
    # an input handed over in the SPM crosses no DRAM interface: not compulsory
    # (docs/conventions.md#moe-buffers-handed-over-in-the-spm)
    read = sum(_compulsory(b.size, moved.get(b.name), b.fetch == BufferFetch.GATHER)
               for b in kernel.buffers if b.role == BufferRole.INPUT and not b.on_chip)
    r = floors(arch, array.macs, read, 0)
    return r if own_dma else Roofline(r.compute_cycles, 0.0, r.spm_port_cycles)
