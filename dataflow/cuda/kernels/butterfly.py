"""Butterfly stages: one stage per launch, or several fused in shared memory.

A butterfly stage with stride h mixes index pairs (i, i + h), i with bit log2(h) clear, through
its own 2 x 2 factor (docs/references.md#butterfly-sparsity: stage k mixes pairs at distance 2^k
with 2 x 2 blocks; 2n parameters per factor). Pair p of a stage is
i = (p // h) * 2h + p % h, j = i + h, and

    y[i] = f[p, 0, 0] * x[i] + f[p, 0, 1] * x[j]
    y[j] = f[p, 1, 0] * x[i] + f[p, 1, 1] * x[j]

Rows of x (batch) are independent. The DFT is such a product (twiddle factors) after the
bit-reversal permutation, which `bit_reverse` applies.

`butterfly_stage`: one thread per (row, pair); x -> y through global memory.
`butterfly_fused`: one block per (row, chunk of `tile` elements); the chunk stays in shared
memory for every stage whose stride is below `tile` (such pairs never leave an aligned chunk),
with a barrier between stages: one DRAM read and one write for all those stages, the GPU
analogue of the dataflow array's multi-layer mode. Stages with larger strides run as
`butterfly_stage` launches.
"""

from __future__ import annotations

from numba import complex64, cuda, float32

#: Largest chunk a fused block holds (power of two); tile // 2 threads per block.
FUSED_TILE_MAX = 1024
#: Threads per block of the one-stage and bit-reversal launches.
STAGE_BLOCK = 256


def butterfly_stage(x, y, f, h, n, batch):
    t = cuda.grid(1)
    half = n // 2
    if t < batch * half:
        r = t // half
        p = t % half
        i = (p // h) * 2 * h + p % h
        j = i + h
        xi = x[r, i]
        xj = x[r, j]
        y[r, i] = f[p, 0, 0] * xi + f[p, 0, 1] * xj
        y[r, j] = f[p, 1, 0] * xi + f[p, 1, 1] * xj


def make_butterfly_fused(dtype, tile_max: int = FUSED_TILE_MAX):
    """The fused kernel for one element type (float32 or complex64): its shared buffer's type
    and size are compile-time constants. Launch with grid (n // tile, batch), block tile // 2;
    `f` holds the fused stages' factors (stages, n // 2, 2, 2), `strides` their strides, each
    below `tile`."""

    def butterfly_fused(x, y, f, strides, n, tile):
        buf = cuda.shared.array(tile_max, dtype)
        r = cuda.blockIdx.y
        base = cuda.blockIdx.x * tile
        t = cuda.threadIdx.x
        step = cuda.blockDim.x
        for e in range(t, tile, step):
            buf[e] = x[r, base + e]
        cuda.syncthreads()
        for s in range(strides.shape[0]):
            h = strides[s]
            li = (t // h) * 2 * h + t % h
            lj = li + h
            gi = base + li
            p = (gi // (2 * h)) * h + gi % h
            xi = buf[li]
            xj = buf[lj]
            buf[li] = f[s, p, 0, 0] * xi + f[s, p, 0, 1] * xj
            buf[lj] = f[s, p, 1, 0] * xi + f[s, p, 1, 1] * xj
            cuda.syncthreads()
        for e in range(t, tile, step):
            y[r, base + e] = buf[e]

    return butterfly_fused


butterfly_fused_f32 = make_butterfly_fused(float32)
butterfly_fused_c64 = make_butterfly_fused(complex64)


def bit_reverse(x, y, log_n, batch):
    """y[r, rev(i)] = x[r, i], rev reversing the low log_n bits (x, y: batch x 2^log_n)."""
    t = cuda.grid(1)
    n = 1 << log_n
    if t < batch * n:
        r = t // n
        i = t % n
        v = i
        j = 0
        for _ in range(log_n):
            j = (j << 1) | (v & 1)
            v >>= 1
        y[r, j] = x[r, i]


def bias_relu(y, bias, relu, n, batch):
    """y[r, i] += bias[i], then max(y, 0) when `relu` (a butterfly linear layer's epilogue)."""
    t = cuda.grid(1)
    if t < batch * n:
        r = t // n
        i = t % n
        v = y[r, i] + bias[i]
        if relu and v < 0:
            v = float32(0.0)
        y[r, i] = v


#: Tile edge of the transpose (TRANSPOSE_TILE x TRANSPOSE_ROWS threads per block).
TRANSPOSE_TILE = 32
TRANSPOSE_ROWS = 8
TRANSPOSE_PAD = TRANSPOSE_TILE + 1  # a padded row: column reads hit distinct shared banks


def transpose(x, y, rows, cols):
    """y (cols x rows) = x (rows x cols)^T through a shared-memory tile, so both the reads of x
    and the writes of y are coalesced (the 2-D FFT's corner turn)."""
    tile = cuda.shared.array((TRANSPOSE_TILE, TRANSPOSE_PAD), complex64)
    c0 = cuda.blockIdx.x * TRANSPOSE_TILE
    r0 = cuda.blockIdx.y * TRANSPOSE_TILE
    tx = cuda.threadIdx.x
    for j in range(cuda.threadIdx.y, TRANSPOSE_TILE, TRANSPOSE_ROWS):
        if r0 + j < rows and c0 + tx < cols:
            tile[j, tx] = x[r0 + j, c0 + tx]
    cuda.syncthreads()
    for j in range(cuda.threadIdx.y, TRANSPOSE_TILE, TRANSPOSE_ROWS):
        if c0 + j < cols and r0 + tx < rows:
            y[c0 + j, r0 + tx] = tile[tx, j]
