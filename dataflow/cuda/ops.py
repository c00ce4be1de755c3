"""Host side of the CUDA path: numpy in, kernels launched, numpy out.

Each function checks its inputs (clear `ValueError`s naming the argument), copies them to the
device, launches through a `Runner` (pass `runner=Runner(timed=True)`, or use
`dataflow.cuda.runner.measure`, to time the kernels with CUDA events) and copies the result back.
FLOPs and compulsory bytes are given to every launch so the runner can report FLOP/s and GB/s.
Without a GPU, everything runs in the CUDA simulator (`dataflow.cuda.device`).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from dataflow.cuda.device import cuda_module
from dataflow.cuda.reference import fft_factors, microtile_flags
from dataflow.cuda.runner import Runner
from dataflow.errors import UserError
from dataflow.moe.gating import gate_logits, route

F32, C64, I32 = np.dtype(np.float32), np.dtype(np.complex64), np.dtype(np.int32)


def _kernels() -> SimpleNamespace:
    """The kernel modules, imported after `cuda_module()` has fixed GPU or simulator mode."""
    cuda_module()
    from dataflow.cuda.kernels import attention, butterfly, dense, microtile, moe, sparse

    return SimpleNamespace(dense=dense, sparse=sparse, butterfly=butterfly, attention=attention,
                           microtile=microtile, moe=moe)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _matrix(x, name: str, dtype=F32) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise UserError(f"{name} must be a 2-D array, got shape {x.shape}")
    return np.ascontiguousarray(x, dtype=dtype)


def _csr(pos, crd, val, shape, name: str = "a"):
    pos, crd = np.asarray(pos), np.asarray(crd)
    m = int(shape[0])
    if pos.shape != (m + 1,):
        raise UserError(f"{name}: CSR pos must have {m + 1} entries for {m} rows, got {pos.shape}")
    nnz = int(pos[-1]) if m else 0
    if crd.shape[0] < nnz or np.asarray(val).shape[0] < nnz:
        raise UserError(f"{name}: CSR crd/val shorter than pos[-1] = {nnz}")
    if nnz >= 2**31:
        raise UserError(f"{name}: {nnz} stored entries exceed the int32 indices of the kernels")
    if nnz and (crd[:nnz].min() < 0 or crd[:nnz].max() >= shape[1]):
        raise UserError(f"{name}: CSR column index out of range for shape {tuple(shape)}")
    return (np.ascontiguousarray(pos, I32), np.ascontiguousarray(crd[:nnz], I32),
            np.ascontiguousarray(np.asarray(val)[:nnz], F32), nnz)


# --- dense and sparse matmul ----------------------------------------------------------------

def gemm(a, b, *, tile: int | None = None, runner: Runner | None = None) -> np.ndarray:
    """C = A @ B (fp32) with the shared-memory tiled kernel. `tile`: tile edge (default
    `GEMM_TILE`; smaller tiles keep simulator runs short)."""
    cuda = cuda_module()
    a, b = _matrix(a, "a"), _matrix(b, "b")
    if a.shape[1] != b.shape[0]:
        raise UserError(f"gemm shapes do not agree: a {a.shape} @ b {b.shape}")
    return _gemm_device(cuda.to_device(a), cuda.to_device(b), runner or Runner(),
                        tile).copy_to_host()


def _gemm_device(da, db, runner, tile=None):
    dense = _kernels().dense
    (m, k), n = da.shape, db.shape[1]
    tile = tile or dense.GEMM_TILE
    fn = dense.gemm_tiled if tile == dense.GEMM_TILE else _gemm_variant(dense, tile)
    dc = cuda_module().device_array((m, n), F32)
    runner.launch("gemm_tiled", fn, (_ceil(n, tile), _ceil(m, tile)), (tile, tile),
                  (da, db, dc, m, n, k), flops=2 * m * n * k, bytes=4 * (m * k + k * n + m * n))
    return dc


_GEMM_VARIANTS: dict = {}


def _gemm_variant(dense, tile: int):
    if tile < 1 or tile > 32:
        raise UserError(f"gemm tile must be in 1..32 (tile x tile threads per block), got {tile}")
    return _GEMM_VARIANTS.setdefault(tile, dense.make_gemm_tiled(tile))


def spmm(pos, crd, val, shape, b, *, runner: Runner | None = None) -> np.ndarray:
    """C = A @ B with A in CSR (pos, crd, val) of `shape` (m x k), B dense (k x n)."""
    sparse = _kernels().sparse
    cuda = cuda_module()
    b = _matrix(b, "b")
    m, k = (int(s) for s in shape)
    if b.shape[0] != k:
        raise UserError(f"spmm shapes do not agree: a {(m, k)} @ b {b.shape}")
    pos, crd, val, nnz = _csr(pos, crd, val, (m, k))
    n = b.shape[1]
    dc = cuda.device_array((m, n), F32)
    bx, by = sparse.SPMM_BLOCK
    (runner or Runner()).launch(
        "spmm_csr", sparse.spmm_csr, (_ceil(n, bx), _ceil(m, by)), (bx, by),
        (cuda.to_device(pos), cuda.to_device(crd), cuda.to_device(val), cuda.to_device(b), dc,
         m, n),
        flops=2 * nnz * n, bytes=4 * (m + 1 + 2 * nnz + k * n + m * n))
    return dc.copy_to_host()


def sddmm(a, b, pos, crd, mask_val, *, runner: Runner | None = None) -> np.ndarray:
    """out[p] = mask_val[p] * (A[i] . B[:, j]) over the stored entries p = (i, j) of the CSR
    mask (pos, crd); A m x k, B k x n dense. Returns the nnz values (fp32)."""
    a, b = _matrix(a, "a"), _matrix(b, "b")
    if a.shape[1] != b.shape[0]:
        raise UserError(f"sddmm shapes do not agree: a {a.shape} @ b {b.shape}")
    return _sddmm(a, np.ascontiguousarray(b.T), pos, crd, mask_val, runner or Runner())


def _sddmm(a, bt, pos, crd, mask_val, runner, device_out: bool = False):
    sparse = _kernels().sparse
    cuda = cuda_module()
    (m, k), n = a.shape, bt.shape[0]
    pos, crd, val, nnz = _csr(pos, crd, mask_val, (m, n), name="mask")
    rows = np.repeat(np.arange(m, dtype=I32), np.diff(pos))
    dout = cuda.device_array(max(nnz, 1), F32)
    runner.launch(
        "sddmm_csr", sparse.sddmm_csr, _ceil(nnz, sparse.SDDMM_BLOCK), sparse.SDDMM_BLOCK,
        (cuda.to_device(a), cuda.to_device(bt), cuda.to_device(rows), cuda.to_device(crd),
         cuda.to_device(val), dout, nnz, k),
        flops=2 * nnz * k + nnz, bytes=4 * (m * k + n * k + 4 * nnz))
    return dout if device_out else dout.copy_to_host()[:nnz]


# --- butterfly and FFT ----------------------------------------------------------------------

def _rows(x, what: str = "x") -> tuple[np.ndarray, tuple]:
    """x as (rows, n) over its last axis, and its shape (leading axes are a batch)."""
    x = np.asarray(x)
    if x.ndim < 1:
        raise UserError(f"{what} must have at least one axis, got a scalar")
    n = x.shape[-1]
    if n < 2 or n & (n - 1):
        raise UserError(f"the last axis of {what} must be a power of two >= 2, got n = {n}")
    return x.reshape(-1, n), x.shape


def _check_butterfly(n: int, factors, strides):
    f = np.asarray(factors)
    if f.ndim != 4 or f.shape[1:] != (n // 2, 2, 2):
        raise UserError(f"factors must have shape (stages, {n // 2}, 2, 2) for n = {n}, "
                         f"got {f.shape}")
    if strides is None:
        strides = 1 << np.arange(f.shape[0])
    strides = np.asarray(strides, np.int64)
    if strides.shape != (f.shape[0],):
        raise UserError(f"strides must have one entry per stage ({f.shape[0]}), got "
                         f"{strides.shape}")
    bad = [int(h) for h in strides if h < 1 or h >= n or h & (h - 1)]
    if bad:
        raise UserError(f"strides must be powers of two below n = {n}; got {bad}")
    return f, strides


def butterfly(x, factors, strides=None, *, fused: bool = True, tile: int | None = None,
              runner: Runner | None = None) -> np.ndarray:
    """Apply butterfly stages along the last axis of x (see `kernels.butterfly` for the
    layout): B x with B = F_(S-1) ... F_0 for `factors` of shape (S, n/2, 2, 2) (or a list of
    S arrays (n/2, 2, 2), as `dataflow.butterfly` takes them).

    `fused=True` keeps every run of consecutive stages with stride below the tile (default
    min(n, FUSED_TILE_MAX)) in shared memory in one launch; larger strides, or `fused=False`,
    take one launch per stage. Real x and factors stay float32, otherwise complex64."""
    x2, shape = _rows(x)
    f, strides = _check_butterfly(x2.shape[1], factors, strides)
    dt = C64 if np.iscomplexobj(x2) or np.iscomplexobj(f) else F32
    runner = runner or Runner()
    dy = _butterfly_device(cuda_module().to_device(np.ascontiguousarray(x2, dt)),
                           np.ascontiguousarray(f, dt), strides, fused, tile, runner,
                           flops_per_pair=28 if dt == C64 else 6)
    return dy.copy_to_host().reshape(shape)


def _butterfly_device(dx, f, strides, fused, tile, runner, flops_per_pair):
    """The stages on a device array dx (batch, n); returns the device array holding B x."""
    bfly = _kernels().butterfly
    cuda = cuda_module()
    batch, n = dx.shape
    es = dx.dtype.itemsize
    tile = min(n, tile or bfly.FUSED_TILE_MAX)
    if tile < 2 or tile & (tile - 1) or tile > bfly.FUSED_TILE_MAX:
        raise UserError(f"butterfly tile must be a power of two in 2..{bfly.FUSED_TILE_MAX}, "
                         f"got {tile}")
    fused_fn = bfly.butterfly_fused_c64 if dx.dtype == C64 else bfly.butterfly_fused_f32
    cur, nxt = dx, cuda.device_array_like(dx)
    s = 0
    while s < len(strides):
        e = s + 1
        if fused:
            while e < len(strides) and strides[e] < tile and strides[s] < tile:
                e += 1
        pairs = batch * (n // 2) * (e - s)
        nbytes = es * (2 * batch * n + 2 * n * (e - s))
        if fused and strides[s] < tile:
            runner.launch(f"butterfly_fused x{e - s}", fused_fn, (n // tile, batch), tile // 2,
                          (cur, nxt, cuda.to_device(np.ascontiguousarray(f[s:e])),
                           cuda.to_device(np.ascontiguousarray(strides[s:e])), n, tile),
                          flops=flops_per_pair * pairs, bytes=nbytes)
        else:
            runner.launch("butterfly_stage", bfly.butterfly_stage,
                          _ceil(batch * n // 2, bfly.STAGE_BLOCK), bfly.STAGE_BLOCK,
                          (cur, nxt, cuda.to_device(np.ascontiguousarray(f[s])), int(strides[s]),
                           n, batch),
                          flops=flops_per_pair * pairs, bytes=nbytes)
        if cur is dx:  # never write into the caller's input
            cur, nxt = nxt, cuda.device_array_like(dx)
        else:
            cur, nxt = nxt, cur
        s = e
    return cur


def butterfly_linear(x, factors, bias=None, *, relu: bool = False, fused: bool = True,
                     runner: Runner | None = None) -> np.ndarray:
    """y = B x + bias along the last axis (then max(y, 0) when `relu`); real x and factors
    (float32). The bias add runs as a kernel on the butterfly's output, still on the GPU."""
    x2, shape = _rows(x)
    runner = runner or Runner()
    dy = _linear_device(cuda_module().to_device(np.ascontiguousarray(x2, F32)), factors, bias,
                        relu, fused, runner)
    return dy.copy_to_host().reshape(shape)


