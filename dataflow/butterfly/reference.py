"""Numpy references of the butterfly family: the living definition every backend is checked against.

Conventions (docs/references.md#butterfly-sparsity): a butterfly matrix of size n = 2^S is a
product of S factors; factor k mixes the index pairs (i, i + 2^k) whose bit k of i is 0 with
one 2x2 block each, 2n parameters per factor. Factor k is stored as an array of shape
(n/2, 2, 2) indexed by *pair number* p = (i // 2^(k+1)) * 2^k + i % 2^k of the pair's lower
index i; it maps [x_i, x_(i+2^k)] to M[p] @ [x_i, x_(i+2^k)]. Factors are applied in the
order given (factor 0 first), so `butterfly_apply(x, fs)` computes B x with
B = F_(S-1) ... F_1 F_0 along the last axis. The DFT is that product with twiddle factors
(`fft_factors`) applied to the bit-reversed input (decimation in time).
"""

from __future__ import annotations

import numpy as np

from dataflow.errors import UserError


class ButterflyError(UserError):
    """Bad butterfly operands (names the parameter)."""


def log2_exact(n: int, what: str = "n") -> int:
    """S with 2^S == n, or ButterflyError naming `what`."""
    if not isinstance(n, (int, np.integer)) or n < 2 or n & (n - 1):
        raise ButterflyError(f"{what} must be a power of two >= 2, got {n}")
    return int(n).bit_length() - 1


def bit_reverse_indices(n: int) -> np.ndarray:
    """The permutation i -> reverse of i's log2(n) bits (int64)."""
    s = log2_exact(n)
    i = np.arange(n, dtype=np.int64)
    r = np.zeros(n, dtype=np.int64)
    for b in range(s):
        r |= ((i >> b) & 1) << (s - 1 - b)
    return r


