"""Masked attention of any size (docs/conventions.md#attention-of-any-size).

The CSR lowering (`lower.py`) keeps K and V resident, since the SDDMM and the SpMM gather their
rows by the mask's columns; a long sequence's K and V do not fit the SPM (`--seq 65536` on the
default arch: K is 2,097,152 words, the SPM 1,048,576). The softmax is row-wise, so the queries
are cut into row blocks, each a whole attention program of its own (SDDMM -> softmax -> SpMM)
over just the keys its rows attend: the block's distinct columns, packed (the DMA gathers those
rows of K and V; for a window or dilated pattern they are one contiguous band). Every block's
rows are exact -- no partial sums, no rescaling -- so values are checked block by block against
the float64 reference of the block.

- **Sizes from the SPM.** A block's packed K (or V) takes at most half the SPM and the rest
  holds 8 streamed query rows (Q, the row's scores and coordinates), double-buffered
  (`dataflow.plan.split.fits_spm`); the block has the most rows whose worst block fits, at
  most `MAX_BLOCK_ROWS` (fewer rows simulated per distinct block). Without an accmax unit the
  row maximum's level buffer (about the block's entries, `row_max.level_words`) must fit too.
- **Memoised timing.** Two blocks with the same local mask (row pointers and packed columns)
  and the same shapes run the same program up to the values, so the same cycles: a window
  pattern's interior blocks are one. One representative per key is simulated; the others'
  values are the block's numpy reference (`attention_reference`) and its timing is reused.
- **Roofline.** The whole problem's: nnz * (d + dv) MACs, Q, the mask's columns, the attended
  rows of K and V read once, O written once. A key attended by two blocks is read twice:
  the split's cost, above the floor.
- **Refused up front.** A single query row whose keys do not fit (a dense row of a long
  sequence: that would need key panels with an online-softmax rescale, not modelled), and the
  split limits of `dataflow.plan.split.check_limits`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Hashable

import numpy as np

from dataflow.arch import ArchSpec
from dataflow.arch.limits import HOST_BYTES_PER_ITERATION, MAX_KEPT_OUTPUT_BYTES, gib
from dataflow.attention.block_fill import find_cover
from dataflow.attention.lower import lower_attention
from dataflow.attention.lower_block import find_blocks
from dataflow.attention.op import SparseAttention
from dataflow.attention.reference import attention_reference
from dataflow.attention.row_softmax import row_width
from dataflow.dfg.row_max import level_words
from dataflow.errors import UserError
from dataflow.pe_array.result import SimResult
from dataflow.pe_array.roofline import floors
from dataflow.pe_array.simulate import sequence_results, simulate_mapping
from dataflow.plan.compile import compile_program
from dataflow.plan.gemm_schedule import supports
from dataflow.plan.split import (
    _groups,
    check_limits,
    fits_spm,
    fits_unsplit,
    largest,
    piece,
    round_up,
)
from dataflow.testing import max_abs_error, values_match
from dataflow.workloads import fits_host_memory, host_budget

#: most query rows of a block: a split run simulates one block per distinct local mask, so
#: smaller blocks simulate less (a window pattern's first, interior and last), at the cost of
#: one reconfiguration and the overlapping keys per block
MAX_BLOCK_ROWS = 4096


def _row_words(arch: ArchSpec, dp: int, dv: int, max_row_nnz: int) -> int:
    """SPM words one streamed query row takes in the widest kernel: Q's (or O's) row and the
    row's scores, probabilities and columns, each window with the tiling's spare row."""
    row = arch.spm.words_per_row
    entries = round_up(max_row_nnz, row) + row
    return round_up(max(dp, dv), row) + row + 3 * entries


def sim_bytes(nnz: int, dp: int, dv: int, lanes: int) -> float:
    """Host bytes the mapper and the engine hold to simulate `nnz` attended pairs: one
    iteration per pair in each kernel (SIMD chunks in the SDDMM and the SpMM)."""
    return HOST_BYTES_PER_ITERATION * nnz * (-(-dp // lanes) + 3 + -(-dv // lanes))


def _distinct_per_block(pos: np.ndarray, crd: np.ndarray, n: int, rows: int) -> np.ndarray:
    """Distinct columns attended by each block of `rows` query rows."""
    m = len(pos) - 1
    row_of = np.repeat(np.arange(m, dtype=np.int64), np.diff(pos))
    blocks = -(-m // rows)
    if len(crd) == 0:
        return np.zeros(blocks, dtype=np.int64)
    key = np.unique((row_of // rows) * n + crd)
    return np.bincount(key // n, minlength=blocks)


@dataclasses.dataclass(frozen=True)
class AttentionSplit:
    """Query rows cut into blocks of `rows` (the last takes the rest)."""

    m: int
    rows: int

    @property
    def count(self) -> int:
        return -(-self.m // self.rows)

    def blocks(self):
        return ((r0, min(self.m, r0 + self.rows)) for r0 in range(0, self.m, self.rows))


def plan_split(arch: ArchSpec, pos: np.ndarray, crd: np.ndarray, n: int, d: int,
               dv: int) -> AttentionSplit | None:
    """The row blocks of an attention whose K and V (or simulation) do not fit, or None when
    the whole runs as before. A `UserError` when not even one query row's keys fit."""
    lanes = arch.pe_array.simd_lanes
    dp = -(-d // lanes) * lanes
    m, nnz = len(pos) - 1, len(crd)
    lengths = np.diff(pos)
    widest = int(lengths.max()) if m else 0
    row_words = _row_words(arch, dp, dv, widest)
    # without an accmax unit the row maximum is computed by doubling levels whose row kernels
    # gather from a level buffer of about the entries, resident whole (`dfg/row_max.py`),
    # unless rows of one width take the row-body softmax (`row_softmax.py`)
    levels = not supports(arch, "accmax") and row_width(pos) is None

    def levels_fit(entries: int, rows: int) -> bool:
        return not levels or fits_unsplit(arch, level_words(entries, widest) + rows, row_words)

    if (fits_unsplit(arch, n * max(dp, dv), row_words) and levels_fit(nnz, m)
            and fits_host_memory(sim_bytes(nnz, dp, dv, lanes))):
        return None
    host_rows = m
    if not fits_host_memory(sim_bytes(nnz, dp, dv, lanes)):  # rows whose simulation fits
        per_row = sim_bytes(max(1, nnz / max(1, m)), dp, dv, lanes)
        host_rows = max(1, int(max(0.0, host_budget()) // per_row))

    def ok(rows: int) -> bool:
        worst = int(_distinct_per_block(pos, crd, n, rows).max(initial=0))
        entries = int(np.diff(pos[::rows].tolist() + [int(pos[-1])]).max(initial=0))
        return fits_spm(arch, worst * max(dp, dv), row_words) and levels_fit(entries, rows)

    rows = largest(min(m, host_rows, MAX_BLOCK_ROWS), 1, ok)
    if rows is not None:  # equal blocks (the last no shorter): more of them share a program
        rows = piece(m, -(-m // rows))
    if rows is None:
        i = int(np.argmax(lengths))
        src = f" ({arch.source})" if arch.source else ""
        raise UserError(
            f"attention does not fit the SPM{src} even split into query rows: row {i} attends "
            f"{widest:,} keys, whose K and V rows ({widest:,} x {max(dp, dv)} words) need more "
            f"than half of its {arch.spm.capacity_words:,} words (splitting one row's keys "
            "would need an online-softmax rescale, not modelled); use a sparser pattern, a "
            "shorter --seq or a larger spm.capacity_words_per_line")
    return AttentionSplit(m, rows)


def _block(q, k, v, pos, crd, r0: int, r1: int):
    """The block's operands: its Q rows, the packed K and V rows it attends, its local mask."""
    p0, p1 = int(pos[r0]), int(pos[r1])
    cols = crd[p0:p1]
    keys = np.unique(cols)
    local_crd = np.searchsorted(keys, cols).astype(np.int64)
    local_pos = (pos[r0:r1 + 1] - p0).astype(np.int64)
    return q[r0:r1], k[keys], v[keys], local_pos, local_crd


def _lower_block(q, k, v, pos, crd, arch: ArchSpec, lowering: str):
    """(program, lowering name) of one row block: the block lowering where `lowering` picks it
    for the block's mask on `arch` (`SparseAttention`'s rules), else the CSR lowering (dia
    needs a square mask, which a row block is not)."""
    if lowering in ("block", "auto"):
        op = SparseAttention(q, k, v, pos, crd, lowering="auto")
        op.set_arch(arch)
        if op.lowering == "block":
            return op._lower(), "block"
    return lower_attention(q, k, v, pos, crd, lanes=arch.pe_array.simd_lanes), "csr"


def _key(local_pos: np.ndarray, local_crd: np.ndarray, keys: int) -> Hashable:
    h = hashlib.sha1(local_pos.tobytes())
    h.update(local_crd.tobytes())
    return (len(local_pos) - 1, keys, h.hexdigest())


def split_attention(q, k, v, pos, crd, arch: ArchSpec, *, engine: str, workload: str,
                    trace: bool, lowering: str, t0: float | None = None) -> SimResult | None:
    """Run attention in query-row blocks when it does not fit whole (the module docstring);
    None when it does."""
    t0 = time.perf_counter() if t0 is None else t0
    (m, d), (n, _), dv = q.shape, k.shape, v.shape[1]
    pos, crd = np.asarray(pos, dtype=np.int64), np.asarray(crd, dtype=np.int64)
    split = plan_split(arch, pos, crd, n, d, dv)
    if split is None:
        return None
    # the block lowering where asked (not by "default": split, its row blocks measured slower
    # than the CSR lowering's, docs/conventions.md#block-attention)
    # (or over the blocks a mask touches, fillers masked: docs/conventions.md#block-attention)
    blocks = ((find_blocks(pos, crd, m, n) or find_cover(pos, crd, m, n))
              if lowering in ("block", "auto") else None)
    if blocks is not None and split.rows >= 2 * blocks[0]:
        # whole panels per row block: each block's mask (packed keys) is whole blocks too
        split = AttentionSplit(m, split.rows // blocks[0] * blocks[0])
    else:
        lowering = "csr" if lowering in ("block", "auto", "default") else lowering
    if trace:
        raise UserError(f"--trace: attention --seq {m} runs split into query-row blocks; trace "
                        "a size that fits whole")
    lanes = arch.pe_array.simd_lanes
    dp = -(-d // lanes) * lanes
    nnz = len(crd)
    # the blocks' keys first (cheap): how many distinct programs will be simulated
    keys, simulated, seen = [], 0, set()
    for r0, r1 in split.blocks():
        _, kb, _, lp, lc = _block(q, k, v, pos, crd, r0, r1)
        key = _key(lp, lc, len(kb))
        keys.append(key)
        if key not in seen and len(lc):
            seen.add(key)
            simulated += len(lc) * (d + dv)
    check_limits(f"attention (--seq {m} --dim {d}, {nnz:,} attended pairs)",
                 nnz * (d + dv), simulated)
    keep = m * dv * 4 <= MAX_KEPT_OUTPUT_BYTES
    output = np.zeros((m, dv), dtype=np.float32) if keep else None
    memo: dict[Hashable, SimResult] = {}
    parts: list[tuple[Hashable | None, SimResult]] = []
    ok, error, model_error, memoised, moved_keys = True, 0.0, 0.0, 0, 0
    lowered: set[str] = set()
    for (r0, r1), key in zip(split.blocks(), keys):
        qb, kb, vb, lp, lc = _block(q, k, v, pos, crd, r0, r1)
        ref = attention_reference(qb, kb, vb, lp, lc)
        moved_keys += len(kb)
        if len(lc) == 0:  # no attended key in the block: zero rows, nothing runs
            out = np.zeros((r1 - r0, dv), dtype=np.float32)
        elif key in memo:
            parts.append((key, memo[key]))
            memoised += 1
            out = ref
        else:
            prog, low = _lower_block(qb, kb, vb, lp, lc, arch, lowering)
            lowered.add(low)
            mapping = compile_program(prog, arch)
            res = simulate_mapping(mapping, engine=engine, workload=workload)
            out = np.asarray(res.output, dtype=np.float32).reshape(r1 - r0, dv)
            res = dataclasses.replace(res, output=None, mapping_summary=mapping.summary())
            memo[key] = res
            model_error = max(model_error, max_abs_error(out, ref))
            parts.append((key, res))
        ok = ok and values_match(out, ref)
        error = max(error, max_abs_error(out, ref))
        if output is not None:
            output[r0:r1] = out
    if not parts:
        raise UserError(f"attention --seq {m}: the mask attends no key; nothing to simulate")
    attended = int(np.unique(crd).size)
    notes = (
        f"split (docs/conventions.md#attention-of-any-size): {m:,} query rows cut into "
        f"{split.count:,} block(s) of {split.rows:,} rows (last "
        f"{m - (split.count - 1) * split.rows:,}), each an attention program over the keys it "
        f"attends (packed; {moved_keys:,} K and V rows loaded in all, {attended:,} distinct), "
        f"sizes from the SPM's {arch.spm.capacity_words:,} words",
        f"timing memoised: {len(memo):,} distinct block programs simulated, their cycles, bytes "
        f"and energy counted for all {len(parts):,} (same local mask and shapes: same "
        f"cycles); the other {memoised:,} blocks' values are their numpy reference; the "
        f"simulated blocks' engine values lie within {model_error:.3g} of it",
        f"values checked block by block against a float64 numpy reference "
        f"({split.count:,} blocks)",
        f"attention nnz {nnz:,} of {m * n:,} ({100 * nnz / max(1, m * n):.3g}%); "
        f"{' and '.join(sorted(lowered)) or 'csr'} lowering"
        + (f" (--lowering {lowering} asked: a row block is not square, so csr)"
           if lowering == "dia" else ""),
    ) + (() if keep else (f"output not kept: O ({gib(m * dv * 4)}) is larger than "
                           f"{gib(MAX_KEPT_OUTPUT_BYTES)}",))
    summary = f"split: {split.count:,} query-row blocks of {split.rows:,}\n" + "\n".join(
        r.mapping_summary for r in list(memo.values())[:3])
    res = sequence_results(_groups([(key, None, r) for key, r in parts]), workload, output,
                           notes=notes, mapping_summary=summary)
    read = m * dp + nnz + attended * (dp + dv)  # Q, the mask's columns, the attended K, V rows
    return dataclasses.replace(res, roofline=floors(arch, nnz * (d + dv), read, m * dv),
                               values_match_reference=ok, max_abs_error=error,
                               wall_seconds=time.perf_counter() - t0)


__all__ = ["AttentionSplit", "plan_split", "split_attention"]
