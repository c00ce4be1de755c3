"""Masks that are not whole blocks, for the block lowering: covering blocks and filler bias
(docs/conventions.md#block-attention, "Filler blocks").

A window mask (each row attends the keys around the diagonal) is no set of whole b x b blocks,
but it is covered by the blocks it touches: for a 17-key window and b = 8 each 8-row panel
touches 3 key blocks, 24 keys of which 17 are attended (71 %). The block lowering
(`lower_block.py`) runs over the covering blocks as over BigBird's; the entries of a covering
block the mask leaves out (the *fillers*) are masked as the DIA lowering masks its off-matrix
positions (`lower_dia.py`): an input `bias`, 0 on attended entries and -inf on fillers, is
added to the scores before the row maximum and the exp, so a filler gets exp = 0 and adds
nothing to the row sum or, through E = 0, to the PV. `bias` is in the scores' strip layout and
order (the sddmm's CSC order of the blocks: bias[(b q + k) b + r] for row b tr + r and key
b bcrd[q] + k), so the softmax reads it at the scores' address or through their gather.

A row of a covered panel that attends no key at all would get max = -inf and exp(NaN): such a
mask is not covered (`cover_structure` gives None; the CSR lowering takes it). The useful
fraction (attended entries / covered entries) is what `SparseAttention` weighs to choose the
lowering; whole-block masks (BigBird) have no fillers and take no `bias`.
"""

from __future__ import annotations

import numpy as np

from dataflow.dfg.graph import Addr, Buffer, Node
from dataflow.dfg.ops import Op

#: block edges tried for a covering, smallest first (the tightest covering of a band)
COVER_EDGES = (8, 16, 32, 64)


def touched_blocks(pos: np.ndarray, crd: np.ndarray, m: int, n: int, edge: int,
                   lanes: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(panel, block column, attended entries) of every edge x edge block the CSR mask (m x n)
    touches, in CSR order; None unless edge is a multiple of `lanes` dividing m and n and the
    mask has entries. Shared by the whole-block test (`lower_block.block_structure`) and the
    covering (`cover_structure`)."""
    if edge % lanes or m % edge or n % edge or len(crd) == 0:
        return None
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(pos))
    nbj = n // edge
    blocks, counts = np.unique((rows // edge) * nbj + np.asarray(crd, dtype=np.int64) // edge,
                               return_counts=True)
    return blocks // nbj, blocks % nbj, counts


def panel_blocks(bi: np.ndarray, bj: np.ndarray, panels: int) -> tuple[np.ndarray, np.ndarray]:
    """(bpos, bcrd): the blocks `touched_blocks` found, as offsets per query panel and their
    block columns."""
    bpos = np.concatenate(([0], np.cumsum(np.bincount(bi, minlength=panels))))
    return bpos.astype(np.int64), bj.astype(np.int64)


def cover_structure(pos: np.ndarray, crd: np.ndarray, m: int, n: int, edge: int,
                    lanes: int = 8) -> tuple[np.ndarray, np.ndarray] | None:
    """(bpos, bcrd): the edge x edge blocks the CSR mask (m x n) touches, per query panel
    (CSR order), when edge is a multiple of `lanes` dividing m and n and every row of a
    touched panel attends some key; else None."""
    got = touched_blocks(pos, crd, m, n, edge, lanes)
    if got is None:
        return None
    bi, bj, _ = got
    panel_rows = np.diff(pos).reshape(m // edge, edge)[np.unique(bi)]
    if (panel_rows == 0).any():  # a row of only fillers: max -inf, exp(-inf + inf)
        return None
    return panel_blocks(bi, bj, m // edge)


def useful_fraction(nnz: int, blocks: int, edge: int) -> float:
    """Attended entries over the entries of the covering blocks (1.0: whole blocks)."""
    return nnz / max(1, blocks * edge * edge)


def find_cover(pos: np.ndarray, crd: np.ndarray, m: int, n: int, lanes: int = 8):
    """(edge, bpos, bcrd) of the covering with the highest useful fraction (the larger edge
    at equal fraction: fewer, longer strips), or None."""
    best, best_frac = None, -1.0
    for edge in COVER_EDGES:
        got = cover_structure(pos, crd, m, n, edge, lanes)
        if got is None:
            continue
        frac = useful_fraction(len(crd), len(got[1]), edge)
        if frac >= best_frac:
            best, best_frac = (edge, *got), frac
    return best


def filler_bias(pos: np.ndarray, crd: np.ndarray, m: int, edge: int, bpos: np.ndarray,
                bcrd: np.ndarray, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """(table, pattern): the fillers' bias (module docstring) as a table of the distinct
    blocks' biases, each edge x edge in strip layout [key k][query row r] (0 where row
    b tr + r attends key b bcrd + k, -inf elsewhere), and each covering block's entry in
    the table, blocks in CSC order (by key block, then panel: the sddmm's order of the
    scores). A window's interior panels repeat the same three blocks, so the table is a few
    blocks, not one per covering block: the softmax gathers its rows through `pattern` as it
    gathers the scores through `cidx`."""
    npanel = m // edge
    brow = np.repeat(np.arange(npanel, dtype=np.int64), np.diff(bpos))
    csc_keys = np.sort(np.asarray(bcrd, dtype=np.int64) * npanel + brow)
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(pos))
    cols = np.asarray(crd, dtype=np.int64)
    q = np.searchsorted(csc_keys, (cols // edge) * npanel + rows // edge)
    attended = np.zeros((len(csc_keys), edge * edge), dtype=bool)
    attended[q, (cols % edge) * edge + rows % edge] = True
    distinct, pattern = np.unique(attended, axis=0, return_inverse=True)
    table = np.where(distinct, 0.0, -np.inf).astype(dtype)
    return table.ravel(), np.asarray(pattern, dtype=np.int64).ravel()


def biased(nodes: list[Node], score: int, index: int, addr: Addr) -> int:
    """Append to `nodes` the bias of score node `score` (gathered from the table through
    index node `index`, the block's pattern, at `addr`) and their sum; returns the sum's id."""
    b, s = len(nodes), len(nodes) + 1
    nodes += [Node(b, Op.GATHER, (index,), buffer="bias", addr=addr, name="bias"),
              Node(s, Op.ADD, (score, b), name="s+bias")]
    return s


def bias_buffers(table: int, blocks: int, index: str) -> list[Buffer]:
    """The bias table (`table` words) and the blocks' pattern index named `index`."""
    return [Buffer(index, blocks), Buffer("bias", table)]


__all__ = ["COVER_EDGES", "cover_structure", "filler_bias", "find_cover", "useful_fraction"]
