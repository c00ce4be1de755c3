"""dynamic-spmm of any size (docs/conventions.md#tiling-any-problem-size).

The dynamic program keeps B (or, for 1 x 64 micro-tiles, C) resident next to a panel of A
(`dataflow.dynamic.lower.panel_rows_for`); when that does not fit the SPM, or the operands do
not fit the host's memory, the problem runs in blocks (`dataflow.plan.split`): each block is a
whole dynamic program of its own -- index build over its block of A, gathers, compute -- so
the index is found at run time block by block, K panels add their partial sums into C (read
back from DRAM), and M tiles are generated one at a time from the seed when streamed.
Sparse blocks are all simulated (their timing depends on their pattern); only the dense
baseline's could be memoised, and is not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dataflow.arch import ArchSpec
from dataflow.arch.limits import HOST_BYTES_PER_ITERATION
from dataflow.dynamic.lower import ROW_PAD, lower_dense_reference, lower_dynamic_spmm
from dataflow.dynamic.microtile import GRANULARITIES, build_index, random_mask, tile_nonzero_mask
from dataflow.dynamic.panel_gemm import fits_block, lower_panel_gemm, supported
from dataflow.dynamic.stats import DynamicStats
from dataflow.errors import UserError
from dataflow.plan.gemm_schedule import supports
from dataflow.plan.split import (
    Block,
    Split,
    SplitWork,
    check_limits,
    choose_split,
    fits_spm,
    fits_unsplit,
    largest,
    moved_words,
    round_up,
    run_split,
)
from dataflow.workloads import check_host_memory, dense_bytes, fits_host_memory, host_budget


def _rows(arch: ArchSpec, k: int, n: int) -> int:
    """SPM words of one streamed row of A (stored with `ROW_PAD`) and of C (dense GEMM)."""
    row = arch.spm.words_per_row
    return round_up(k + ROW_PAD, row) + row + round_up(n, row) + row


def _scatter_fits(arch: ArchSpec, rows: int, k: int, n: int, bw: int) -> bool:
    """1 x bw tiles scatter-add into a resident C (rows x n) beside a panel of A of at most
    the room `panel_rows_for` leaves, and stream B a k-block (bw rows) at a time with the
    block's tile rows, double-buffered."""
    cap, row = arch.spm.capacity_words, arch.spm.words_per_row
    ld = k + ROW_PAD
    panel = min(rows, max(0, cap // 2 - k * n) // ld) * ld
    stream = 2 * (round_up(bw * n, row) + round_up(rows, row) + 2 * row)
    return round_up(rows * n, row) + round_up(panel, row) + stream <= cap


def fits_whole(arch: ArchSpec, granularity: str, m: int, k: int, n: int) -> bool:
    """Whether the m x k x n dynamic program maps as today (no split)."""
    if granularity == "dense":
        return fits_unsplit(arch, k * n, _rows(arch, k, n))
    bh, bw = GRANULARITIES[granularity]
    if arch.spm.capacity_words // 2 - k * n < bh * (k + ROW_PAD):  # `panel_rows_for`
        return False
    return bh > 1 or _scatter_fits(arch, m, k, n, bw)


def sim_bytes(arch: ArchSpec, rows: int, k: int, n: int, density: float) -> float:
    """Host bytes the mapper and the engine hold to simulate a rows x k x n dynamic program:
    the scan's iterations (a vector of A's row a step) and the compute's (a vector of C per
    element of A's nonzero micro-tiles, a fraction `density` of A), `HOST_BYTES_PER_ITERATION`
    each."""
    lanes = arch.pe_array.simd_lanes
    return HOST_BYTES_PER_ITERATION * rows * k * (1 / lanes + density * -(-n // lanes))


def simulable(arch: ArchSpec, m: int, k: int, n: int, density: float) -> bool:
    """Whether the whole operands and their simulation fit the host's memory."""
    return fits_host_memory(host_bytes(m, k, n) + sim_bytes(arch, m, k, n, density))


def _host_rows(arch: ArchSpec, m: int, k: int, n: int, kp: int, nb: int, density: float,
               streamed: bool) -> int:
    """The most rows of an M tile the host holds: its operands (all of them, unless
    streamed) and the simulation of one kp x nb block."""
    per_row = sim_bytes(arch, 1, kp, nb, density)
    held = host_bytes(m, k, n)
    if streamed:
        per_row += host_bytes(1, k, n) - host_bytes(0, k, n)
        held = host_bytes(0, k, n)
    return max(0, int((host_budget() - held) // per_row))


def plan_dynamic_split(arch: ArchSpec, granularity: str, m: int, k: int, n: int,
                       streamed: bool, density: float = 1.0, lowering: str = "panel") -> Split:
    """Blocks that each fit as a dynamic program: B's block and a tile row's panel of A in half
    the SPM (`panel_rows_for`); for 1 x bw tiles, M tiles whose C stays resident beside the
    panel (`_scatter_fits`); K panels whole micro-tiles wide, N blocks whole SIMD vectors; M
    tiles whose simulation (`sim_bytes`, at `density`), with the operands, fits the host's
    memory."""
    cap = arch.spm.capacity_words
    bh, bw = GRANULARITIES.get(granularity, (1, 1))
    dense = granularity == "dense"
    density = 1.0 if dense else density

    panel = not dense and lowering == "panel" and supported((bh, bw))

    def fits(kp: int, nb: int) -> bool:
        if dense:
            return fits_spm(arch, kp * nb, _rows(arch, kp, nb))
        if panel:  # B's block in half the SPM; A's strips are compacted by a kernel of their
            # own (`panel_gemm.compaction_rows`) and streamed to the GEMM
            return fits_block(kp, nb, bh, cap)
        if cap // 2 - kp * nb < bh * (kp + ROW_PAD):
            return False
        return bh > 1 or _scatter_fits(arch, 1, kp, nb, bw)

    def m_rows(kp: int, nb: int) -> int:
        # as many rows as the host holds (0: not even one; the tile's check says so) and, for
        # 1 x bw tiles, as many as keep C resident
        host = _host_rows(arch, m, k, n, kp, nb, density, streamed)
        if bh == 1 and not dense:
            rows = largest(m, 1, lambda rows: _scatter_fits(arch, rows, kp, nb, bw)) or 1
            return min(rows, host) if host else rows
        return max(1, host)

    cut_m = streamed or (bh == 1 and not dense) or not simulable(arch, m, k, n, density)
    return choose_split(arch, m, k, n, fits, m_rows=m_rows if cut_m else None,
                        # the panel GEMM reads A once and its compacted strips once per N block
                        traffic=(4 * m * k * density if panel else 4 * m * (k + ROW_PAD),
                                 4 * k * n, 4 * m * n),
                        k_align=1 if dense else bw,
                        n_align=2 * arch.pe_array.simd_lanes if panel else _n_align(arch, n),
                        m_align=bh, streamed=streamed, what=f"dynamic-spmm/{granularity}")


def _n_align(arch: ArchSpec, n: int) -> int:
    """N blocks of whole SIMD vectors; of whole groups of 8 vectors where n allows, so the
    compiler can block the vector loop by 2, 4 or 8 (docs/conventions.md#sparse-line-model):
    1024 columns in three blocks are 384 + 384 + 256, not 344 + 344 + 336 (43 vectors, which
    block by nothing)."""
    lanes = arch.pe_array.simd_lanes
    return 8 * lanes if n >= 8 * lanes else lanes


def _check_tile(split: Split, density: float, arch: ArchSpec) -> None:
    m, k, n, mt = split.m, split.k, split.n, split.m_tile
    held = host_bytes(mt if split.streamed else m, k, n)
    check_host_memory(f"dynamic-spmm {'streamed ' if split.streamed else ''}tile (--m {mt} of "
                      f"{m} --k {k} --n {n}) and its simulation",
                      held + sim_bytes(arch, mt, split.k_panel, split.n_block, density))


@dataclass
class _Tally:
    """What the blocks' programs found, for the run's `DynamicStats` and floors."""

    nonzeros: int = 0
    elements: int = 0
    tiles: int = 0
    nonzero_tiles: int = 0
    scanned: int = 0  # elements the index scans squared (MACs that are not the matmul's)


def _program(ops, blk: Block, granularity: str, arch: ArchSpec, scheme: str, fetch: str,
             tally: _Tally, lowering: str = "panel"):
    a, b = ops
    ab = np.ascontiguousarray(a[:, blk.k0:blk.k1])
    bb = np.ascontiguousarray(b[blk.k0:blk.k1, blk.n0:blk.n1])
    if granularity == "dense":
        return lower_dense_reference(ab, bb)
    if lowering == "panel" and supported(GRANULARITIES[granularity]):
        # the first N block of these rows and columns of A builds the index and the compacted
        # strips and leaves them in DRAM; the later N blocks read them
        # (dataflow.dynamic.panel_gemm)
        index = build_index(ab, GRANULARITIES[granularity])
        if blk.n0 == 0:
            tally.tiles += index.tile_nonzero.size
            tally.nonzero_tiles += index.nnz_tiles
            tally.scanned += ab.size
        return lower_panel_gemm(ab, bb, index, index_given=blk.n0 > 0,
                                capacity_words=arch.spm.capacity_words,
                                lane_sum=supports(arch, "vsum"))
    prog, index = lower_dynamic_spmm(ab, bb, granularity, capacity_words=arch.spm.capacity_words,
                                     scheme=scheme, fetch=fetch)
    tally.tiles += index.tile_nonzero.size
    tally.nonzero_tiles += index.nnz_tiles
    tally.scanned += ab.size
    return prog


def _work(split: Split, granularity: str, arch: ArchSpec, operands, scheme: str, fetch: str,
          tally: _Tally, notes: tuple[str, ...] = (), lowering: str = "panel") -> SplitWork:
    m, k, n = split.m, split.k, split.n

    def counted(m0: int, m1: int):
        a, b = operands(m0, m1)
        tally.nonzeros += int(np.count_nonzero(a))
        tally.elements += a.size
        return a, b

    def compulsory(runs):
        # A once (every element scanned or multiplied), B once -- at most what the DMA moved
        # for one M tile, since a gathered B moves only the rows the index selects -- C once
        per_tile: dict[int, int] = {}
        for blk, r in runs:
            per_tile[blk.m0] = per_tile.get(blk.m0, 0) + moved_words(r, "B", arch.word_bytes)
        b_words = min(k * n, max(per_tile.values(), default=0))
        macs = m * k * n if granularity == "dense" else tally.nonzeros * n  # as unsplit
        return macs, m * k + b_words, m * n

    return SplitWork(
        workload=f"dynamic-spmm/{granularity}", operands=counted,
        program=lambda ops, blk: _program(ops, blk, granularity, arch, scheme, fetch, tally,
                                          lowering),
        reference=lambda ops, blk: ops[0].astype(np.float64) @ ops[1][:, blk.n0:blk.n1]
        .astype(np.float64),
        compulsory=compulsory, notes=notes)


def _stats(res, granularity: str, n: int, tally: _Tally) -> DynamicStats:
    index = sum(kr.end_cycle - kr.start_cycle for kr in res.kernels
                if kr.kernel.startswith("index_"))
    density = tally.nonzero_tiles / tally.tiles if tally.tiles else 1.0
    return DynamicStats(granularity=granularity,
                        sparsity=1.0 - tally.nonzeros / max(1, tally.elements),
                        tile_density=density, computed_macs=res.macs - tally.scanned,
                        useful_macs=tally.nonzeros * n, index_cycles=index,
                        compute_cycles=res.cycles - index, cycles=res.cycles)


def _limits(split: Split, granularity: str, density: float) -> None:
    m, k, n = split.m, split.k, split.n
    macs = m * k * n
    simulated = macs if granularity == "dense" else density * macs + m * k * split.counts[2]
    check_limits(f"dynamic-spmm (--m {m} --k {k} --n {n})", macs, simulated)


def split_dynamic(a: np.ndarray, b: np.ndarray, granularity: str, spec: ArchSpec, *,
                  engine: str, scheme: str, fetch: str, t0: float, lowering: str = "panel"):
    """(SimResult, DynamicStats) of A @ B (whole arrays in host memory) run in blocks."""
    lowering = lowering if fetch == "gather" else "sread"  # as `simulate_dynamic_matmul`
    (m, k), n = a.shape, b.shape[1]
    density = visited(a, granularity)
    split = plan_dynamic_split(spec, granularity, m, k, n, streamed=False, density=density,
                               lowering=lowering)
    _check_tile(split, density, spec)
    _limits(split, granularity, density)
    tally = _Tally()
    work = _work(split, granularity, spec, lambda m0, m1: (a[m0:m1], b), scheme, fetch, tally,
                 lowering=lowering)
    res = run_split(split, work, spec, engine=engine, t0=t0)
    return res, _stats(res, granularity, n, tally)


def split_dynamic_streamed(spec: ArchSpec, *, m: int, k: int, n: int, sparsity: float,
                           mask_granularity: str, granularity: str, seed: int, engine: str,
                           t0: float, scheme: str = "pit", fetch: str = "gather"):
    """(SimResult, DynamicStats) of a dynamic-spmm whose operands do not fit the host's
    memory: A generated one M tile at a time (mask and values from `default_rng([seed, m0])`),
    B from `default_rng([seed, m])`."""
    # the fraction of A in nonzero micro-tiles: 1 - sparsity when the zeros come in whole
    # micro-tiles of the kernel's, at most 1 otherwise
    density = 1.0 - sparsity if mask_granularity == granularity else 1.0
    split = plan_dynamic_split(spec, granularity, m, k, n, streamed=True, density=density)
    _check_tile(split, density, spec)
    _limits(split, granularity, density)
    b = np.random.default_rng([seed, m]).standard_normal((k, n), dtype=np.float32)

    def operands(m0: int, m1: int):
        rng = np.random.default_rng([seed, m0])
        keep = random_mask(m1 - m0, k, sparsity, mask_granularity, rng)
        a = rng.standard_normal((m1 - m0, k), dtype=np.float32) * keep
        return a.astype(np.float32), b

    tally = _Tally()
    note = ("streamed: A's M tile from row r has its mask and values drawn from numpy's "
            "default_rng([seed, r]), B from default_rng([seed, m])")
    res = run_split(split, _work(split, granularity, spec, operands, scheme, fetch, tally,
                                 (note,)), spec, engine=engine, t0=t0)
    return res, _stats(res, granularity, n, tally)


def host_bytes(rows: int, k: int, n: int) -> int:
    """Host bytes of `rows` rows of A (values and mask), B and C, twice, as
    `make_dynamic_operands` counts them."""
    return 2 * dense_bytes((rows, k), (rows, k), (k, n), (rows, n))


def visited(a: np.ndarray, granularity: str) -> float:
    """The fraction of A's elements in nonzero micro-tiles (1 for the dense baseline)."""
    if granularity == "dense" or not a.size:
        return 1.0
    return float(tile_nonzero_mask(a, GRANULARITIES[granularity]).mean())


def needs_streaming(m: int, k: int, n: int) -> bool:
    """Whether the whole operands (A, its mask, B and C, twice) exceed the host's memory, as
    `make_dynamic_operands` counts them."""
    return not fits_host_memory(host_bytes(m, k, n))


def check_traceable(trace: bool, what: str) -> None:
    if trace:
        raise UserError(f"--trace: {what} runs split into tiles; trace a size that fits whole")
