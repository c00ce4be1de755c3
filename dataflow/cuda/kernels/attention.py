"""Sparse attention over a CSR pattern: out[i] = sum_p softmax_p(scale * q[i] . k[j_p]) v[j_p]
over the stored entries p = (i, j_p) of row i (a row with no entries gives zeros); q and k are
(., d), v is (., dv).

Special values (docs/conventions.md): every maximum propagates NaN (a plain max, fmaxf on the
GPU, would drop it), so a NaN or inf - inf score makes its row NaN as in the numpy reference.

Unfused: `sparse.sddmm_csr` (scores, mask values = scale) -> `csr_row_softmax` -> `sparse.spmm_csr`.
Fused (`attention_fused`): one block of ATT_THREADS threads per query row, walking the row's
entries in chunks of ATT_CHUNK held in shared memory with an online (running-max) softmax, so
scores and probabilities never go to DRAM; each thread owns output columns t, t + ATT_THREADS,
... whose accumulators stay in shared memory (dv up to ATT_MAX_DIM).
For a (dilated) sliding window the fused kernel computes each row's keys (i + t * dilation)
instead of reading them from crd: no index traffic at all.
"""

from __future__ import annotations

import math

from numba import cuda, float32

ATT_THREADS = 32   # one warp per query row (a power of two: the reductions halve it)
ATT_CHUNK = 64     # stored entries scored per step
ATT_MAX_DIM = 256  # head dimension the fused kernel's accumulators hold
SOFTMAX_BLOCK = 128


def csr_row_softmax(pos, scores, probs, m):
    """probs[p] = exp(scores[p] - max_row) / sum_row, one thread per row."""
    i = cuda.grid(1)
    if i < m:
        lo = pos[i]
        hi = pos[i + 1]
        mx = float32(-math.inf)
        for p in range(lo, hi):
            sc = scores[p]
            mx = mx + sc if mx != mx or sc != sc else max(mx, sc)
        total = float32(0.0)
        for p in range(lo, hi):
            e = math.exp(scores[p] - mx)
            probs[p] = e
            total += e
        for p in range(lo, hi):
            probs[p] = probs[p] / total


def attention_fused(q, k, v, pos, crd, out, scale, d, dv, window, dilation):  # noqa: C901
    """`window` < 0: the keys of row i are crd[pos[i]:pos[i + 1]] (any CSR pattern).
    `window` >= 0: a (dilated) sliding window, keys j = i + t * dilation for |t| <= window
    inside [0, seq): computed, no index arrays read (the GPU analogue of an affine DIA
    lowering; pos and crd are then unused)."""
    s = cuda.shared.array(ATT_CHUNK, float32)
    acc = cuda.shared.array(ATT_MAX_DIM, float32)
    red = cuda.shared.array(ATT_THREADS, float32)
    stat = cuda.shared.array(2, float32)  # running max, running sum of exponentials
    i = cuda.blockIdx.x
    t = cuda.threadIdx.x
    for j in range(t, dv, ATT_THREADS):
        acc[j] = float32(0.0)
    if t == 0:
        stat[0] = float32(-math.inf)
        stat[1] = float32(0.0)
    cuda.syncthreads()
    if window < 0:
        lo = pos[i]
        hi = pos[i + 1]
    else:  # t in [lo, hi): the window's steps that stay inside the sequence
        lo = -min(window, i // dilation)
        hi = min(window, (k.shape[0] - 1 - i) // dilation) + 1
    for c0 in range(lo, hi, ATT_CHUNK):
        cn = min(ATT_CHUNK, hi - c0)
        # scores of this chunk, and each thread's partial max
        mx = float32(-math.inf)
        for e in range(t, cn, ATT_THREADS):
            kr = crd[c0 + e] if window < 0 else i + (c0 + e) * dilation
            dot = float32(0.0)
            for x in range(d):
                dot += q[i, x] * k[kr, x]
            sc = dot * scale
            s[e] = sc
            mx = mx + sc if mx != mx or sc != sc else max(mx, sc)
        red[t] = mx
        cuda.syncthreads()
        half = ATT_THREADS // 2
        while half > 0:
            if t < half:
                a = red[t]
                b = red[t + half]
                red[t] = a + b if a != a or b != b else max(a, b)
            cuda.syncthreads()
            half //= 2
        old_max = stat[0]
        b = red[0]
        new_max = old_max + b if old_max != old_max or b != b else max(old_max, b)
        # while every score so far is -inf, exponentiate against 0 (all weights 0, not the
        # NaN of -inf - -inf), so a later finite chunk is not poisoned; an all -inf row ends
        # with total 0 and its output 0 / 0 = NaN, as in the reference
        ref = new_max if new_max != -math.inf else float32(0.0)
        corr = math.exp(old_max - ref)
        cuda.syncthreads()  # everyone has read red[0] and stat[0]
        part = float32(0.0)
        for e in range(t, cn, ATT_THREADS):
            w = math.exp(s[e] - ref)
            s[e] = w
            part += w
        red[t] = part
        cuda.syncthreads()
        half = ATT_THREADS // 2
        while half > 0:
            if t < half:
                red[t] += red[t + half]
            cuda.syncthreads()
            half //= 2
        for j in range(t, dv, ATT_THREADS):
            a = acc[j] * corr
            for e in range(cn):
                kr = crd[c0 + e] if window < 0 else i + (c0 + e) * dilation
                a += s[e] * v[kr, j]
            acc[j] = a
        cuda.syncthreads()  # all of s and red[0] used before thread 0 moves the statistics
        if t == 0:
            stat[1] = stat[1] * corr + red[0]
            stat[0] = new_max
        cuda.syncthreads()
    total = stat[1]
    for j in range(t, dv, ATT_THREADS):
        if hi > lo:  # a row with entries: a NaN total stays NaN
            out[i, j] = acc[j] / total
        else:
            out[i, j] = float32(0.0)
