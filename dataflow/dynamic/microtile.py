"""Micro-tiles of a dynamically sparse operand: granularities, masks, and the run-time index.

PIT (SOSP 2023; docs/references.md#pit) covers the nonzeros of an operand whose sparsity is known
only at run time with small micro-tiles (32 x 1 along the reduction axis k, or 1 x 64 along a
row) instead of the 32 x 64 blocks of block-sparse kernels (OpenAI block-sparse); the index of
nonzero micro-tiles is built from the data at run time, and that cost counts. This module is
the host-side (numpy) definition of that index; `dataflow.dynamic.lower` builds the kernels that
compute it on the array, and the tests hold the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dataflow.errors import UserError
from dataflow.workloads import check_host_memory, dense_bytes

#: micro-tile shapes (rows along m, columns along k), PIT's micro-benchmark granularities
GRANULARITIES: dict[str, tuple[int, int]] = {"32x1": (32, 1), "1x64": (1, 64), "32x64": (32, 64)}
#: how the data's zeros are laid out: element-wise at random, or whole micro-tiles at random
MASK_GRANULARITIES = ("element", *GRANULARITIES)


def parse_granularity(granularity: str, what: str = "--granularity") -> tuple[int, int]:
    """(rows, cols) of a micro-tile; a clear error for anything else."""
    if granularity not in GRANULARITIES:
        raise UserError(f"{what} must be one of {tuple(GRANULARITIES)}, got {granularity!r}")
    return GRANULARITIES[granularity]


def check_sparsity(sparsity: float, what: str = "--sparsity") -> float:
    s = float(sparsity)
    if not 0.0 <= s < 1.0:
        raise UserError(f"{what} must be in [0, 1), got {sparsity}")
    return s


def check_shape(m: int, k: int, tile: tuple[int, int], granularity: str) -> None:
    bh, bw = tile
    for name, v in (("m", m), ("k", k)):
        if v <= 0:
            raise UserError(f"--{name} must be a positive integer, got {v}")
    if m % bh or k % bw:
        raise UserError(f"granularity {granularity} needs --m divisible by {bh} and --k by {bw}; "
                         f"got m={m}, k={k}")


def random_mask(m: int, k: int, sparsity: float, granularity: str,
                rng: np.random.Generator) -> np.ndarray:
    """Boolean m x k keep-mask with a fraction `sparsity` of zeros: element-wise
    (`granularity="element"`) or in whole micro-tiles of that shape (PIT's micro-benchmark
    draws its patterns at the granularity being measured). Exactly round(sparsity * count)
    units are zero, so the measured sparsity is the one asked for."""
    check_sparsity(sparsity)
    # the mask, then A drawn and masked (fp32, twice: the draw and the product)
    check_host_memory(f"a {m} x {k} operand (--m {m} --k {k})",
                      dense_bytes((m, k), itemsize=1 + 4 + 4))
    if granularity == "element":
        bh, bw = 1, 1
    else:
        bh, bw = parse_granularity(granularity, "mask granularity")
        check_shape(m, k, (bh, bw), granularity)
    units = (m // bh) * (k // bw)
    keep = np.ones(units, dtype=bool)
    keep[rng.permutation(units)[: round(sparsity * units)]] = False
    keep = keep.reshape(m // bh, k // bw)
    return np.repeat(np.repeat(keep, bh, axis=0), bw, axis=1)


@dataclass(frozen=True, eq=False)
class MicroTileIndex:
    """The run-time index of A's nonzero micro-tiles, in row-major tile order.

    `tile_nonzero[tr, tc]`: does micro-tile (tr, tc) hold a nonzero. `pos` (tile rows + 1) and
    `crd` (tile column of each nonzero tile) are its CSR over tile rows; `slot[t]` is where tile
    t (row-major) lands in `crd` (zero tiles land on a spare last slot); `tile_id[p]` the
    row-major id of the p-th nonzero tile."""

    tile: tuple[int, int]
    tile_nonzero: np.ndarray
    pos: np.ndarray
    crd: np.ndarray
    slot: np.ndarray
    tile_id: np.ndarray

    @property
    def nnz_tiles(self) -> int:
        return int(self.pos[-1])

    @property
    def tile_density(self) -> float:
        return self.nnz_tiles / self.tile_nonzero.size


def tile_nonzero_mask(a: np.ndarray, tile: tuple[int, int]) -> np.ndarray:
    """(m / bh) x (k / bw): does the tile hold an entry with a * a > 0 in fp32 (the scan
    kernel's test; entries below ~1e-23 in magnitude square to 0 and count as zeros)."""
    bh, bw = tile
    m, k = a.shape
    sq = np.asarray(a, dtype=np.float32) ** 2 > 0
    return sq.reshape(m // bh, bh, k // bw, bw).any(axis=(1, 3))


def build_index(a: np.ndarray, tile: tuple[int, int]) -> MicroTileIndex:
    """The index the array kernels build (`tile_nonzero_mask`), compacted in row-major order."""
    nz = tile_nonzero_mask(a, tile)
    counts = nz.sum(axis=1)
    pos = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    flat = nz.ravel()
    tile_id = np.flatnonzero(flat).astype(np.int64)
    slot = np.full(flat.size, len(tile_id), dtype=np.int64)  # zero tiles: the spare slot
    slot[tile_id] = np.arange(len(tile_id))
    crd = (tile_id % nz.shape[1]).astype(np.int64)
    return MicroTileIndex(tile=tile, tile_nonzero=nz, pos=pos, crd=crd, slot=slot, tile_id=tile_id)


def computed_macs(index: MicroTileIndex, n: int) -> int:
    """MACs a micro-tile kernel performs: every element of every nonzero tile times n."""
    bh, bw = index.tile
    return index.nnz_tiles * bh * bw * n


def useful_macs(a: np.ndarray, n: int) -> int:
    """MACs on nonzero entries of A (the rest multiply zeros)."""
    return int(np.count_nonzero(a)) * n
