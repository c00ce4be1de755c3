"""SCALE-Sim 3.0.0's demand side of a systolic GEMM (`compute/systolic_compute_{os,ws,is}.py`):
what each SRAM is asked for, line by line, for the memory model (`systolic_memory`).

Per word: the fetch order of the ifmap and filter SRAMs (per fold of the fetched operand,
unrolled along anti-diagonals where the demand is skewed) and the (line, address) of every
demanded word (one line per cycle; folds column-folds outer, row-folds inner, each padded to the
whole array and skewed) -- what a read SRAM that refetches needs. In closed form: the sizes of
the fetch orders and the ofmap words written at each line, which is all the model needs when no
read SRAM refetches (the usual case: the operands fit their active halves), so large GEMMs cost
no per-word arrays (issue 14; tests/test_scalesim_memory.py checks the two agree).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dataflow.mapper.mapping import SystolicMapping


def _folded(mat: np.ndarray, width: int) -> np.ndarray:
    """Columns cut into folds of `width` (the last padded with -1), stacked vertically."""
    rows, cols = mat.shape
    nf = math.ceil(cols / width)
    pad = np.full((rows, nf * width), -1, dtype=np.int64)
    pad[:, :cols] = mat
    return pad.reshape(rows, nf, width).transpose(1, 0, 2).reshape(nf * rows, width)


def _anti_diagonal(mat: np.ndarray) -> np.ndarray:
    """Elements along anti-diagonals, each from its lowest column up (create_*_prefetch_mat)."""
    r, c = np.indices(mat.shape)
    return mat.ravel()[np.lexsort((c.ravel(), (r + c).ravel()))]


def _operands(sm: SystolicMapping, ifmap_addresses=None):
    m, n, k = sm.m, sm.n, sm.k
    ifmap = np.arange(m * k, dtype=np.int64).reshape(m, k)
    if ifmap_addresses is not None:
        ifmap = np.asarray(ifmap_addresses, dtype=np.int64).reshape(m, k)
    filt = np.arange(k * n, dtype=np.int64).reshape(k, n)
    ofmap = np.arange(m * n, dtype=np.int64).reshape(m, n)
    return ifmap, filt, ofmap


def prefetch_orders(sm: SystolicMapping, ifmap_addresses=None):
    """Fetch order (addresses, -1 for padding) of the ifmap and filter SRAMs."""
    ifmap, filt, _ = _operands(sm, ifmap_addresses)
    R, C = sm.rows, sm.cols
    if sm.dataflow == "os":
        return _anti_diagonal(_folded(ifmap.T, R)), _anti_diagonal(_folded(filt, C))
    if sm.dataflow == "ws":
        return _anti_diagonal(_folded(ifmap, R)), _folded(filt, C).ravel()
    return _folded(ifmap.T, C).ravel(), _anti_diagonal(_folded(filt.T, R))


def fold_grid(sr: int, sc: int, R: int, C: int):
    """(row offset, column offset, fold index) of every fold: column folds outer."""
    for fc, c0 in enumerate(range(0, sc, C)):
        for fr, r0 in enumerate(range(0, sr, R)):
            yield r0, c0, fc * math.ceil(sr / R) + fr


def demand(sm: SystolicMapping, ifmap_addresses=None):
    """Per operand (ifmap, filter, ofmap): (line, address) of every demanded word in
    SCALE-Sim's service order (line by line, columns in order), and the number of lines."""
    ifmap, filt, ofmap = _operands(sm, ifmap_addresses)
    R, C = sm.rows, sm.cols
    df = sm.dataflow
    if df == "os":
        sr, sc, T = sm.m, sm.n, sm.k
        per_fold = T + R + C - 2
        streams = {"if": (ifmap.T, "rows", 0), "f": (filt, "cols", 0)}
    else:
        sr, sc, T = (sm.k, sm.n, sm.m) if df == "ws" else (sm.k, sm.m, sm.n)
        per_fold = T + 2 * R + C - 2
        x, z, o = (ifmap, filt, ofmap) if df == "ws" else (filt.T, ifmap.T, ofmap.T)
    parts: dict[str, list] = {"if": [], "f": [], "of": []}
    for r0, c0, f in fold_grid(sr, sc, R, C):
        base = f * per_fold
        rr, cc = min(R, sr - r0), min(C, sc - c0)
        t = np.arange(T)[:, None]
        r, c = np.arange(rr)[None, :], np.arange(cc)[None, :]
        if df == "os":
            for key, (mat, along, _) in streams.items():
                lo, width = (r0, rr) if along == "rows" else (c0, cc)
                col = np.arange(width)[None, :]
                parts[key].append(((base + t + col).ravel(), np.broadcast_to(col, (T, width))
                                   .ravel(), mat[:, lo:lo + width].ravel()))
            ri, ci = np.indices((rr, cc))
            parts["of"].append(((base + T - 1 + R - 1 - ri + ci).ravel(), ci.ravel(),
                                ofmap[r0:r0 + rr, c0:c0 + cc].ravel()))
            continue
        xk, zk = ("if", "f") if df == "ws" else ("f", "if")
        parts[xk].append(((base + R + t + r).ravel(), np.broadcast_to(r, (T, rr)).ravel(),
                          x[:, r0:r0 + rr].ravel()))
        ri, ci = np.indices((rr, cc))
        parts[zk].append(((base + R - 1 - ri).ravel(), ci.ravel(),
                          z[r0:r0 + rr, c0:c0 + cc].ravel()))
        parts["of"].append(((base + 2 * R - 1 + t + c).ravel(), np.broadcast_to(c, (T, cc))
                            .ravel(), o[:, c0:c0 + cc].ravel()))
    lines = math.ceil(sr / R) * math.ceil(sc / C) * per_fold
    out = []
    for key in ("if", "f", "of"):
        line, col, addr = (np.concatenate(a) for a in zip(*parts[key]))
        order = np.lexsort((col, line))
        keep = addr[order] >= 0  # SCALE-Sim skips address -1 (a window over the edge)
        out.append((line[order][keep], addr[order][keep]))
    return out, lines


