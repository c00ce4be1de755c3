"""numpy definitions of the ops the CUDA kernels compute (float64 inside, fp32 or complex64 out).

These are the definitions the kernels are tested against. Where another package already owns
an op's reference (dense and CSR matmul, SDDMM in `dataflow.ust_frontend.ops`) the tests use
that one too; the functions here are written from the math of the sources in docs/references.md.
"""

from __future__ import annotations

import numpy as np

from dataflow.errors import UserError


def csr_to_dense(pos, crd, val, shape) -> np.ndarray:
    out = np.zeros(shape, np.float64)
    rows = np.repeat(np.arange(shape[0]), np.diff(pos))
    np.add.at(out, (rows, np.asarray(crd, np.intp)), np.asarray(val, np.float64))
    return out


def gemm(a, b) -> np.ndarray:
    return (np.asarray(a, np.float64) @ np.asarray(b, np.float64)).astype(np.float32)


def spmm(pos, crd, val, shape, b) -> np.ndarray:
    return (csr_to_dense(pos, crd, val, shape) @ np.asarray(b, np.float64)).astype(np.float32)


def sddmm(a, b, pos, crd, mask_val) -> np.ndarray:
    """out[p] = mask_val[p] * (A[i] . B[:, j]) for the stored entries p = (i, j) of the mask."""
    rows = np.repeat(np.arange(len(pos) - 1), np.diff(pos))
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    dots = np.einsum("pk,kp->p", a64[rows], b64[:, np.asarray(crd)])
    return (np.asarray(mask_val, np.float64) * dots).astype(np.float32)


def default_strides(n: int, stages: int | None = None) -> np.ndarray:
    """Strides 1, 2, 4, ... (stage s mixes pairs at distance 2^s)."""
    stages = int(np.log2(n)) if stages is None else stages
    return (1 << np.arange(stages)).astype(np.int64)


def butterfly(x, factors, strides=None) -> np.ndarray:
    """Apply the butterfly stages in order to each row of x (batch x n).

    factors: (stages, n/2, 2, 2); pair p of a stage with stride h is (i, i + h) with
    i = (p // h) * 2h + p % h, mapped by the 2 x 2 factor [[a, b], [c, d]]."""
    x = np.asarray(x)
    f = np.asarray(factors)
    cplx = np.iscomplexobj(x) or np.iscomplexobj(f)
    y = x.astype(np.complex128 if cplx else np.float64)
    n = y.shape[-1]
    strides = default_strides(n, f.shape[0]) if strides is None else np.asarray(strides)
    p = np.arange(n // 2)
    for s, h in enumerate(strides):
        i = (p // h) * 2 * h + p % h
        j = i + h
        xi, xj = y[..., i], y[..., j]
        fs = f[s]
        y = y.copy()
        y[..., i] = fs[:, 0, 0] * xi + fs[:, 0, 1] * xj
        y[..., j] = fs[:, 1, 0] * xi + fs[:, 1, 1] * xj
    return y.astype(np.complex64 if cplx else np.float32)


def fft_factors(n: int) -> np.ndarray:
    """Radix-2 decimation-in-time DFT as butterfly factors (strides 1, 2, ..., n/2) applied
    after the bit-reversal permutation: pair (i, i + h) with k = i mod h and twiddle
    w = exp(-2 pi i k / 2h) maps (u, v) to (u + w v, u - w v)."""
    if n < 2 or n & (n - 1):
        raise UserError(f"fft length must be a power of two >= 2, got {n}")
    stages = int(np.log2(n))
    f = np.empty((stages, n // 2, 2, 2), np.complex128)
    p = np.arange(n // 2)
    for s in range(stages):
        h = 1 << s
        w = np.exp(-2j * np.pi * (p % h) / (2 * h))
        f[s, :, 0, 0], f[s, :, 0, 1], f[s, :, 1, 0], f[s, :, 1, 1] = 1, w, 1, -w
    return f


def bit_reverse_indices(n: int) -> np.ndarray:
    bits = int(np.log2(n))
    i = np.arange(n)
    return np.array([int(format(v, f"0{bits}b")[::-1], 2) for v in i]) if bits else i


def fft(x) -> np.ndarray:
    """The DFT along the last axis (the definition: numpy's), as complex64."""
    return np.fft.fft(np.asarray(x), axis=-1).astype(np.complex64)


def sparse_attention(q, k, v, pos, crd, scale=None) -> np.ndarray:
    """Dense masked attention: softmax over each row's stored entries of scale * q k^T, times v.

    A row with no stored entries gives zeros."""
    q64, k64, v64 = (np.asarray(t, np.float64) for t in (q, k, v))
    scale = 1.0 / np.sqrt(q64.shape[1]) if scale is None else float(scale)
    mask = csr_to_dense(pos, crd, np.ones(len(crd)), (q64.shape[0], k64.shape[0])) > 0
    s = np.where(mask, scale * (q64 @ k64.T), -np.inf)
    mx = np.max(s, axis=1, keepdims=True)
    e = np.where(mask, np.exp(s - np.where(np.isfinite(mx), mx, 0.0)), 0.0)
    tot = e.sum(axis=1, keepdims=True)
    p = np.divide(e, tot, out=np.zeros_like(e), where=tot > 0)
    return (p @ v64).astype(np.float32)


def microtile_flags(a, granularity) -> np.ndarray:
    """flags[g, c]: does micro-tile (g, c) of shape gm x gk hold a nonzero."""
    gm, gk = granularity
    a = np.asarray(a)
    m, k = a.shape
    pad = np.zeros((-(-m // gm) * gm, -(-k // gk) * gk), bool)
    pad[:m, :k] = a != 0
    return pad.reshape(pad.shape[0] // gm, gm, pad.shape[1] // gk, gk).any(axis=(1, 3))
