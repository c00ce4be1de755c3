"""The numpy definition of masked softmax attention (the reference every backend is checked
against)."""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp


def attention_reference(q, k, v, pos: np.ndarray, crd: np.ndarray,
                        rows_per_block: int = 256) -> np.ndarray:
    """Masked attention in numpy (float64): softmax(mask(Q K^T / sqrt(d))) V over the stored
    entries of the CSR mask (pos, crd); a row with no attended key gives zeros. Returns float32
    (m x dv).

    Special values follow docs/conventions.md: only attended pairs are computed, so a NaN or
    inf in q, k or v reaches exactly the rows that attend it; there it propagates as IEEE
    arithmetic does (a NaN score, or an inf score, since inf - inf is NaN, makes the whole row
    NaN). Computed `rows_per_block` query rows at a time, so memory stays
    O(rows_per_block * (n + d)). A block whose mask is at least `DENSE_BLOCK` full takes its
    scores from the block's dense Q K^T (BLAS; each score still one float64 dot product of the
    same pair, only attended pairs kept) and, when V is finite, multiplies the dense P by V
    (unattended zeros times a finite V add nothing); a sparser one gathers the pairs."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    pos, crd = np.asarray(pos, np.int64), np.asarray(crd, np.int64)
    m, n = q.shape[0], k.shape[0]
    out = np.zeros((m, v.shape[1]), dtype=np.float32)
    scale = 1.0 / math.sqrt(q.shape[1])
    finite_v = bool(np.isfinite(v).all())
    for lo in range(0, m, rows_per_block):
        hi = min(m, lo + rows_per_block)
        rows = np.repeat(np.arange(hi - lo), np.diff(pos[lo:hi + 1]))
        cols = crd[pos[lo]:pos[hi]]
        dense = len(cols) >= DENSE_BLOCK * (hi - lo) * n
        if dense:
            s = (q[lo:hi] @ k.T)[rows, cols] * scale
        else:
            s = _pair_dots(q, k, lo + rows, cols) * scale
        mx = np.full(hi - lo, -np.inf)
        np.maximum.at(mx, rows, s)  # np.maximum propagates NaN, as the engines' max does
        with np.errstate(invalid="ignore"):  # inf - inf: NaN by the rule
            e = np.exp(s - mx[rows])
        den = np.bincount(rows, weights=e, minlength=hi - lo)
        p = e / den[rows]
        if dense and finite_v:  # 0 * inf would reach rows that do not attend it
            full = np.zeros((hi - lo, n))
            full[rows, cols] = p
            out[lo:hi] = full @ v
        else:
            local = pos[lo:hi + 1] - pos[lo]
            out[lo:hi] = sp.csr_matrix((p, cols, local), shape=(hi - lo, n)) @ v
    return out


#: fraction of a block's (rows x keys) pairs attended from which `attention_reference` uses
#: dense products (a dense or causal mask; a window at seq 512 stays gathered)
DENSE_BLOCK = 0.25


#: attended pairs gathered at a time by `_pair_dots`
PAIRS_PER_CHUNK = 512


def _pair_dots(q, k, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """q[rows[p]] . k[cols[p]] for every pair p, `PAIRS_PER_CHUNK` pairs gathered at a time:
    each dot product is einsum's over one pair, so the chunking changes no bit, while the
    gathered rows stay small temporaries (a whole block's gathered rows, a few MB, cost
    their fresh pages' faults on every call)."""
    out = np.empty(len(rows))
    for at in range(0, len(rows), PAIRS_PER_CHUNK):
        end = at + PAIRS_PER_CHUNK
        out[at:end] = np.einsum("pd,pd->p", q[rows[at:end]], k[cols[at:end]])
    return out