def _linear_device(dx, factors, bias, relu, fused, runner):
    bfly = _kernels().butterfly
    cuda = cuda_module()
    batch, n = dx.shape
    f, strides = _check_butterfly(n, factors, None)
    if np.iscomplexobj(f):
        raise UserError("butterfly_linear takes real factors (complex: use butterfly)")
    dy = _butterfly_device(dx, np.ascontiguousarray(f, F32), strides, fused, None, runner, 6)
    if bias is None and not relu:
        return dy
    b = np.zeros(n, F32) if bias is None else np.ascontiguousarray(bias, F32)
    if b.shape != (n,):
        raise UserError(f"bias must have shape ({n},), got {b.shape}")
    runner.launch("bias_relu", bfly.bias_relu, _ceil(batch * n, bfly.STAGE_BLOCK),
                  bfly.STAGE_BLOCK, (dy, cuda.to_device(b), bool(relu), n, batch),
                  flops=batch * n * (2 if relu else 1), bytes=4 * (2 * batch * n + n))
    return dy


def butterfly_ffn(x, factors1, factors2, bias1=None, bias2=None, *, fused: bool = True,
                  runner: Runner | None = None) -> np.ndarray:
    """FABNet's butterfly FFN B2 relu(B1 x + b1) + b2 along the last axis, all on the GPU."""
    x2, shape = _rows(x)
    runner = runner or Runner()
    dh = _linear_device(cuda_module().to_device(np.ascontiguousarray(x2, F32)), factors1, bias1,
                        True, fused, runner)
    return _linear_device(dh, factors2, bias2, False, fused, runner).copy_to_host().reshape(shape)


