"""Dense GEMM, tiled in shared memory: C (m x n) = A (m x k) @ B (k x n), fp32.

One thread block computes one TILE x TILE tile of C with TILE x TILE threads. For each step
along k, the block stages a TILE x TILE tile of A and of B in shared memory (each thread loads
one element of each, coalesced along rows), synchronises, and every thread accumulates its
dot-product slice from shared memory: each global element is read m/TILE or n/TILE times instead
of k times. Out-of-range elements are loaded as zeros, so any m, n, k works.
"""

from __future__ import annotations

from numba import cuda, float32

#: Tile edge for GPUs (16 x 16 = 256 threads, 2 KiB of shared memory per block).
GEMM_TILE = 16


def make_gemm_tiled(tile: int):
    """The kernel for one tile edge (a compile-time constant: it sizes the shared arrays).
    Launch with block (tile, tile) and grid (ceil(n / tile), ceil(m / tile))."""

    def gemm_tiled(a, b, c, m, n, k):
        sa = cuda.shared.array((tile, tile), float32)
        sb = cuda.shared.array((tile, tile), float32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row = cuda.blockIdx.y * tile + ty
        col = cuda.blockIdx.x * tile + tx
        acc = float32(0.0)
        for k0 in range(0, k, tile):
            if row < m and k0 + tx < k:
                sa[ty, tx] = a[row, k0 + tx]
            else:
                sa[ty, tx] = float32(0.0)
            if col < n and k0 + ty < k:
                sb[ty, tx] = b[k0 + ty, col]
            else:
                sb[ty, tx] = float32(0.0)
            cuda.syncthreads()
            for q in range(tile):
                acc += sa[ty, q] * sb[q, tx]
            cuda.syncthreads()
        if row < m and col < n:
            c[row, col] = acc

    gemm_tiled.__name__ = f"gemm_tiled_{tile}"
    return gemm_tiled


gemm_tiled = make_gemm_tiled(GEMM_TILE)
