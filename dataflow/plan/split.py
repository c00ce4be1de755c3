"""Tiling any problem size (docs/conventions.md#tiling-any-problem-size).

A matmul C[m, n] = A[m, k] @ B[k, n] that does not fit the SPM, or whose operands do not fit
the host's memory, is cut into blocks, each run as a sub-program of its own, back to back:

- N blocks: columns of B and C;
- K panels: columns of A and rows of B. Each panel's product is added into C, so every panel
  after the first reads C's partial sums back from DRAM (`simulate_mapping(reload=("C",))`
  charges those loads in the system model: bytes, DMA time and energy);
- M tiles: rows of A and C. When the operands are generated tile by tile (`Split.streamed`)
  the host holds one M tile of A and C (and all of B) at a time.

`choose_split` takes the sizes from the SPM: a block of B stays resident in at most half of it
and the rest holds SPM tiles of A's and C's rows (`fits_spm`); among the sizes that fit, the
one moving the fewest DRAM bytes wins (A read once per N block, B once per M tile, C written
once per K panel and read back for all panels but the first, plus each sub-program's
reconfiguration and DMA latency in bytes). The workload says how many rows an M tile has
(`m_rows`: what the host holds; for a GEMM at most `MIN_TILES` SPM tiles, `m_tile_rows`).

`run_split` runs the blocks (M tile, N block, K panel innermost), adds the panels' partial
products in fp32 on the host (the add a flush into a reloaded C does,
docs/conventions.md#accumulation-flushing), checks each tile of C against its float64
reference, and puts the runs in sequence with `sequence_results`. The whole run's roofline
is the whole problem's: its useful MACs and compulsory bytes (`SplitWork.compulsory`). Blocks
whose sub-programs are identical up to a base offset (same shape and address pattern,
`SplitWork.memo_key`: a dense GEMM's of one shape, a CSR SpMM's N blocks over the same rows of
A) have identical cycles, so one representative per key is simulated and its timing
counted for every such block, while every block's values are still computed, by the engine
or with the kernel's semantics in numpy (`SplitWork.values`), and checked.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dataflow.arch.limits import (
    MAX_HOST_CHECK_MACS,
    MAX_KEPT_OUTPUT_BYTES,
    MAX_SIMULATED_MACS,
    gib,
)
from dataflow.arch.spec import ArchSpec, PEKind
from dataflow.dfg.graph import Program
from dataflow.errors import UserError
from dataflow.mapper.tiling import MIN_TILES
from dataflow.pe_array.result import KernelResult, Roofline, SimResult
from dataflow.pe_array.roofline import floors
from dataflow.pe_array.simulate import sequence_results, simulate_mapping
from dataflow.pe_array.systolic import _use_numba, matmul_k_ordered
from dataflow.plan.compile import compile_program
from dataflow.testing import max_abs_error, values_match

Range = tuple[int, int]

#: fewest rows of A and C one SPM tile of a sub-program holds, so its loads overlap compute
MIN_TILE_ROWS = 8
#: most N block sizes `choose_split` weighs
MAX_CANDIDATES = 512
#: rows `inorder_matmul` takes at a time
INORDER_ROWS = 1024
#: the output buffer whose partial sums K panels read back
PARTIAL_SUMS = ("C",)


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def piece(extent: int, count: int, align: int = 1) -> int:
    """The size of about `count` equal contiguous pieces of `extent`, a multiple of `align`."""
    units = -(-extent // align)
    return min(extent, align * -(-units // max(1, count)))


def pieces(extent: int, size: int) -> Iterator[Range]:
    """`extent` in contiguous pieces of `size`, the last taking the rest."""
    return ((lo, min(extent, lo + size)) for lo in range(0, extent, size))


def sizes(extent: int, size: int) -> tuple[int, ...]:
    """The distinct sizes of `pieces(extent, size)`: one, or two when the last is shorter."""
    last = extent - (-(-extent // size) - 1) * size
    return (size,) if last == size else (size, last)


@dataclass(frozen=True)
class Block:
    """One sub-problem: C[m0:m1, n0:n1] += A[m0:m1, k0:k1] @ B[k0:k1, n0:n1]."""

    m0: int
    m1: int
    k0: int
    k1: int
    n0: int
    n1: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.m1 - self.m0, self.k1 - self.k0, self.n1 - self.n0)

    @property
    def reloads(self) -> bool:
        """Whether C's partial sums come back from DRAM (every K panel but the first)."""
        return self.k0 > 0