def fft(x, *, fused: bool = True, tile: int | None = None,
        runner: Runner | None = None) -> np.ndarray:
    """DFT along the last axis (power-of-two length): bit reversal, then the radix-2 stages as
    butterflies with twiddle factors. FLOPs counted as 5 n log2 n per row (the usual
    convention), complex64 out."""
    x2, shape = _rows(x)
    runner = runner or Runner()
    dx = cuda_module().to_device(np.ascontiguousarray(x2, C64))
    return _fft_device(dx, fused, tile, runner).copy_to_host().reshape(shape)


def _fft_device(dx, fused, tile, runner):
    bfly = _kernels().butterfly
    cuda = cuda_module()
    batch, n = dx.shape
    log_n = int(math.log2(n))
    drev = cuda.device_array_like(dx)
    runner.launch("bit_reverse", bfly.bit_reverse, _ceil(batch * n, bfly.STAGE_BLOCK),
                  bfly.STAGE_BLOCK, (dx, drev, log_n, batch), bytes=16 * batch * n)
    # 5 n log2 n per row over log2 n stages: 10 FLOP per pair
    return _butterfly_device(drev, fft_factors(n).astype(C64),
                             1 << np.arange(log_n, dtype=np.int64), fused, tile, runner,
                             flops_per_pair=10)


