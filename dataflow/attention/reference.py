"""The numpy definition of masked softmax attention (the reference every backend is checked
against)."""

from __future__ import annotations

import math

import numpy as np


def attention_reference(q, k, v, pos: np.ndarray, crd: np.ndarray,
                        rows_per_block: int = 256) -> np.ndarray:
    """Dense masked attention in numpy (float64): softmax(mask(Q K^T / sqrt(d))) V, with masked
    scores at -inf; a row with no attended key gives zeros. Returns float32 (m x dv).

    Computed `rows_per_block` query rows at a time, so memory stays O(rows_per_block * n)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    m, n = q.shape[0], k.shape[0]
    out = np.zeros((m, v.shape[1]), dtype=np.float32)
    scale = 1.0 / math.sqrt(q.shape[1])
    for lo in range(0, m, rows_per_block):
        hi = min(m, lo + rows_per_block)
        dense = np.zeros((hi - lo, n), dtype=bool)
        dense[np.repeat(np.arange(hi - lo), np.diff(pos[lo:hi + 1])), crd[pos[lo]:pos[hi]]] = True
        s = np.where(dense, q[lo:hi] @ k.T * scale, -np.inf)
        s[~dense.any(axis=1)] = 0.0
        e = np.where(dense, np.exp(s - s.max(axis=1, keepdims=True)), 0.0)
        den = e.sum(axis=1, keepdims=True)
        p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
        out[lo:hi] = p @ v
    return out