def read_demand(sm: SystolicMapping, operand: int, ifmap_addresses=None):
    """`demand`'s (lines, addresses) of the ifmap (`operand` 0) or the filter SRAM (1), fold by
    fold: the same words in the same order (folds follow each other in time), generated from
    the fold's block of the operand -- read along its anti-diagonals where the demand is skewed
    -- instead of sorting every word of the run at once."""
    ifmap, filt, _ = _operands(sm, ifmap_addresses)
    sr, sc, t, per_fold = geometry(sm)
    R = sm.rows
    if sm.dataflow == "os":  # ifmap rows along the array rows, filter columns along its columns
        mat, skewed_by_rows = (ifmap.T, True) if operand == 0 else (filt, False)
    else:
        x, z = (ifmap, filt) if sm.dataflow == "ws" else (filt.T, ifmap.T)
        streamed = (operand == 0) == (sm.dataflow == "ws")
    for r0, c0, f in fold_grid(sr, sc, R, sm.cols):
        base = f * per_fold
        rr, cc = min(R, sr - r0), min(sm.cols, sc - c0)
        if sm.dataflow == "os":
            lo, width = (r0, rr) if skewed_by_rows else (c0, cc)
            lines, addr = _skewed(mat[:, lo:lo + width], base)
        elif streamed:
            lines, addr = _skewed(x[:, r0:r0 + rr], base + R)
        else:  # the stationary tile, bottom row first
            addr = z[r0:r0 + rr, c0:c0 + cc][::-1].ravel()
            lines = np.repeat(base + R - rr + np.arange(rr), cc)
        keep = addr >= 0  # SCALE-Sim skips address -1 (a window over the edge)
        yield lines[keep], addr[keep]


def _skewed(block: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
    """A T x w block streamed with a skew of one line per column: element (t, c) at line
    first + t + c, each line's elements in column order."""
    perm, offsets = _skew_order(*block.shape)
    return first + offsets, block.ravel()[perm]


@functools.cache
def _skew_order(t: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """(flat index, line offset) of a t x w block's elements along its anti-diagonals."""
    r, c = np.indices((t, w))
    perm = np.lexsort((c.ravel(), (r + c).ravel()))
    return perm, np.repeat(np.arange(t + w - 1), diagonal_counts(t, w))


# ---- in closed form ----

def fetch_sizes(sm: SystolicMapping) -> tuple[int, int]:
    """Entries (padding included) of the ifmap and filter fetch orders (`prefetch_orders`)."""
    m, n, k, R, C = sm.m, sm.n, sm.k, sm.rows, sm.cols
    if sm.dataflow == "os":
        return -(-m // R) * R * k, -(-n // C) * C * k
    if sm.dataflow == "ws":
        return -(-k // R) * R * m, -(-n // C) * C * k
    return -(-m // C) * C * k, -(-k // R) * R * n


def diagonal_counts(p: int, q: int) -> np.ndarray:
    """How many (i, j), 0 <= i < p, 0 <= j < q, have i + j = s, for s = 0 .. p + q - 2."""
    s = np.arange(p + q - 1)
    return np.minimum(np.minimum(s + 1, p + q - 1 - s), min(p, q))


def geometry(sm: SystolicMapping) -> tuple[int, int, int, int]:
    """(Sr, Sc, T, cycles per fold) of SCALE-Sim's demand matrices."""
    R, C = sm.rows, sm.cols
    if sm.dataflow == "os":
        return sm.m, sm.n, sm.k, sm.k + R + C - 2
    sr, sc, t = (sm.k, sm.n, sm.m) if sm.dataflow == "ws" else (sm.k, sm.m, sm.n)
    return sr, sc, t, t + 2 * R + C - 2


def fold_groups(extent: int, size: int) -> list[tuple[slice, int]]:
    """`extent` cut into folds of `size`: (folds, their size) of the full ones and of the short
    last one."""
    n = -(-extent // size)
    last = extent - (n - 1) * size
    return [(slice(0, n), size)] if last == size else [(slice(0, n - 1), size),
                                                        (slice(n - 1, n), last)]


def write_counts(sm: SystolicMapping) -> np.ndarray:
    """ofmap words written at each demand line: the outputs of `demand`'s ofmap, counted in
    closed form. A fold writes along the anti-diagonals of its skewed wavefront: os its rr x cc
    outputs from line T + R - 1 - rr on, ws / is its T x cc partial sums from line 2R - 1 on;
    folds of one shape (at most four: full, short in rows, in columns, in both) alike."""
    sr, sc, t, per_fold = geometry(sm)
    R, C = sm.rows, sm.cols
    out = np.zeros((-(-sc // C), -(-sr // R), per_fold), np.int64)  # column folds outer
    for fr, rr in fold_groups(sr, R):
        for fc, cc in fold_groups(sc, C):
            p, first = (rr, t + R - 1 - rr) if sm.dataflow == "os" else (t, 2 * R - 1)
            out[fc, fr, first:first + p + cc - 1] += diagonal_counts(p, cc)
    return out.reshape(-1)