def fnet_attention(x, *, fused: bool = True, runner: Runner | None = None) -> np.ndarray:
    """FNet / FABNet token mixing Re(FFT over seq (FFT over hidden (x))) for x (seq, dim),
    both powers of two: FFT of every row, a tiled transpose on the GPU (the corner turn),
    FFT of every row again; the real part of the transposed result is returned (float32)."""
    bfly = _kernels().butterfly
    cuda = cuda_module()
    x = np.asarray(x)
    if x.ndim != 2:
        raise UserError(f"fnet_attention takes x of shape (seq, dim), got {x.shape}")
    seq, dim = x.shape
    for name, v in (("seq", seq), ("dim", dim)):
        if v < 2 or v & (v - 1):
            raise UserError(f"fnet_attention: {name} must be a power of two >= 2, got {v}")
    runner = runner or Runner()
    h = _fft_device(cuda.to_device(np.ascontiguousarray(x, C64)), fused, None, runner)
    ht = cuda.device_array((dim, seq), C64)
    t = bfly.TRANSPOSE_TILE
    runner.launch("transpose", bfly.transpose, (_ceil(dim, t), _ceil(seq, t)),
                  (t, bfly.TRANSPOSE_ROWS), (h, ht, seq, dim), bytes=16 * seq * dim)
    out = _fft_device(ht, fused, None, runner).copy_to_host()  # (dim, seq)
    return np.ascontiguousarray(out.T.real, dtype=F32)


