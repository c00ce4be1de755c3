"""Monarch and block-butterfly products on the `sim` backend.

Both are chains of structured sparse matrices (docs/references.md#butterfly-sparsity: block
butterfly uses b x b blocks; Monarch is two block-diagonal factors with a permutation between),
so each factor runs as one CSR SpMM program on the array (`dfg.lower.lower_spmm_csr`, the
GATHER of B's rows through the column indices is the addressing):

* Monarch M = P^T L P R (n = m^2, m blocks of m x m): R is block-diagonal; the permutation P
  (the transpose of the m x m grid) and its inverse need no data movement of their own: they
  are folded into the column indices and row order of the second factor, P^T L P, whose row
  (b, e) reads x[(j, e)] for j < m with value L[e, b, j]. Two SpMMs with m nonzeros per row:
  2 n m MACs per vector instead of n^2.
* block butterfly over nb = n / b blocks: stage k pairs blocks (j, j + 2^k) with a 2b x 2b
  matrix [[A, B], [C, D]]; as a CSR matrix every row holds 2b nonzeros (its block row of A
  and B, or of C and D). log2(nb) SpMMs.

Each factor is one program (a DRAM round trip between factors, like the `layer`
orchestration of the butterfly stages); `merge_results` puts them on one time line. Values
come from the engine and equal the numpy references `monarch_apply` / `block_butterfly_apply`
within fp32 tolerance (tests/test_butterfly.py). Real operands only on `sim` (the SpMM
kernel is real); complex ones raise `ButterflyError`.
"""

from __future__ import annotations

import numpy as np

from dataflow.arch import resolve_arch
from dataflow.butterfly import reference as ref
from dataflow.butterfly.reference import ButterflyError
from dataflow.butterfly.simulate import merge_results
from dataflow.dfg.lower import lower_spmm_csr
from dataflow.mapper import map_program
from dataflow.pe_array.simulate import simulate_mapping

BACKENDS = ("numpy", "sim")


def _csr(rows: list[tuple[np.ndarray, np.ndarray]]):
    """(pos, crd, val) from per-row (columns, values)."""
    pos = np.zeros(len(rows) + 1, dtype=np.int64)
    pos[1:] = np.cumsum([len(c) for c, _ in rows])
    crd = np.concatenate([c for c, _ in rows]).astype(np.int64)
    val = np.concatenate([v for _, v in rows])
    return pos, crd, val


def monarch_factors_csr(l_blocks, r_blocks):
    """The two CSR factors (pos, crd, val) of Monarch: [R, P^T L P] (applied in that order)."""
    r, lb = np.asarray(r_blocks), np.asarray(l_blocks)
    m = r.shape[0] if r.ndim == 3 else 0
    if r.ndim != 3 or r.shape != (m, m, m) or lb.shape != (m, m, m):
        raise ButterflyError(f"monarch: l_blocks and r_blocks must both be (m, m, m); got "
                             f"l_blocks {lb.shape}, r_blocks {r.shape}")
    j = np.arange(m)
    first = [(b * m + j, r[b, i]) for b in range(m) for i in range(m)]     # R: block b, row i
    second = [(j * m + e, lb[e, b]) for b in range(m) for e in range(m)]    # P^T L P: row b m + e
    return [_csr(first), _csr(second)]


