"""Dense GEMM on a systolic array (output-, weight-, input-stationary), both engines.

Dimension mapping and cycle convention follow SCALE-Sim 3.0.0 (`scalesim/compute/
systolic_compute_{os,ws,is}.py`; derivation in `benchmarks/scalesim/closed_form.py`):

====  =====  =====  ====
df    rows   cols   time
====  =====  =====  ====
os    M      N      K
ws    K      N      M
is    K      M      N
====  =====  =====  ====

Fill/drain convention. The work is cut into folds of at most R x C; a fold occupies the whole
array for its wavefront: ws/is first shift the stationary tile in (R cycles), then the skewed
operands enter, PE (r, c) performing its t-th MAC at cycle [R +] r + c + t, so a fold lasts
T + R + C - 2 cycles (os) or T + 2R + C - 2 (ws, is) — fill skew R - 1 + C - 1, T MAC steps,
output drain overlapped with the next fold's nothing: folds do not overlap, and a partial fold is
padded to the full array and charged fully (as SCALE-Sim does). The total is reported as
SCALE-Sim's "Total Cycles": the 0-based index of the last busy cycle, i.e. folds x per_fold - 1.

Values. Each output is accumulated in fp32 in increasing k: the product rounded to fp32, then
added. Partial sums of later k-folds start from the stored sum of the earlier ones, so the
order is the same in every dataflow and both engines agree bit for bit.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from dataflow.arch.spec import ArchSpec
from dataflow.mapper.mapping import SystolicMapping
from dataflow.pe_array.result import ArrayResult, TileResult

# Deferred imports: numba is imported in `_compiled_k_ordered`, for the products large enough
# that compiled code repays its start-up (`_use_numba`); smaller ones run in numpy.

#: seconds numba's start-up costs a process that has not loaded it: importing numba and loading
#: the cached machine code of `_matmul_k_ordered_loops` (2-core dev box; numpy alone is 0.1 s)
NUMBA_STARTUP_S = 0.9
#: seconds a MAC of numpy's k-ordered product takes (rank-1 updates; numba's loops: 0.2 ns)
NUMPY_SECONDS_PER_MAC = 2e-9
#: once numba is loaded, products of more MACs than this run in it (below, numpy's few calls
#: cost less than a compiled call's dispatch)
NUMPY_MAX_MACS = 1 << 12
#: numpy seconds spent on products in this process, and whether numba is loaded
_SPENT = {"numpy_s": 0.0, "numba": False}


def systolic_dims(dataflow: str, m: int, n: int, k: int) -> tuple[int, int, int]:
    """(Sr, Sc, T): GEMM extents mapped to array rows, array columns and time."""
    return {"os": (m, n, k), "ws": (k, n, m), "is": (k, m, n)}[dataflow]


def fold_cycles(dataflow: str, rows: int, cols: int, t: int) -> int:
    preload = 0 if dataflow == "os" else rows
    return preload + (rows - 1) + (cols - 1) + t


def folds(sm: SystolicMapping):
    """Folds in SCALE-Sim's order (column folds outer, row folds inner):
    (row_lo, row_hi, col_lo, col_hi) over the Sr x Sc plane."""
    sr, sc, _ = systolic_dims(sm.dataflow, sm.m, sm.n, sm.k)
    for c0 in range(0, sc, sm.cols):
        for r0 in range(0, sr, sm.rows):
            yield r0, min(r0 + sm.rows, sr), c0, min(c0 + sm.cols, sc)


def closed_form_cycles(dataflow: str, m: int, n: int, k: int, rows: int, cols: int) -> int:
    """SCALE-Sim-convention compute cycles (0-based index of the last cycle)."""
    sr, sc, t = systolic_dims(dataflow, m, n, k)
    nf = math.ceil(sr / rows) * math.ceil(sc / cols)
    return nf * fold_cycles(dataflow, rows, cols, t) - 1


def _fold_traffic(sm: SystolicMapping, r0, r1, c0, c1, wb) -> tuple[int, int]:
    """Bytes a fold reads (its operand tiles) and writes (its outputs) from/to DRAM."""
    t = systolic_dims(sm.dataflow, sm.m, sm.n, sm.k)[2]
    rr, cc = r1 - r0, c1 - c0
    if sm.dataflow == "os":  # A rows x K, K x B cols; outputs rr x cc
        return (rr * t + t * cc) * wb, rr * cc * wb
    # ws: weights K-tile x N-tile (rr x cc), inputs M x rr; outputs M x cc partial sums
    # is: inputs  K-tile x M-tile (rr x cc), weights rr x N; outputs cc x N partial sums
    return (rr * cc + t * rr) * wb, t * cc * wb


def _tiles(sm: SystolicMapping, arch: ArchSpec, per_fold: int) -> tuple[TileResult, ...]:
    out = []
    for i, (r0, r1, c0, c1) in enumerate(folds(sm)):
        rd, wr = _fold_traffic(sm, r0, r1, c0, c1, arch.word_bytes)
        out.append(TileResult(sm.kernel.name, i, (r1 - r0) * (c1 - c0), per_fold, 0, rd, wr))
    return tuple(out)


def _busy(sm: SystolicMapping, t: int) -> np.ndarray:
    busy = np.zeros((sm.rows, sm.cols), dtype=np.int64)
    for r0, r1, c0, c1 in folds(sm):
        busy[: r1 - r0, : c1 - c0] += t
    return busy


def _operands(sm: SystolicMapping, inputs):
    a = inputs["A"].reshape(sm.m, sm.k)
    b = inputs["B"].reshape(sm.k, sm.n)
    return a, b


def _matmul_k_ordered_loops(a, b, out):  # pragma: no cover - compiled by numba
    m, k = a.shape
    n = b.shape[1]
    for i in range(m):
        for kk in range(k):
            aik = a[i, kk]
            for j in range(n):
                out[i, j] = out[i, j] + np.float32(aik * b[kk, j])


@functools.cache
def _compiled_k_ordered():
    import numba

    return numba.njit(cache=True)(_matmul_k_ordered_loops)


def _use_numba(macs: int) -> bool:
    """Whether a product of `macs` MACs runs in numba. Once numba is loaded, above
    NUMPY_MAX_MACS. Before, only when numpy's time for this product and the earlier ones would
    exceed numba's start-up (renting numpy until the rent paid reaches the price of numba:
    a one-off 512^3 product stays in numpy, 0.25 s; 1024^3, or a sweep of 512^3 ones from its
    fourth, loads numba, 0.2 s a product after the 0.9 s once)."""
    if _SPENT["numba"] or "numba" in sys.modules:  # loaded (here, or by the fast engine)
        return macs > NUMPY_MAX_MACS
    return _SPENT["numpy_s"] + macs * NUMPY_SECONDS_PER_MAC > NUMBA_STARTUP_S


def _matmul_k_ordered(a, b, out) -> None:
    """out += a @ b in fp32 (contiguous float32 arrays), each product rounded to fp32 and then
    added in increasing k: numpy's rank-1 updates (a multiply, then an add, per k), or numba's
    loops (`_use_numba`), with the same values."""
    m, k = a.shape
    if _use_numba(m * k * b.shape[1]):
        _compiled_k_ordered()(a, b, out)
        _SPENT["numba"] = True
        return
    t0 = time.perf_counter()
    _numpy_k_ordered(a, b, out)
    _SPENT["numpy_s"] += time.perf_counter() - t0


#: the k-ordered fp32 product for other modules (`plan.split.inorder_matmul`)
matmul_k_ordered = _matmul_k_ordered


def _numpy_k_ordered(a, b, out) -> None:
    """`_matmul_k_ordered` in numpy: a multiply, then an add, per k."""
    product = np.empty_like(out)
    for kk in range(a.shape[1]):
        np.multiply(a[:, kk, None], b[kk], out=product)
        out += product


def _result(sm, arch, out, busy, spm_reads, spm_writes, trace=None) -> ArrayResult:
    t = systolic_dims(sm.dataflow, sm.m, sm.n, sm.k)[2]
    per_fold = fold_cycles(sm.dataflow, sm.rows, sm.cols, t)
    macs = sm.m * sm.n * sm.k
    lines = arch.spm.lines
    return ArrayResult(
        kernel=sm.kernel.name, tiles=_tiles(sm, arch, per_fold), pe_busy_cycles=busy,
        spm_reads_per_line=np.array(spm_reads + [0] * (lines - len(spm_reads)))[:lines],
        spm_writes_per_line=np.array(spm_writes + [0] * (lines - len(spm_writes)))[:lines],
        spm_conflicts_per_line=np.zeros(lines, dtype=np.int64),
        op_counts=(("mac", macs),), link_word_hops=0, macs=macs,
        outputs=(("C", out.ravel()),), trace=trace)


def _sram_accesses(sm: SystolicMapping) -> tuple[list[int], list[int]]:
    """Word reads of (ifmap, filter) SRAMs and word writes of the ofmap SRAM, per SCALE-Sim's
    demand matrices: every operand element is read once per fold that uses it."""
    t = systolic_dims(sm.dataflow, sm.m, sm.n, sm.k)[2]
    reads_if = reads_f = writes_o = 0
    for r0, r1, c0, c1 in folds(sm):
        rr, cc = r1 - r0, c1 - c0
        if sm.dataflow == "os":
            reads_if += rr * t
            reads_f += t * cc
            writes_o += rr * cc
        elif sm.dataflow == "ws":
            reads_f += rr * cc
            reads_if += t * rr
            writes_o += t * cc
        else:
            reads_if += rr * cc
            reads_f += t * rr
            writes_o += t * cc
    return [reads_if, reads_f, 0], [0, 0, writes_o]


def run_systolic_fast(sm: SystolicMapping, arch: ArchSpec, inputs,
                      values: bool = True) -> ArrayResult:
    """Closed-form timing, numpy or numba values (fp32, k-ordered); `values=False` skips the
    values (the output stays zero): the timing does not depend on them."""
    out = np.zeros((sm.m, sm.n), dtype=np.float32)
    if values:
        a, b = _operands(sm, inputs)
        _matmul_k_ordered(np.ascontiguousarray(a, np.float32),
                          np.ascontiguousarray(b, np.float32), out)
    _, _, t = systolic_dims(sm.dataflow, sm.m, sm.n, sm.k)
    reads, writes = _sram_accesses(sm)
    return _result(sm, arch, out, _busy(sm, t), reads, writes)


def run_systolic_reference(sm: SystolicMapping, arch: ArchSpec, inputs) -> ArrayResult:
    """Cycle-by-cycle wavefront on the physical R x C array (padded folds), moving operands
    one PE per cycle; returns the cycle count it observes, with the values."""
    a, b = _operands(sm, inputs)
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    out = np.zeros((sm.m, sm.n), dtype=np.float32)
    busy = np.zeros((sm.rows, sm.cols), dtype=np.int64)
    counts = _SramCounts()
    observed = [_step_fold(sm, a, b, fold, out, busy, counts) for fold in folds(sm)]
    total = sum(observed) - 1
    expected = closed_form_cycles(sm.dataflow, sm.m, sm.n, sm.k, sm.rows, sm.cols)
    if total != expected:  # the stepper is the definition the closed form must equal
        raise AssertionError(f"systolic stepper observed {total} cycles, closed form {expected}")
    return _result(sm, arch, out, busy, [counts.reads_if, counts.reads_f, 0],
                   [0, 0, counts.writes_o])


@dataclass
class _SramCounts:
    """Word accesses the stepper observes: ifmap and filter SRAM reads, ofmap SRAM writes."""

    reads_if: int = 0
    reads_f: int = 0
    writes_o: int = 0


@dataclass
class _Wires:
    """The moving operand registers of every PE, R x C each: values moving right (west to
    east) with their valid flag, stream index and token-present flag (a bubble on a padded
    row is present but not valid), and values moving down (north to south, os only)."""

    h_val: np.ndarray
    h_ok: np.ndarray
    h_t: np.ndarray
    h_present: np.ndarray
    v_val: np.ndarray
    v_ok: np.ndarray


def _empty_wires(rows: int, cols: int) -> _Wires:
    shape = (rows, cols)
    return _Wires(np.zeros(shape, np.float32), np.zeros(shape, bool), np.zeros(shape, np.int64),
                  np.zeros(shape, bool), np.zeros(shape, np.float32), np.zeros(shape, bool))


def _step_fold(sm: SystolicMapping, a, b, fold, out, busy, counts: _SramCounts) -> int:
    """Step one fold (row_lo, row_hi, col_lo, col_hi) to its end, accumulating into `out`,
    `busy` and `counts`; the cycles it took."""
    r0, r1, c0, c1 = fold
    R, C = sm.rows, sm.cols
    _, _, T = systolic_dims(sm.dataflow, sm.m, sm.n, sm.k)
    wires = _empty_wires(R, C)
    stationary = _preload_stationary(sm, a, b, fold, counts)
    preload = 0 if sm.dataflow == "os" else R
    cyc = preload
    acc = np.zeros((R, C), np.float32)  # os: outputs live in the PEs
    while True:
        _shift_wires(sm, wires)
        _feed_edges(sm, a, b, fold, wires, cyc - preload, T, counts)
        _mac_step(sm, fold, wires, stationary, acc, out, busy, counts)
        cyc += 1
        # the fold ends when the last token of the bottom row has reached the last column
        if wires.h_present[R - 1, C - 1] and wires.h_t[R - 1, C - 1] == T - 1:
            break
    if sm.dataflow == "os":
        out[r0:r1, c0:c1] += acc[: r1 - r0, : c1 - c0]
        counts.writes_o += (r1 - r0) * (c1 - c0)
    return cyc


def _preload_stationary(sm: SystolicMapping, a, b, fold, counts: _SramCounts) -> np.ndarray:
    """ws/is: the stationary tile shifts in from the top, one row per cycle (R cycles; none
    for os)."""
    r0, r1, c0, c1 = fold
    R, C = sm.rows, sm.cols
    preload = 0 if sm.dataflow == "os" else R
    stationary = np.zeros((R, C), np.float32)
    for step in range(preload):
        stationary[1:] = stationary[:-1].copy()
        src_row = R - 1 - step  # the bottom row enters first
        stationary[0] = 0
        for c in range(C):
            rr, cc = r0 + src_row, c0 + c
            if rr < r1 and cc < c1:
                stationary[0, c] = _stationary_elem(sm, a, b, rr, cc)
                counts.reads_f += sm.dataflow == "ws"
                counts.reads_if += sm.dataflow == "is"
    return stationary


def _shift_wires(sm: SystolicMapping, w: _Wires) -> None:
    """Move the operands one hop: right, and (os) down."""
    for reg in (w.h_val, w.h_ok, w.h_t, w.h_present):
        reg[:, 1:] = reg[:, :-1].copy()
    if sm.dataflow == "os":
        w.v_val[1:], w.v_ok[1:] = w.v_val[:-1].copy(), w.v_ok[:-1].copy()


def _feed_edges(sm: SystolicMapping, a, b, fold, w: _Wires, s: int, T: int,
                counts: _SramCounts) -> None:
    """Feed the west edge (and the north edge for os) at stream step s, skewed by row
    (column)."""
    r0, r1, c0, c1 = fold
    for r in range(sm.rows):
        t = s - r
        # every row carries a token (a bubble on padded rows) so the wavefront's exit
        # from the padded array is observed, not assumed
        w.h_present[r, 0] = 0 <= t < T
        w.h_t[r, 0] = t
        w.h_ok[r, 0] = 0 <= t < T and r0 + r < r1
        if w.h_ok[r, 0]:
            w.h_val[r, 0] = _streamed_elem(sm, a, b, r0 + r, t)
            counts.reads_if += sm.dataflow != "is"
            counts.reads_f += sm.dataflow == "is"
    if sm.dataflow == "os":
        for c in range(sm.cols):
            t = s - c
            w.v_ok[0, c] = 0 <= t < T and c0 + c < c1
            if w.v_ok[0, c]:
                w.v_val[0, c] = b[t, c0 + c]
                counts.reads_f += 1


def _mac_step(sm: SystolicMapping, fold, w: _Wires, stationary, acc, out, busy,
              counts: _SramCounts) -> None:
    """Every PE with both operands does one MAC: os into its own accumulator, ws/is into the
    output its stream element and column reduce to (down column c in r order)."""
    r0, r1, c0, c1 = fold
    for r in range(sm.rows):
        for c in range(sm.cols):
            if sm.dataflow == "os":
                if w.h_ok[r, c] and w.v_ok[r, c]:
                    acc[r, c] = acc[r, c] + np.float32(w.h_val[r, c] * w.v_val[r, c])
                    busy[r, c] += 1
            elif w.h_ok[r, c] and r0 + r < r1 and c0 + c < c1:
                t = int(w.h_t[r, c])
                i, j = _output_of(sm, t, c0 + c)
                out[i, j] = out[i, j] + np.float32(w.h_val[r, c] * stationary[r, c])
                busy[r, c] += 1
                if r == r1 - r0 - 1:
                    counts.writes_o += 1


def _stationary_elem(sm, a, b, rr, cc):
    # ws: filter[K-row rr, N-col cc] ; is: ifmap^T[K-row rr, M-col cc]
    return b[rr, cc] if sm.dataflow == "ws" else a[cc, rr]


def _streamed_elem(sm, a, b, rr, t):
    # os: A[m=rr, k=t]; ws: A[m=t, k=rr]; is: B[k=rr, n=t]
    if sm.dataflow == "os":
        return a[rr, t]
    if sm.dataflow == "ws":
        return a[t, rr]
    return b[rr, t]


def _output_of(sm, t, col):
    # ws: output (m=t, n=col); is: output (m=col, n=t)
    return (t, col) if sm.dataflow == "ws" else (col, t)