def pair_indices(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) indices of factor k's pairs, in pair-number order."""
    s = 1 << k
    p = np.arange(n // 2, dtype=np.int64)
    lo = (p // s) * 2 * s + p % s
    return lo, lo + s


def check_factors(factors, n: int) -> list[np.ndarray]:
    """Validate a list of log2(n) factor arrays of shape (n/2, 2, 2)."""
    s = log2_exact(n, "the last axis of x")
    fs = [np.asarray(f) for f in factors]
    if len(fs) != s:
        raise ButterflyError(f"factors: a butterfly of size {n} needs {s} factors, got {len(fs)}")
    for k, f in enumerate(fs):
        if f.shape != (n // 2, 2, 2):
            raise ButterflyError(f"factors[{k}] must have shape ({n // 2}, 2, 2), got {f.shape}")
    return fs


def butterfly_apply(x, factors) -> np.ndarray:
    """B x along the last axis (float64 / complex128 accumulate), B = F_(S-1)...F_0."""
    x = np.asarray(x)
    n = x.shape[-1]
    fs = check_factors(factors, n)
    cplx = np.iscomplexobj(x) or any(np.iscomplexobj(f) for f in fs)
    y = x.astype(np.complex128 if cplx else np.float64)
    for k, f in enumerate(fs):
        lo, hi = pair_indices(n, k)
        a, b = y[..., lo], y[..., hi]
        y = y.copy()
        y[..., lo] = f[:, 0, 0] * a + f[:, 0, 1] * b
        y[..., hi] = f[:, 1, 0] * a + f[:, 1, 1] * b
    return y


def butterfly_dense(factors, n: int) -> np.ndarray:
    """The n x n matrix B (for small n: pictures and tests)."""
    return butterfly_apply(np.eye(n), factors).T


def fft_factors(n: int) -> list[np.ndarray]:
    """Decimation-in-time twiddle factors: pair (i, i + s) of stage k (s = 2^k) gets
    [[1, w], [1, -w]] with w = exp(-2 pi i (i mod s) / (2 s))."""
    out = []
    for k in range(log2_exact(n)):
        s = 1 << k
        lo, _ = pair_indices(n, k)
        w = np.exp(-2j * np.pi * (lo % s) / (2 * s))
        f = np.empty((n // 2, 2, 2), dtype=np.complex128)
        f[:, 0, 0], f[:, 0, 1], f[:, 1, 0], f[:, 1, 1] = 1, w, 1, -w
        out.append(f)
    return out


def twiddles(k: int) -> np.ndarray:
    """Stage k's distinct twiddles w_o = exp(-2 pi i o / 2^(k+1)), o in [0, 2^k)."""
    s = 1 << k
    return np.exp(-2j * np.pi * np.arange(s) / (2 * s))


def fft_reference(x) -> np.ndarray:
    """The DFT as butterfly stages on the bit-reversed input (equals np.fft.fft)."""
    x = np.asarray(x)
    n = x.shape[-1]
    return butterfly_apply(x[..., bit_reverse_indices(n)], fft_factors(n))


def random_factors(n: int, rng=None, complex_: bool = False,
                   scale: float | None = None) -> list[np.ndarray]:
    """Seeded random factors (entries ~ N(0, scale^2), default scale 1/sqrt(2) keeps norms)."""
    rng = np.random.default_rng(rng)
    sc = 1 / np.sqrt(2) if scale is None else scale
    fs = []
    for _ in range(log2_exact(n)):
        f = rng.standard_normal((n // 2, 2, 2)) * sc
        if complex_:
            f = f + 1j * rng.standard_normal((n // 2, 2, 2)) * sc
        fs.append(f.astype(np.complex64 if complex_ else np.float32))
    return fs


# --- block butterfly and Monarch --------------------------------------------------------------

def block_butterfly_apply(x, factors, block: int) -> np.ndarray:
    """Block butterfly: n = nb * block; factor k pairs the blocks (j, j + 2^k) (bit k of j zero)
    with one (2*block) x (2*block) matrix each, stored as (nb/2, 2, 2, block, block):
    [X_j; X_(j+2^k)] -> [[A, B], [C, D]] [X_j; X_(j+2^k)]."""
    x = np.asarray(x)
    n = x.shape[-1]
    if block < 1 or n % block:
        raise ButterflyError(f"block must divide the last axis ({n}), got {block}")
    nb = n // block
    s = log2_exact(nb, "n / block")
    fs = [np.asarray(f) for f in factors]
    if len(fs) != s or any(f.shape != (nb // 2, 2, 2, block, block) for f in fs):
        raise ButterflyError(f"factors: need {s} arrays of shape "
                             f"({nb // 2}, 2, 2, {block}, {block})")
    cplx = np.iscomplexobj(x) or any(np.iscomplexobj(f) for f in fs)
    y = x.astype(np.complex128 if cplx else np.float64).reshape(*x.shape[:-1], nb, block)
    for k, f in enumerate(fs):
        lo, hi = pair_indices(nb, k)
        a, b = y[..., lo, :], y[..., hi, :]
        y = y.copy()
        y[..., lo, :] = (np.einsum("pij,...pj->...pi", f[:, 0, 0], a)
                         + np.einsum("pij,...pj->...pi", f[:, 0, 1], b))
        y[..., hi, :] = (np.einsum("pij,...pj->...pi", f[:, 1, 0], a)
                         + np.einsum("pij,...pj->...pi", f[:, 1, 1], b))
    return y.reshape(x.shape)


def monarch_apply(x, l_blocks, r_blocks) -> np.ndarray:
    """Monarch M = P^T L P R (Dao et al.): R and L block-diagonal with m blocks of m x m
    (n = m^2), P the transpose permutation of an m x m grid. `r_blocks`, `l_blocks`: (m, m, m)."""
    x = np.asarray(x)
    n = x.shape[-1]
    r, lb = np.asarray(r_blocks), np.asarray(l_blocks)
    m = round(np.sqrt(n))
    if m * m != n or r.shape != (m, m, m) or lb.shape != (m, m, m):
        raise ButterflyError(f"monarch: n = {n} must be m^2 and blocks (m, m, m); got "
                             f"r {r.shape}, l {lb.shape}")
    y = x.reshape(*x.shape[:-1], m, m)                      # block b, entry j
    y = np.einsum("bij,...bj->...bi", r, y)                 # R: block diagonal
    y = np.swapaxes(y, -1, -2)                              # P: transpose the grid
    y = np.einsum("bij,...bj->...bi", lb, y)                # L: block diagonal
    return np.swapaxes(y, -1, -2).reshape(x.shape)          # P^T


def monarch_dense(l_blocks, r_blocks) -> np.ndarray:
    n = np.asarray(r_blocks).shape[0] ** 2
    return monarch_apply(np.eye(n), l_blocks, r_blocks).T


# --- layers ------------------------------------------------------------------------------------

def butterfly_linear(x, factors, bias=None) -> np.ndarray:
    """A butterfly linear layer: y = B x (+ bias) along the last axis."""
    y = butterfly_apply(x, factors)
    return y if bias is None else y + np.asarray(bias)


def butterfly_ffn(x, factors1, factors2, bias1=None, bias2=None) -> np.ndarray:
    """Butterfly FFN (FABNet): B2 relu(B1 x + b1) + b2, both butterfly linear layers."""
    h = np.maximum(butterfly_linear(x, factors1, bias1), 0.0)
    return butterfly_linear(h, factors2, bias2)


def fnet_attention(x) -> np.ndarray:
    """FNet/FABNet token mixing: Re(FFT over the sequence (axis -2) of FFT over hidden (-1))."""
    x = np.asarray(x)
    if x.ndim < 2:
        raise ButterflyError(f"fnet attention takes (..., seq, dim), got shape {x.shape}")
    return np.real(np.fft.fft(np.fft.fft(x.astype(np.complex128), axis=-1), axis=-2))