# --- sparse attention -----------------------------------------------------------------------

def window_csr(m: int, s: int, window: int, dilation: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(pos, crd) of the (dilated) sliding window: keys j = i + t * dilation, |t| <= window,
    0 <= j < s, in increasing order."""
    if window < 0 or dilation < 1:
        raise UserError(f"window must be >= 0 and dilation >= 1, got window={window}, "
                         f"dilation={dilation}")
    i = np.arange(m)
    lo = -np.minimum(window, i // dilation)
    hi = np.minimum(window, (s - 1 - i) // dilation) + 1
    counts = np.maximum(hi - lo, 0)
    pos = np.concatenate(([0], np.cumsum(counts)))
    rows = np.repeat(i, counts)
    t = np.arange(pos[-1]) - np.repeat(pos[:-1], counts) + np.repeat(lo, counts)
    return pos, rows + t * dilation


def sparse_attention(q, k, v, pos=None, crd=None, *, window: int | None = None,
                     dilation: int = 1, scale: float | None = None, fused: bool | None = None,
                     runner: Runner | None = None) -> np.ndarray:
    """softmax(scale * q k^T on a pattern) @ v; q (m x d), k (s x d), v (s x dv). The pattern
    is a CSR (pos, crd), or a (dilated) sliding window: `window` = half-width in steps of
    `dilation` (keys i + t * dilation, |t| <= window), whose keys the fused kernel computes
    instead of reading them. A row with no entries gives zeros.

    `fused`: one kernel per query row with an online softmax (default when dv <= ATT_MAX_DIM),
    or SDDMM -> row softmax -> SpMM (False). `scale` defaults to 1 / sqrt(d)."""
    km = _kernels()
    att, sparse = km.attention, km.sparse
    cuda = cuda_module()
    q, k, v = _matrix(q, "q"), _matrix(k, "k"), _matrix(v, "v")
    (m, d), s, dv = q.shape, k.shape[0], v.shape[1]
    if k.shape[1] != d or v.shape[0] != s:
        raise UserError(f"attention needs q (m, d), k (s, d), v (s, dv); got q {q.shape}, "
                         f"k {k.shape}, v {v.shape}")
    if (window is None) == (pos is None or crd is None):
        raise UserError("give the pattern as pos and crd (CSR) or as window (and dilation), "
                         "not both and not neither")
    affine = window is not None
    if affine:
        pos, crd = window_csr(m, s, int(window), int(dilation))
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if fused is None:
        fused = dv <= att.ATT_MAX_DIM
    if fused and dv > att.ATT_MAX_DIM:
        raise UserError(f"fused attention holds value dimensions up to {att.ATT_MAX_DIM}, "
                         f"got dv = {dv}; use fused=False")
    pos32, crd32, _, nnz = _csr(pos, crd, np.zeros(len(crd), F32), (m, s), name="pattern")
    runner = runner or Runner()
    dout = cuda.device_array((m, dv), F32)
    if fused:
        index_bytes = 0 if affine else 4 * (m + 1 + nnz)
        runner.launch("attention_fused" + (" (window)" if affine else ""), att.attention_fused,
                      m, att.ATT_THREADS,
                      (cuda.to_device(q), cuda.to_device(k), cuda.to_device(v),
                       cuda.to_device(pos32), cuda.to_device(crd32), dout, np.float32(scale), d,
                       dv, int(window) if affine else -1, int(dilation)),
                      flops=2 * nnz * (d + dv) + 4 * nnz,
                      bytes=4 * (m * d + s * d + s * dv + m * dv) + index_bytes)
        return dout.copy_to_host()
    scores = _sddmm(q, k, pos32, crd32, np.full(nnz, scale, F32), runner, device_out=True)
    probs = cuda.device_array(max(nnz, 1), F32)
    dpos = cuda.to_device(pos32)
    runner.launch("csr_row_softmax", att.csr_row_softmax, _ceil(m, att.SOFTMAX_BLOCK),
                  att.SOFTMAX_BLOCK, (dpos, scores, probs, m), flops=3 * nnz,
                  bytes=4 * (m + 1 + 2 * nnz))
    bx, by = sparse.SPMM_BLOCK
    runner.launch("spmm_csr", sparse.spmm_csr, (_ceil(dv, bx), _ceil(m, by)), (bx, by),
                  (dpos, cuda.to_device(crd32), probs, cuda.to_device(v), dout, m, dv),
                  flops=2 * nnz * dv, bytes=4 * (m + 1 + 2 * nnz + s * dv + m * dv))
    return dout.copy_to_host()


# --- PIT micro-tiles ------------------------------------------------------------------------

def _granularity(granularity, mt) -> tuple[int, int]:
    try:
        gm, gk = (int(g) for g in granularity)
    except (TypeError, ValueError):
        raise UserError(f"granularity must be (rows, cols) like (32, 1), "
                        f"got {granularity!r}") from None
    if gm < 1 or gk < 1 or gm > mt.MT_ROWS or (gm == 1 and gk > mt.MT_GK_MAX):
        raise UserError(f"granularity {gm}x{gk} not supported: rows 1..{mt.MT_ROWS}, and "
                         f"1 x gk tiles need gk <= {mt.MT_GK_MAX}")
    return gm, gk


def _microtile_index(da, m, k, gm, gk, runner):
    """Build the run-time index on the GPU: (idx, count) device arrays. Rows of idx are row
    groups listing nonzero k-blocks (gm > 1), or k-blocks listing nonzero rows (gm = 1)."""
    mt = _kernels().microtile
    cuda = cuda_module()
    G, C = _ceil(m, gm), _ceil(k, gk)
    shape = (C, G) if gm == 1 else (G, C)
    flags = cuda.to_device(np.zeros(shape, np.uint8))
    idx = cuda.to_device(np.zeros(shape, I32))
    count = cuda.to_device(np.zeros(shape[0], I32))
    fx, fy = mt.FLAGS_BLOCK
    runner.launch("microtile_flags", mt.microtile_flags, (_ceil(C, fx), _ceil(G, fy)), (fx, fy),
                  (da, flags, gm, gk, m, k, int(gm == 1)), bytes=4 * m * k + G * C)
    runner.launch("compact_flags", mt.compact_flags, _ceil(shape[0], mt.COMPACT_BLOCK),
                  mt.COMPACT_BLOCK, (flags, idx, count, shape[0], shape[1]),
                  bytes=G * C + 4 * (G * C + shape[0]))
    return idx, count


def microtile_matmul(a, b, granularity=(32, 1), *,
                     runner: Runner | None = None) -> tuple[np.ndarray, dict]:
    """C = A @ B, skipping A's zero micro-tiles of `granularity` (gm, gk), found at run time.

    gm = 1 (1 x gk tiles, gk <= 64): rows gathered per k-block, results scatter-added;
    1 < gm <= 32 (32 x 1, 32 x 64): k-blocks gathered per group of gm rows. Returns C and
    index statistics {granularity, tiles, nonzero_tiles, useful_macs, computed_macs}."""
    mt = _kernels().microtile
    cuda = cuda_module()
    a, b = _matrix(a, "a"), _matrix(b, "b")
    (m, k), n = a.shape, b.shape[1]
    if b.shape[0] != k:
        raise UserError(f"microtile_matmul shapes do not agree: a {a.shape} @ b {b.shape}")
    gm, gk = _granularity(granularity, mt)
    dc, kept = _microtile_device(cuda.to_device(a), cuda.to_device(b), gm, gk,
                                 runner or Runner(), host_a=a)
    stats = {"granularity": f"{gm}x{gk}", "tiles": _ceil(m, gm) * _ceil(k, gk),
             "nonzero_tiles": kept, "useful_macs": int(np.count_nonzero(a)) * n,
             "computed_macs": kept * gm * gk * n}
    return dc.copy_to_host(), stats


def _microtile_device(da, db, gm, gk, runner, host_a=None):
    """(C on the device, number of nonzero micro-tiles). A dry run builds no index, so the
    tiles are counted on the host from `host_a` (the values A will have)."""
    mt = _kernels().microtile
    cuda = cuda_module()
    (m, k), n = da.shape, db.shape[1]
    idx, count = _microtile_index(da, m, k, gm, gk, runner)
    if runner.execute:
        kept = int(count.copy_to_host().sum())
    else:

        kept = int(microtile_flags(host_a, (gm, gk)).sum())
    gathered = kept * gm * gk  # A elements in the gathered tiles (edge padding included)
    dc = cuda.to_device(np.zeros((m, n), F32))
    if gm == 1:
        runner.launch("microtile_matmul_m", mt.microtile_matmul_m,
                      (_ceil(n, mt.MT_TN), _ceil(k, gk)), (mt.MT_TN, mt.MT_TY),
                      (da, db, dc, idx, count, gk, k, n),
                      flops=2 * gathered * n, bytes=4 * (gathered + k * n + 2 * kept * n))
    else:
        runner.launch("microtile_matmul_k", mt.microtile_matmul_k,
                      (_ceil(n, mt.MT_TN), _ceil(m, gm)), (mt.MT_TN, mt.MT_TY),
                      (da, db, dc, idx, count, gm, gk, m, k, n),
                      flops=2 * gathered * n, bytes=4 * (gathered + kept * gk * n + m * n))
    return dc, kept


def relu_ffn(x, w1, b, w2, granularity="32x1", *, runner: Runner | None = None) -> np.ndarray:
    """Y = ReLU(X W1 + b) W2 on the GPU (PIT's activation-sparsity case): the tiled GEMM, the
    bias + ReLU kernel, then H @ W2 over H's nonzero micro-tiles found at run time
    (`granularity` "32x1", "1x64", "32x64" or (gm, gk)), or a dense GEMM ("dense")."""
    bfly, mt = _kernels().butterfly, _kernels().microtile
    cuda = cuda_module()
    x, w1, w2 = _matrix(x, "x"), _matrix(w1, "w1"), _matrix(w2, "w2")
    (t, d), h = x.shape, w1.shape[1]
    b = np.ascontiguousarray(b, F32)
    if w1.shape[0] != d or w2.shape[0] != h or b.shape != (h,):
        raise UserError(f"relu_ffn shapes do not agree: x {x.shape}, w1 {w1.shape}, "
                         f"b {b.shape}, w2 {w2.shape}")
    runner = runner or Runner()
    dh = _gemm_device(cuda.to_device(x), cuda.to_device(w1), runner)
    runner.launch("bias_relu", bfly.bias_relu, _ceil(t * h, bfly.STAGE_BLOCK), bfly.STAGE_BLOCK,
                  (dh, cuda.to_device(b), True, h, t), flops=2 * t * h, bytes=4 * (2 * t * h + h))
    dw2 = cuda.to_device(w2)
    if granularity == "dense":
        return _gemm_device(dh, dw2, runner).copy_to_host()
    g = granularity
    if isinstance(g, str):
        try:
            g = tuple(int(v) for v in g.split("x"))
        except ValueError:
            raise UserError(f"granularity must look like 32x1 or be 'dense', got {g!r}") from None
    gm, gk = _granularity(g, mt)
    host_h = None
    if not runner.execute:  # the tiles of H a dry run must count, from the numpy definition
        host_h = np.maximum(x.astype(np.float64) @ w1 + b, 0.0)
    return _microtile_device(dh, dw2, gm, gk, runner, host_a=host_h)[0].copy_to_host()


def microtile_index(a, granularity=(32, 1)) -> tuple[np.ndarray, np.ndarray]:
    """The run-time index as the GPU builds it: (idx, count), for tests and inspection."""
    mt = _kernels().microtile
    cuda = cuda_module()
    a = _matrix(a, "a")
    gm, gk = _granularity(granularity, mt)
    idx, count = _microtile_index(cuda.to_device(a), *a.shape, gm, gk, Runner())
    return idx.copy_to_host(), count.copy_to_host()


# --- mixture of experts ---------------------------------------------------------------------

def moe(x, wg, bias, w, top_k: int, *, runner: Runner | None = None) -> tuple[np.ndarray, dict]:
    """The MoE layer Y = combine(gates, experts(dispatch(X))) on the GPU, the MoE package's
    definition (`dataflow.moe.gating.moe_reference`): logits X Wg + bias (tiled GEMM and the
    bias kernel), top-k gating, dispatch by expert, every expert's GEMM in one grouped launch,
    gate-weighted combine. x tokens x dim, wg dim x experts, bias (experts,), w experts x dim x
    hidden. Returns Y and {tokens_per_expert}. Logits are fp32 here (float64 in the
    reference): near-tied logits may route differently."""
    km = _kernels()
    mk, bfly = km.moe, km.butterfly
    cuda = cuda_module()
    x, wg = _matrix(x, "x"), _matrix(wg, "wg")
    w = np.ascontiguousarray(w, F32)
    bias = np.ascontiguousarray(bias, F32)
    (t, d), e = x.shape, wg.shape[1]
    if w.ndim != 3 or w.shape[:2] != (e, d) or wg.shape[0] != d or bias.shape != (e,):
        raise UserError(f"moe operands disagree: x {x.shape}, wg {wg.shape}, bias {bias.shape},"
                         f" w {w.shape} (want dim x experts, experts, experts x dim x hidden)")
    if not 0 < top_k <= e:
        raise UserError(f"top_k ({top_k}) must be between 1 and the number of experts ({e})")
    h, rows = w.shape[2], t * top_k
    runner = runner or Runner()
    dx = cuda.to_device(x)
    logits = _gemm_device(dx, cuda.to_device(wg), runner)
    runner.launch("bias_add", bfly.bias_relu, _ceil(t * e, bfly.STAGE_BLOCK), bfly.STAGE_BLOCK,
                  (logits, cuda.to_device(bias), False, e, t), flops=t * e,
                  bytes=4 * (2 * t * e + e))
    expert = cuda.to_device(np.zeros((t, top_k), I32))
    gate = cuda.device_array((t, top_k), F32)
    runner.launch("moe_topk", mk.moe_topk, _ceil(t, mk.TOPK_BLOCK), mk.TOPK_BLOCK,
                  (logits, expert, gate, top_k, e, t), flops=t * (e * top_k + 3 * top_k),
                  bytes=4 * (t * e + 2 * t * top_k))
    offsets = cuda.to_device(np.zeros(e + 1, I32))
    token_of_row = cuda.device_array(rows, I32)
    row_of = cuda.device_array((t, top_k), I32)
    runner.launch("moe_dispatch_index", mk.moe_dispatch_index, _ceil(e, mk.TOPK_BLOCK),
                  mk.TOPK_BLOCK, (expert, offsets, token_of_row, row_of, t, top_k, e),
                  bytes=4 * (t * top_k + e + 1 + 2 * rows))
    xd = cuda.device_array((rows, d), F32)
    cx, cy = mk.COMBINE_BLOCK
    runner.launch("moe_gather", mk.moe_gather, (_ceil(d, cx), _ceil(rows, cy)), (cx, cy),
                  (dx, token_of_row, xd, rows, d), bytes=4 * (2 * rows * d + rows))
    if runner.execute:
        per_expert = np.diff(offsets.copy_to_host())
    else:  # a dry run routes nothing: count from the numpy definition of the routing

        per_expert = route(gate_logits(x, wg, bias), top_k).tokens_per_expert
    yd = cuda.device_array((rows, h), F32)
    tile = mk.MOE_TILE
    runner.launch("moe_expert_gemm", mk.moe_expert_gemm,
                  (_ceil(h, tile), _ceil(int(per_expert.max()), tile), e), (tile, tile),
                  (xd, cuda.to_device(w), yd, offsets, d, h),
                  flops=2 * rows * d * h, bytes=4 * (rows * d + e * d * h + rows * h))
    y = cuda.device_array((t, h), F32)
    runner.launch("moe_combine", mk.moe_combine, (_ceil(h, cx), _ceil(t, cy)), (cx, cy),
                  (yd, gate, row_of, y, t, top_k, h), flops=2 * rows * h,
                  bytes=4 * (rows * h + 2 * t * top_k + t * h))
    return y.copy_to_host(), {"tokens_per_expert": per_expert.astype(int).tolist()}