@dataclass(frozen=True)
class Split:
    """How C[m, n] = A[m, k] @ B[k, n] is cut (see the module docstring): M tiles of `m_tile`
    rows, K panels of `k_panel`, N blocks of `n_block` columns, the last of each taking the
    rest. `streamed`: the operands are generated one M tile at a time."""

    m: int
    k: int
    n: int
    m_tile: int
    k_panel: int
    n_block: int
    streamed: bool = False

    @property
    def counts(self) -> tuple[int, int, int]:
        return (-(-self.m // self.m_tile), -(-self.k // self.k_panel),
                -(-self.n // self.n_block))

    @property
    def count(self) -> int:
        mc, kc, nc = self.counts
        return mc * kc * nc

    def m_tiles(self) -> Iterator[Range]:
        return pieces(self.m, self.m_tile)

    def n_blocks(self) -> Iterator[Range]:
        return pieces(self.n, self.n_block)

    def blocks(self, m0: int, m1: int, n0: int, n1: int) -> Iterator[Block]:
        for k0, k1 in pieces(self.k, self.k_panel):
            yield Block(m0, m1, k0, k1, n0, n1)

    def distinct_blocks(self) -> set[tuple[tuple[int, int, int], bool]]:
        """(shape, reloads) of the blocks: what makes two dense blocks' runs differ."""
        panels = {(k1 - k0, k0 > 0) for k0, k1 in pieces(self.k, self.k_panel)}
        return {((mt, kp, nb), r) for mt in sizes(self.m, self.m_tile) for kp, r in panels
                for nb in sizes(self.n, self.n_block)}

    def describe(self) -> str:
        mc, kc, nc = self.counts

        def size(extent, s):
            last = sizes(extent, s)[-1]
            return f"{s:,}" + (f" (last {last:,})" if last != s else "")

        return (f"{self.m:,} x {self.k:,} x {self.n:,} cut into {mc:,} M tile(s) of "
                f"{size(self.m, self.m_tile)} rows x {kc:,} K panel(s) of "
                f"{size(self.k, self.k_panel)} x {nc:,} N block(s) of "
                f"{size(self.n, self.n_block)} columns")


# --- choosing the sizes ---------------------------------------------------------------------

def fits_spm(arch: ArchSpec, resident_words: int, row_words: int,
             min_rows: int = MIN_TILE_ROWS) -> bool:
    """A sub-problem fits when its resident words (B's block) take at most half the SPM and
    the rest holds `min_rows` streamed rows of `row_words` words, double-buffered."""
    spm = arch.spm
    res = round_up(resident_words, spm.words_per_row)
    return res <= spm.capacity_words // 2 and res + 2 * min_rows * row_words <= spm.capacity_words


def m_tile_rows(arch: ArchSpec, resident_words: int, row_words: int) -> int:
    """Rows of an M tile: `MIN_TILES` SPM tiles, each as many rows of `row_words` words as fit
    double-buffered next to the resident words (the mapper then cuts it into those tiles)."""
    spm = arch.spm
    free = spm.capacity_words - round_up(resident_words, spm.words_per_row)
    return MIN_TILES * max(1, free // (2 * max(1, row_words)))


def fits_unsplit(arch: ArchSpec, resident_words: int, row_words: int) -> bool:
    """Whether the whole problem maps as today: its resident words and one streamed row of
    `row_words`, double-buffered, fit the SPM (the split kicks in only when they do not)."""
    spm = arch.spm
    return (round_up(resident_words, spm.words_per_row) + 2 * row_words
            <= spm.capacity_words)


def inorder_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A @ B in fp32 the way the GEMM kernel computes it (docs/conventions.md#arithmetic):
    each output starts at 0 and adds one rounded product per k, in increasing k."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    if _use_numba(a.shape[0] * a.shape[1] * b.shape[1]):  # compiled loops, the same order
        c = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
        matmul_k_ordered(np.ascontiguousarray(a), np.ascontiguousarray(b), c)
        return c
    c = np.empty((a.shape[0], b.shape[1]), dtype=np.float32)
    for r0 in range(0, a.shape[0], INORDER_ROWS):  # rows a chunk at a time: it stays in cache
        at = np.ascontiguousarray(a[r0:r0 + INORDER_ROWS].T)
        part = np.zeros((at.shape[1], b.shape[1]), dtype=np.float32)
        prod = np.empty_like(part)
        for kk in range(at.shape[0]):
            np.multiply(at[kk][:, None], b[kk], out=prod)
            part += prod
        c[r0:r0 + INORDER_ROWS] = part
    return c


def inorder_spmm(a, b: np.ndarray) -> np.ndarray:
    """CSR A (a scipy CSR matrix) @ B in fp32 the way the CSR SpMM kernel computes it: each
    row of C starts at 0 and adds one rounded val * B[crd] per stored entry, in stored order."""
    pos, crd = a.indptr, a.indices
    val = np.asarray(a.data, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    c = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    lengths = np.diff(pos)
    order = np.argsort(-lengths, kind="stable")  # longest rows first: step t takes a prefix
    ranked = lengths[order]
    for t in range(int(ranked[0]) if len(ranked) else 0):
        rows = order[:int(np.count_nonzero(ranked > t))]
        p = pos[rows] + t
        c[rows] += val[p, None] * b[crd[p]]
    return c


def largest(extent: int, align: int, ok: Callable[[int], bool]) -> int | None:
    """The largest multiple of `align` (or `extent` itself) up to `extent` with `ok`; None if
    not even `align` is (`ok` must be monotone)."""
    lo, hi = 1, -(-extent // align)
    if not ok(min(extent, align)):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(min(extent, mid * align)):
            lo = mid
        else:
            hi = mid - 1
    return min(extent, lo * align)


def _block_sizes(n: int, align: int) -> list[int]:
    units = -(-n // align)
    sizes = {min(n, align * -(-units // c)) for c in range(1, min(units, MAX_CANDIDATES) + 1)}
    sizes |= {min(n, align << i) for i in range(units.bit_length())}
    return sorted(sizes, reverse=True)


def choose_split(arch: ArchSpec, m: int, k: int, n: int, fits: Callable[[int, int], bool], *,
                 traffic: tuple[float, float, float],
                 m_rows: Callable[[int, int], int] | None = None, k_align: int = 1,
                 n_align: int = 1, m_align: int = 1, streamed: bool = False,
                 what: str = "matmul", issue: Callable[[int], float] | None = None) -> Split:
    """The split whose blocks fit (`fits(k_panel, n_block)`) with the fewest DRAM bytes.

    `traffic`: the bytes of A, B and C once each; `m_rows(k_panel, n_block)`: rows of an M tile
    (None: M is not cut); M tiles are multiples of `m_align`, K panels of `k_align`, N blocks
    of `n_align` (but the last). `issue(n_block)`: the cycles the array's issue slots need for
    the whole problem in N blocks of that width; where given, a split costs the longer of its
    DRAM time and that (docs/conventions.md#spmm-n-blocks-by-issue-slots). Ties go to fewer
    sub-programs. A `UserError` when not even one aligned panel and block fits."""
    a_bytes, b_bytes, c_bytes = traffic
    bpc = arch.dram.bytes_per_cycle
    overhead = (arch.reconfiguration_cycles + arch.dram.latency_cycles) * bpc
    best = None
    for nb in _block_sizes(n, n_align):
        kp = largest(k, k_align, lambda kp, nb=nb: fits(kp, nb))
        if kp is None:
            continue
        kp = piece(k, -(-k // kp), k_align)
        nb = piece(n, -(-n // nb), n_align)
        rows = max(m_align, m_rows(kp, nb) // m_align * m_align) if m_rows else m
        mt = piece(m, -(-m // rows), m_align)
        mc, kc, nc = -(-m // mt), -(-k // kp), -(-n // nb)
        moved = a_bytes * nc + b_bytes * mc + c_bytes * (2 * kc - 1)
        if issue is not None:  # in bytes the DRAM moves meanwhile
            moved = max(moved, issue(nb) * bpc)
        cost = (moved + overhead * mc * kc * nc, mc * kc * nc)
        if best is None or cost < best[0]:
            best = (cost, Split(m, k, n, mt, kp, nb, streamed))
    if best is None:
        src = f" ({arch.source})" if arch.source else ""
        raise UserError(f"{what} {m} x {k} x {n} does not fit the SPM{src} even split: not even "
                        f"a {k_align}-column panel of A with a {n_align}-column block of B fits "
                        f"its {arch.spm.capacity_words:,} words; use a larger "
                        "spm.capacity_words_per_line")
    return best[1]


def check_limits(what: str, host_macs: float, simulated_macs: float) -> None:
    """Refuse up front a split run whose value check or simulation would take hours
    (`MAX_HOST_CHECK_MACS`, `MAX_SIMULATED_MACS`, docs/conventions.md#limits)."""
    for macs, limit, where in ((host_macs, MAX_HOST_CHECK_MACS, "host arithmetic to check "
                                "its values"),
                               (simulated_macs, MAX_SIMULATED_MACS, "simulated MACs")):
        if macs > limit:
            raise UserError(f"{what} needs {macs:.3g} MACs of {where}; the limit is "
                            f"{limit:.3g} (minutes, not hours): use smaller sizes")


# --- running the blocks ---------------------------------------------------------------------

def _no_memo(block: Block) -> Hashable | None:
    return None


@dataclass(frozen=True)
class SplitWork:
    """What a workload hands `run_split`.

    `operands(m0, m1)`: the operands of one M tile (generated from the seed when streamed,
    else slices of the whole); `program(ops, block)`: the block's sub-program, lowered as the
    workload lowers the whole problem (None when the block of A stores nothing: its product
    is 0 and nothing runs); `reference(ops, block)`: the float64 reference of C[m0:m1, n0:n1]
    (the block spans all of K); `compulsory`: (useful MACs, words read, words written) of the
    whole problem, or a function of the runs ((block, SimResult) of every block that ran)
    giving them;
    `memo_key(block)`: equal for blocks whose sub-programs are identical up to a base offset,
    None to simulate the block; `values(ops, block)`: the block's fp32 product with the
    kernel's semantics, for memoised blocks; `notes`: added to the result's."""

    workload: str
    operands: Callable[[int, int], Any]
    program: Callable[[Any, Block], Program | None]
    reference: Callable[[Any, Block], np.ndarray]
    compulsory: (tuple[int, int, int]
                 | Callable[[list[tuple[Block, SimResult]]], tuple[int, int, int]])
    memo_key: Callable[[Block], Hashable | None] = _no_memo
    values: Callable[[Any, Block], np.ndarray] | None = None
    notes: tuple[str, ...] = ()


class _Progress:
    """`tile i/N` on stderr, when it is a terminal and the run has taken a few seconds."""

    def __init__(self, what: str, total: int, t0: float, stream=None):
        self.what, self.total, self.t0 = what, total, t0
        self.stream = sys.stderr if stream is None else stream
        self.on = bool(getattr(self.stream, "isatty", lambda: False)())
        self.shown = False
        self.last = 0.0

    def step(self, done: int) -> None:
        now = time.perf_counter()
        if not self.on or now - self.t0 < 2 or (now - self.last < 1 and done < self.total):
            return
        self.last, self.shown = now, True
        print(f"\r{self.what}: tile {done:,}/{self.total:,}, {now - self.t0:.0f} s",
              end="", file=self.stream, flush=True)

    def close(self) -> None:
        if self.shown:
            print(file=self.stream, flush=True)


class _Runs:
    """The blocks' runs in order, the memo of representatives and the value check."""

    def __init__(self, split: Split, work: SplitWork, arch: ArchSpec, engine: str,
                 dataflow: str | None):
        self.split, self.work, self.arch = split, work, arch
        self.engine, self.dataflow = engine, dataflow
        self.parts: list[tuple[Hashable | None, Block, SimResult]] = []
        self.memo: dict[Hashable, SimResult] = {}
        self.memoised = 0
        self.model_error = 0.0  # the representatives' engine values against `work.values`
        self.ok, self.error, self.tiles = True, 0.0, 0
        keep = split.m * split.n * 4 <= MAX_KEPT_OUTPUT_BYTES
        self.output = np.zeros((split.m, split.n), dtype=np.float32) if keep else None

    def block(self, ops, blk: Block) -> np.ndarray:
        """The block's fp32 product: simulated, or its representative's timing reused."""
        key = self.work.memo_key(blk)
        if key is not None and key in self.memo:
            self.parts.append((key, blk, self.memo[key]))
            self.memoised += 1
            return np.asarray(self.work.values(ops, blk), dtype=np.float32)
        prog = self.work.program(ops, blk)
        if prog is None:  # nothing stored in this block of A: its product is zero, nothing runs
            return np.zeros((blk.shape[0], blk.shape[2]), dtype=np.float32)
        mapping = compile_program(prog, self.arch, dataflow=self.dataflow)
        res = simulate_mapping(mapping, engine=self.engine, workload=self.work.workload,
                               reload=PARTIAL_SUMS if blk.reloads else ())
        out = np.asarray(res.output, dtype=np.float32).reshape(blk.shape[0], blk.shape[2])
        res = dataclasses.replace(res, output=None, mapping_summary=mapping.summary())
        if key is not None:
            self.memo[key] = res
            if self.work.values is not None:
                self.model_error = max(self.model_error,
                                       max_abs_error(out, self.work.values(ops, blk)))
        self.parts.append((key, blk, res))
        return out

    def check(self, c: np.ndarray, ref: np.ndarray, m0: int, n0: int) -> None:
        self.ok = self.ok and values_match(c, ref)
        self.error = max(self.error, max_abs_error(c, ref))
        self.tiles += 1
        if self.output is not None:
            self.output[m0:m0 + c.shape[0], n0:n0 + c.shape[1]] = c


def run_split(split: Split, work: SplitWork, arch: ArchSpec, *, engine: str = "fast",
              dataflow: str | None = None, t0: float | None = None) -> SimResult:
    """Run every block of `split` (see the module docstring); one `SimResult` whose values
    check is filled in, tile by tile."""
    t0 = time.perf_counter() if t0 is None else t0
    runs = _Runs(split, work, arch, engine, dataflow)
    progress = _Progress(work.workload, split.count, t0)
    done = 0
    for m0, m1 in split.m_tiles():
        ops = work.operands(m0, m1)
        for n0, n1 in split.n_blocks():
            c = None
            for blk in split.blocks(m0, m1, n0, n1):
                vals = runs.block(ops, blk)
                c = vals if c is None else c + vals  # fp32: the flush into the reloaded C
                done += 1
                progress.step(done)
            runs.check(c, work.reference(ops, Block(m0, m1, 0, split.k, n0, n1)), m0, n0)
        del ops
    progress.close()
    return _combine(runs, t0)


# --- one result -----------------------------------------------------------------------------

def _repeat(res: SimResult, count: int) -> SimResult:
    """`count` back-to-back runs of `res` (a memoised block); a one-kernel run's kernels become
    one entry spanning them all, named `kernel xcount`."""
    if count == 1:
        return res
    seq = sequence_results([res] * count, res.workload, None, notes=res.notes,
                           mapping_summary=res.mapping_summary)
    if len(res.kernels) != 1:
        return seq
    k, first, last = res.kernels[0], seq.kernels[0], seq.kernels[-1]
    roof = None if k.roofline is None else Roofline(
        count * k.roofline.compute_cycles, count * k.roofline.dram_cycles,
        count * k.roofline.spm_port_cycles)
    one = KernelResult(kernel=f"{k.kernel} x{count}", start_cycle=first.start_cycle,
                       end_cycle=last.end_cycle, compute_cycles=count * k.compute_cycles,
                       ii=k.ii, mii=k.mii, copies=k.copies, tiles=k.tiles * count,
                       roofline=roof)
    return dataclasses.replace(seq, kernels=(one,))


def _groups(parts: list[tuple[Hashable | None, Block, SimResult]]) -> list[SimResult]:
    """Consecutive runs of one memoised representative, each as one `_repeat`."""
    out: list[tuple[Hashable | None, SimResult, int]] = []
    for key, _, res in parts:
        if out and key is not None and out[-1][0] == key:
            out[-1] = (key, res, out[-1][2] + 1)
        else:
            out.append((key, res, 1))
    return [_repeat(res, count) for _, res, count in out]


def reloaded_bytes(res: SimResult) -> int:
    """Bytes of partial sums a run read back (`simulate_mapping(reload=...)`)."""
    return sum(n for kr in res.kernels for t in kr.tiles for b, kind, n in t.dram_transfers
               if b in PARTIAL_SUMS and kind == "read")


def moved_words(res: SimResult, buffer: str, word_bytes: int) -> int:
    """Words the DMA read of `buffer` in a run: the most any one kernel read (as the
    roofline's compulsory bytes count an operand the kernels read only in part)."""
    per = [sum(n for t in kr.tiles for b, kind, n in t.dram_transfers
               if b == buffer and kind == "read") for kr in res.kernels]
    return max(per, default=0) // word_bytes


def _summary(split: Split, parts: list[tuple[Hashable | None, Block, SimResult]]) -> str:
    seen: list[str] = []
    for _, _, r in parts:
        if r.mapping_summary not in seen:
            seen.append(r.mapping_summary)
    more = f"\n... and {len(seen) - 3} more sub-program mappings" if len(seen) > 3 else ""
    return f"split: {split.describe()}\n" + "\n".join(seen[:3]) + more


def _notes(runs: _Runs) -> tuple[str, ...]:
    split, arch = runs.split, runs.arch
    notes = [f"split (docs/conventions.md#tiling-any-problem-size): {split.describe()}, sizes "
             f"from the SPM's {arch.spm.capacity_words:,} words; {split.count:,} sub-programs "
             "run back to back, each reconfiguring the array"]
    if split.counts[1] > 1:
        reread = sum(reloaded_bytes(r) for _, _, r in runs.parts)
        notes.append(f"K panels: every panel after the first reads C's partial sums back from "
                     f"DRAM ({reread:,} B, in the DRAM traffic and time)")
    if split.streamed:
        notes.append("streamed: operands generated one M tile at a time from the seed (not "
                     "the values one whole-array generation gives); the host holds one tile")
    if runs.memoised:
        same = ("equal it bit for bit" if runs.model_error == 0 else
                f"differ from it by at most {runs.model_error:.3g} (where a copy's chunk of "
                "iterations ends inside an output's sum, the engine flushes it in two parts)")
        notes.append(f"timing memoised: {len(runs.memo):,} distinct sub-programs simulated, "
                     f"their cycles, bytes and energy counted for all {split.count:,} (same "
                     "shape and address pattern up to a base offset: same cycles); the other "
                     f"{runs.memoised:,} blocks' values computed in numpy with the kernel's "
                     "semantics (fp32, accumulated along k in order); the simulated ones' "
                     f"engine values {same}")
    notes.append(f"values checked tile by tile against a float64 numpy reference "
                 f"({runs.tiles:,} tiles of C)")
    if runs.output is None:
        notes.append(f"output not kept: C ({gib(split.m * split.n * 4)}) is larger than "
                     f"{gib(MAX_KEPT_OUTPUT_BYTES)}")
    return tuple(notes) + runs.work.notes


def _combine(runs: _Runs, t0: float) -> SimResult:
    work, arch = runs.work, runs.arch
    comp = work.compulsory
    macs, read, written = comp([(b, r) for _, b, r in runs.parts]) if callable(comp) else comp
    res = sequence_results(_groups(runs.parts), work.workload, runs.output, notes=_notes(runs),
                           mapping_summary=_summary(runs.split, runs.parts))
    return dataclasses.replace(res, roofline=floors(arch, macs, read, written),
                               values_match_reference=runs.ok, max_abs_error=runs.error,
                               wall_seconds=time.perf_counter() - t0)


def splits_k_and_n(arch: ArchSpec) -> bool:
    """Whether B is cut into K panels and N blocks when it does not fit: on a reconfigurable
    array; a systolic array's mapping folds any K and N itself (only M tiles apply there)."""
    return arch.pe_array.kind != PEKind.SYSTOLIC


__all__ = ["Block", "Split", "SplitWork", "check_limits", "choose_split", "fits_spm",
           "inorder_matmul", "inorder_spmm", "largest", "m_tile_rows", "moved_words", "run_split"]
