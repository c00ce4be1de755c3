"""Mixture-of-experts on the GPU: top-k gating, dispatch, grouped expert GEMMs, combine.

The layout is the MoE package's (`dataflow.moe.gating.route`): dispatched rows grouped by
expert, tokens ascending within each; expert e owns rows [offsets[e], offsets[e + 1]);
row_of[t, s] is the row of token t's s-th choice.

`moe_topk`         one thread per token: the top_k logits by repeated arg-max (ties to the lower
                   expert, as a stable sort), then the softmax of the chosen logits (the gates).
`moe_dispatch_index` one thread per expert: its offset (rows of lower experts) and, scanning
                   tokens in order, the rows of its tokens (deterministic, no atomics).
`moe_gather`       xd[r] = x[token_of_row[r]].
`moe_expert_gemm`  all experts in one launch (grid z = expert), each block a shared-memory tile
                   of its expert's rows; blocks past an expert's rows exit (load imbalance shows
                   as idle blocks, as on the array it shows as idle regions).
`moe_combine`      y[t] = sum over s of gate[t, s] * yd[row_of[t, s]].
"""

from __future__ import annotations

import math

from numba import cuda, float32

MOE_TILE = 16
TOPK_BLOCK = 128
COMBINE_BLOCK = (32, 8)


def moe_topk(logits, expert, gate, top_k, experts, tokens):
    t = cuda.grid(1)
    if t < tokens:
        for s in range(top_k):
            best = -1
            bv = float32(-math.inf)
            for e in range(experts):
                taken = False
                for q in range(s):
                    if expert[t, q] == e:
                        taken = True
                if not taken and (best < 0 or logits[t, e] > bv):
                    best = e
                    bv = logits[t, e]
            expert[t, s] = best
            gate[t, s] = bv
        mx = gate[t, 0]
        total = float32(0.0)
        for s in range(top_k):
            w = math.exp(gate[t, s] - mx)
            gate[t, s] = w
            total += w
        for s in range(top_k):
            gate[t, s] = gate[t, s] / total


def moe_dispatch_index(expert, offsets, token_of_row, row_of, tokens, top_k, experts):
    e = cuda.grid(1)
    if e < experts:
        off = 0
        for t in range(tokens):
            for s in range(top_k):
                if expert[t, s] < e:
                    off += 1
        offsets[e] = off
        if e == experts - 1:
            offsets[experts] = tokens * top_k
        r = off
        for t in range(tokens):
            for s in range(top_k):
                if expert[t, s] == e:
                    token_of_row[r] = t
                    row_of[t, s] = r
                    r += 1


def moe_gather(x, token_of_row, xd, rows, dim):
    c, r = cuda.grid(2)
    if r < rows and c < dim:
        xd[r, c] = x[token_of_row[r], c]


def moe_expert_gemm(xd, w, yd, offsets, dim, hidden):
    """Grid (ceil(hidden / MOE_TILE), ceil(max rows of an expert / MOE_TILE), experts),
    block (MOE_TILE, MOE_TILE): yd[lo:hi] = xd[lo:hi] @ w[e] for each expert e."""
    sa = cuda.shared.array((MOE_TILE, MOE_TILE), float32)
    sb = cuda.shared.array((MOE_TILE, MOE_TILE), float32)
    e = cuda.blockIdx.z
    lo = offsets[e]
    hi = offsets[e + 1]
    r0 = lo + cuda.blockIdx.y * MOE_TILE
    if r0 >= hi:  # the whole block is past this expert's rows
        return
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    row = r0 + ty
    col = cuda.blockIdx.x * MOE_TILE + tx
    acc = float32(0.0)
    for k0 in range(0, dim, MOE_TILE):
        if row < hi and k0 + tx < dim:
            sa[ty, tx] = xd[row, k0 + tx]
        else:
            sa[ty, tx] = float32(0.0)
        if col < hidden and k0 + ty < dim:
            sb[ty, tx] = w[e, k0 + ty, col]
        else:
            sb[ty, tx] = float32(0.0)
        cuda.syncthreads()
        for q in range(MOE_TILE):
            acc += sa[ty, q] * sb[q, tx]
        cuda.syncthreads()
    if row < hi and col < hidden:
        yd[row, col] = acc


def moe_combine(yd, gate, row_of, y, tokens, top_k, hidden):
    h, t = cuda.grid(2)
    if t < tokens and h < hidden:
        acc = float32(0.0)
        for s in range(top_k):
            acc += gate[t, s] * yd[row_of[t, s], h]
        y[t, h] = acc
