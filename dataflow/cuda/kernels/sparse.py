"""CSR SpMM and SDDMM, fp32 values with int32 indices.

SpMM  C (m x n) = A (m x k, CSR: pos, crd, val) @ B (k x n): one thread per output element,
      threads of a block adjacent along n, so each stored A entry is broadcast to a warp and the
      B row segment it multiplies is read coalesced.
SDDMM out[p] = mask_val[p] * (A[i] . Bt[j]) for each stored entry p = (i, j) of the mask:
      one thread per stored entry; B is passed transposed (Bt, n x k) so both operands of the
      dot product are read along rows.
"""

from __future__ import annotations

from numba import cuda, float32

#: Block shape of the SpMM launch (threads along n, rows of A).
SPMM_BLOCK = (32, 4)
#: Threads per block of the SDDMM launch.
SDDMM_BLOCK = 128


def spmm_csr(pos, crd, val, b, c, m, n):
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if row < m and col < n:
        acc = float32(0.0)
        for p in range(pos[row], pos[row + 1]):
            acc += val[p] * b[crd[p], col]
        c[row, col] = acc


def sddmm_csr(a, bt, rows, crd, mask_val, out, nnz, k):
    p = cuda.grid(1)
    if p < nnz:
        i = rows[p]
        j = crd[p]
        acc = float32(0.0)
        for q in range(k):
            acc += a[i, q] * bt[j, q]
        out[p] = mask_val[p] * acc