def block_butterfly_factors_csr(factors, block: int, n: int):
    """One CSR matrix (pos, crd, val) per block-butterfly stage (n = nb * block)."""
    if block < 1 or n % block:
        raise ButterflyError(f"block must divide the last axis ({n}), got {block}")
    nb = n // block
    s = ref.log2_exact(nb, "n / block")
    fs = [np.asarray(f) for f in factors]
    if len(fs) != s or any(f.shape != (nb // 2, 2, 2, block, block) for f in fs):
        raise ButterflyError(f"factors: need {s} arrays of shape "
                             f"({nb // 2}, 2, 2, {block}, {block})")
    jb = np.arange(block)
    out = []
    for k, f in enumerate(fs):
        lo, hi = ref.pair_indices(nb, k)
        rows: list = [None] * n
        cols_of = {}
        for p, (a, c) in enumerate(zip(lo, hi)):
            cols_of[p] = np.concatenate((a * block + jb, c * block + jb))
            for i in range(block):
                rows[a * block + i] = (cols_of[p], np.concatenate((f[p, 0, 0, i], f[p, 0, 1, i])))
                rows[c * block + i] = (cols_of[p], np.concatenate((f[p, 1, 0, i], f[p, 1, 1, i])))
        out.append(_csr(rows))
    return out


def run_csr_chain(x, mats, arch=None, engine: str = "fast", workload: str = "structured"):
    """y = A_(F-1) ... A_0 x along the last axis of a real x (batch, n), one SpMM program per
    factor on the engine: A_i (n x n CSR) @ Y^T (n x batch). Returns (y float32, SimResult)."""

    arch = resolve_arch(arch)
    x = np.asarray(x)
    if np.iscomplexobj(x) or any(np.iscomplexobj(v) for _, _, v in mats):
        raise ButterflyError("the sim backend of monarch/block-butterfly takes real x and "
                             "factors (its SpMM kernel is real); use backend='numpy' for complex")
    flat = x.reshape(-1, x.shape[-1])
    n = flat.shape[1]
    yt = np.ascontiguousarray(flat.T, dtype=np.float32)            # (n, batch)
    parts = []
    for i, (pos, crd, val) in enumerate(mats):
        prog = lower_spmm_csr((n, n), pos, crd, val, yt)
        res = simulate_mapping(map_program(prog, arch), engine=engine,
                               workload=f"{workload}-factor{i}")
        yt = np.asarray(res.output, dtype=np.float32).reshape(n, -1)
        parts.append(res)
    y = np.ascontiguousarray(yt.T).reshape(x.shape)
    return y, merge_results(parts, workload, y, notes=(
        f"{len(mats)} structured factors, one CSR SpMM program each (DRAM between them)",))


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ButterflyError(f"backend must be one of {BACKENDS}, got {backend!r}")


def run_monarch(x, l_blocks, r_blocks, arch=None, engine: str = "fast"):
    """`monarch_matmul` on the engine: (y, SimResult)."""
    x = np.asarray(x)
    mats = monarch_factors_csr(l_blocks, r_blocks)
    if x.ndim < 1 or x.shape[-1] != len(mats[0][0]) - 1:
        raise ButterflyError(f"monarch: x's last axis must be n = m^2 = {len(mats[0][0]) - 1}, "
                             f"got shape {x.shape}")
    return run_csr_chain(x, mats, arch, engine, "monarch")


def monarch_matmul(x, l_blocks, r_blocks, backend: str = "numpy", arch=None,
                   engine: str = "fast") -> np.ndarray:
    """Monarch product M x along the last axis, M = P^T L P R (`reference.monarch_apply`)."""
    _check_backend(backend)
    if backend == "numpy":
        return ref.monarch_apply(x, l_blocks, r_blocks)
    return run_monarch(x, l_blocks, r_blocks, arch, engine)[0]


def run_block_butterfly(x, factors, block: int, arch=None, engine: str = "fast"):
    """`block_butterfly_matmul` on the engine: (y, SimResult)."""
    x = np.asarray(x)
    if x.ndim < 1:
        raise ButterflyError("x must have at least one axis")
    mats = block_butterfly_factors_csr(factors, block, x.shape[-1])
    return run_csr_chain(x, mats, arch, engine, "block-butterfly")


def block_butterfly_matmul(x, factors, block: int, backend: str = "numpy", arch=None,
                           engine: str = "fast") -> np.ndarray:
    """Block-butterfly product along the last axis (`reference.block_butterfly_apply`)."""
    _check_backend(backend)
    if backend == "numpy":
        return ref.block_butterfly_apply(x, factors, block)
    return run_block_butterfly(x, factors, block, arch, engine)[0]


__all__ = ["block_butterfly_factors_csr", "block_butterfly_matmul", "monarch_factors_csr",
           "monarch_matmul", "run_block_butterfly", "run_csr_chain", "run_monarch"]
