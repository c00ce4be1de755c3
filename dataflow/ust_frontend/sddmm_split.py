"""SDDMM of any size (docs/conventions.md#sddmm-of-any-size).

The SDDMM kernel (`dfg.lower_sddmm`) gathers rows of Bᵀ by the mask's columns, so Bᵀ (n x k
words) stays resident; A, the mask and C stream by rows. When Bᵀ does not fit (`--m 4096 --n
4096 --k 64` on the MLX preset: 262,144 words against 131,072), the mask's columns are cut
into blocks of `block` columns, each an SDDMM of its own over the block's Bᵀ rows and the
mask's entries in those columns (the same rows, the columns re-based), run back to back.

- **Sizes from the SPM.** A block's Bᵀ takes at most half the SPM and the rest holds 8
  streamed rows (A's row, the row's mask values, columns and results), double-buffered
  (`dataflow.plan.split.fits_spm`); the block is the widest that fits, then the columns are
  cut into equal blocks (a multiple of an SPM row).
- **Values.** Every entry is one block's dot product over all of k, in the kernel's order: no
  partial sums, so each block's results are its entries' results; they go back to the
  entries' positions in the whole mask and are checked against the numpy reference there.
- **Cost.** A is read once per block (every block streams all rows); Bᵀ, the mask and C once.
  The roofline is the whole problem's: nnz * k MACs, A, Bᵀ, the mask's values and columns
  read once, C written once.
- **Refused** only when a block of one SPM row of columns does not fit next to the streamed
  rows (a very large k, or a very long mask row): that would need K panels with partial
  sums, not built here.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dataflow.arch import ArchSpec
from dataflow.arch.spec import PEKind
from dataflow.dfg.lower_sddmm import lower_sddmm_csr
from dataflow.errors import UserError
from dataflow.pe_array.result import SimResult
from dataflow.pe_array.roofline import floors
from dataflow.pe_array.simulate import sequence_results, simulate_mapping
from dataflow.plan.compile import compile_program
from dataflow.plan.split import fits_spm, fits_unsplit, largest, piece, pieces, round_up


def _row_words(arch: ArchSpec, k: int, widest: int) -> int:
    """SPM words one streamed row takes: A's row and the row's mask values, columns and
    results, each window with the tiling's spare row."""
    row = arch.spm.words_per_row
    return round_up(k, row) + row + 3 * (round_up(widest, row) + row)


def plan_sddmm_split(arch: ArchSpec, k: int, n: int, pos: np.ndarray) -> int | None:
    """Columns per block of an SDDMM whose Bᵀ does not fit the SPM; None when it runs whole
    (or on a systolic array, which maps it as it is)."""
    if arch.pe_array.kind == PEKind.SYSTOLIC:
        return None
    lengths = np.diff(np.asarray(pos, dtype=np.int64))
    row_words = _row_words(arch, k, int(lengths.max()) if len(lengths) else 0)
    if fits_unsplit(arch, n * k, row_words):
        return None
    words_per_row = arch.spm.words_per_row
    block = largest(n, words_per_row, lambda w: fits_spm(arch, w * k, row_words))
    if block is None:
        src = f" ({arch.source})" if arch.source else ""
        raise UserError(
            f"sddmm does not fit the SPM{src} even in column blocks of {words_per_row}: a "
            f"block of Bᵀ ({words_per_row * k:,} words) and 8 streamed rows of {row_words:,} "
            f"words (k = {k}, the widest mask row), double-buffered, need more than its "
            f"{arch.spm.capacity_words:,} (K panels with partial sums are not built); use a "
            "smaller k or a larger spm.capacity_words_per_line")
    return piece(n, -(-n // block), words_per_row)


def run_sddmm_split(a: np.ndarray, b: np.ndarray, pos: np.ndarray, crd: np.ndarray,
                    val: np.ndarray, arch: ArchSpec, block: int, *, engine: str = "fast",
                    workload: str = "sddmm") -> tuple[np.ndarray, SimResult]:
    """(C's values at the mask's entries, the sequenced result) of the SDDMM run in column
    blocks of `block` (the module docstring)."""
    (m, k), n = a.shape, b.shape[1]
    pos, crd = np.asarray(pos, dtype=np.int64), np.asarray(crd, dtype=np.int64)
    val = np.asarray(val)
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(pos))
    out = np.zeros(len(crd), dtype=np.float32)
    parts: list[SimResult] = []
    summaries: list[str] = []
    count = 0
    for c0, c1 in pieces(n, block):
        count += 1
        sel = np.flatnonzero((crd >= c0) & (crd < c1))
        if len(sel) == 0:
            continue
        lpos = np.concatenate(([0], np.cumsum(np.bincount(rows[sel], minlength=m))))
        prog = lower_sddmm_csr(a, b[:, c0:c1], lpos, crd[sel] - c0, val[sel])
        mapping = compile_program(prog, arch)
        res = simulate_mapping(mapping, engine=engine, workload=workload)
        out[sel] = np.asarray(res.output).reshape(-1)
        summaries.append(mapping.summary())
        parts.append(dataclasses.replace(res, output=None))
    if not parts:
        raise UserError("sddmm: the mask stores no entry; nothing to simulate")
    nnz = len(crd)
    notes = (f"split (docs/conventions.md#sddmm-of-any-size): Bᵀ ({n:,} x {k} words) does not "
             f"fit the SPM's {arch.spm.capacity_words:,} words; the mask's {n:,} columns cut "
             f"into {count} block(s) of {block:,}, each an SDDMM over its entries "
             f"({len(parts)} with entries), A streamed once per block",)
    res = sequence_results(parts, workload, out, notes=notes,
                           mapping_summary=f"split: {count} column blocks of {block:,}\n"
                           + "\n".join(summaries[:2]))
    read = m * k + n * k + 2 * nnz  # A, Bᵀ, the mask's values and columns
    return out, dataclasses.replace(res, roofline=floors(arch, nnz * k, read, nnz))


__all__ = ["plan_sddmm_split", "run_sddmm_split"]
