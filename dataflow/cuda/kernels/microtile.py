"""PIT-style micro-tile matmul: C = A @ B where A's nonzero micro-tiles are found at run time.

PIT (SOSP 2023; docs/references.md#pit): a reduction axis may be permuted freely, so the nonzero
micro-tiles of a dynamically sparse operand are gathered into dense compute tiles (SRead),
computed densely, and the results written back to their places (SWrite); the index is built
at run time from the data, and that cost counts. Two schemes, one per micro-tile shape:

- gm x gk tiles with gm rows (32 x 1, or 32 x 64 block-sparse): rows group by gm; for each
  group the nonzero k-blocks are gathered along k (`microtile_matmul_k`). Each block of C rows
  is written once, in place.
- 1 x gk tiles (1 x 64): for each k-block of width gk the rows that are nonzero in it are
  gathered along m (`microtile_matmul_m`), multiplied with that block of B, and their partial
  rows scatter-added back to C (atomics).

The index: `microtile_flags` marks the nonzero micro-tiles (one thread per tile),
`compact_flags` turns each row of flags into a list of indices and a count (one thread per row).
"""

from __future__ import annotations

from numba import cuda, float32

MT_TN = 32       # output columns per block (threadIdx.x)
MT_TY = 8        # thread rows (threadIdx.y); each thread owns MT_ROWS // MT_TY output rows
MT_ROWS = 32     # rows per compute tile: the row-group height gm (k scheme) or the gather
                 # chunk (m scheme) -- PIT's 32 x 64 x 32 compute tile
MT_ACC = MT_ROWS // MT_TY  # accumulators per thread (a module constant: local array sizes
                           # must be literals to the CUDA compiler, the simulator takes anything)
MT_KC = 32       # gathered reduction indices staged per step (k scheme)
MT_GK_MAX = 64   # widest k-block (m scheme)
FLAGS_BLOCK = (32, 8)
COMPACT_BLOCK = 128


def microtile_flags(a, flags, gm, gk, m, k, transposed):
    """flags[g, c] = 1 if A[g*gm:(g+1)*gm, c*gk:(c+1)*gk] has a nonzero, else 0
    (stored at flags[c, g] when `transposed`)."""
    c, g = cuda.grid(2)
    if g * gm < m and c * gk < k:
        nz = 0
        for r in range(g * gm, min(m, (g + 1) * gm)):
            for q in range(c * gk, min(k, (c + 1) * gk)):
                if a[r, q] != 0:
                    nz = 1
        if transposed:
            flags[c, g] = nz
        else:
            flags[g, c] = nz


def compact_flags(flags, idx, count, rows, width):
    """idx[r, :count[r]] = the columns c with flags[r, c] != 0, in order."""
    r = cuda.grid(1)
    if r < rows:
        nz = 0
        for c in range(width):
            if flags[r, c] != 0:
                idx[r, nz] = c
                nz += 1
        count[r] = nz


def microtile_matmul_k(a, b, c, kidx, kcount, gm, gk, m, k, n):
    """Grid (ceil(n / MT_TN), row groups), block (MT_TN, MT_TY); gm <= MT_ROWS."""
    sa = cuda.shared.array((MT_ROWS, MT_KC), float32)
    sb = cuda.shared.array((MT_KC, MT_TN), float32)
    acc = cuda.local.array(MT_ACC, float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    g = cuda.blockIdx.y
    n0 = cuda.blockIdx.x * MT_TN
    r0 = g * gm
    tid = ty * MT_TN + tx
    for u in range(MT_ACC):
        acc[u] = float32(0.0)
    total = kcount[g] * gk  # length of the gathered reduction axis
    for c0 in range(0, total, MT_KC):
        for e in range(tid, MT_ROWS * MT_KC, MT_TN * MT_TY):  # SRead: gather A's columns
            rr = e // MT_KC
            t = c0 + e % MT_KC
            val = float32(0.0)
            if rr < gm and r0 + rr < m and t < total:
                col = kidx[g, t // gk] * gk + t % gk
                if col < k:
                    val = a[r0 + rr, col]
            sa[rr, e % MT_KC] = val
        for e in range(tid, MT_KC * MT_TN, MT_TN * MT_TY):  # ... and the matching rows of B
            kk = e // MT_TN
            cc = e % MT_TN
            t = c0 + kk
            val = float32(0.0)
            if t < total and n0 + cc < n:
                row = kidx[g, t // gk] * gk + t % gk
                if row < k:
                    val = b[row, n0 + cc]
            sb[kk, cc] = val
        cuda.syncthreads()
        for q in range(MT_KC):
            bv = sb[q, tx]
            for u in range(MT_ACC):
                acc[u] += sa[ty + u * MT_TY, q] * bv
        cuda.syncthreads()
    for u in range(MT_ACC):
        rr = ty + u * MT_TY
        if rr < gm and r0 + rr < m and n0 + tx < n:
            c[r0 + rr, n0 + tx] = acc[u]


def microtile_matmul_m(a, b, c, ridx, rcount, gk, k, n):
    """Grid (ceil(n / MT_TN), k-blocks), block (MT_TN, MT_TY); gk <= MT_GK_MAX; C zeroed
    before the launch (partial rows are added into it)."""
    sa = cuda.shared.array((MT_ROWS, MT_GK_MAX), float32)
    sb = cuda.shared.array((MT_GK_MAX, MT_TN), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    kb = cuda.blockIdx.y
    n0 = cuda.blockIdx.x * MT_TN
    k0 = kb * gk
    tid = ty * MT_TN + tx
    for e in range(tid, MT_GK_MAX * MT_TN, MT_TN * MT_TY):
        kk = e // MT_TN
        cc = e % MT_TN
        val = float32(0.0)
        if kk < gk and k0 + kk < k and n0 + cc < n:
            val = b[k0 + kk, n0 + cc]
        sb[kk, cc] = val
    cnt = rcount[kb]
    for g0 in range(0, cnt, MT_ROWS):
        for e in range(tid, MT_ROWS * MT_GK_MAX, MT_TN * MT_TY):  # SRead: gather A's rows
            rr = e // MT_GK_MAX
            kk = e % MT_GK_MAX
            val = float32(0.0)
            if g0 + rr < cnt and kk < gk and k0 + kk < k:
                val = a[ridx[kb, g0 + rr], k0 + kk]
            sa[rr, kk] = val
        cuda.syncthreads()
        for u in range(MT_ACC):
            rr = ty + u * MT_TY
            if g0 + rr < cnt and n0 + tx < n:
                part = float32(0.0)
                for q in range(gk):
                    part += sa[rr, q] * sb[q, tx]
                cuda.atomic.add(c, (ridx[kb, g0 + rr], n0 + tx), part)  # SWrite
        cuda.syncthreads()
