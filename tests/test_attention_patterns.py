"""Property tests (hypothesis) of the attention patterns' index arithmetic."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dataflow.attention import pattern_mask
from dataflow.attention.api import mask_csr


def _check_csr(pos, crd, seq, diagonal=True):
    assert pos[0] == 0 and pos[-1] == len(crd) and (np.diff(pos) >= 1).all()  # no empty row
    for i in range(seq):
        row = crd[pos[i]:pos[i + 1]]
        assert (np.diff(row) > 0).all() and row.min() >= 0 and row.max() < seq  # sorted, unique
        assert not diagonal or i in row  # every pattern but N:M keeps the diagonal


@settings(max_examples=25, deadline=None)
@given(seq=st.integers(1, 40), window=st.integers(0, 40), dilation=st.integers(1, 6))
def test_dilated_window_is_the_symmetric_band_of_multiples(seq, window, dilation):
    window = min(window, seq)
    dilation = min(dilation, seq)
    pos, crd, _ = mask_csr("dilated", seq, window=window, dilation=dilation)
    _check_csr(pos, crd, seq)
    m = np.zeros((seq, seq), dtype=bool)
    m[np.repeat(np.arange(seq), np.diff(pos)), crd] = True
    i, j = np.indices((seq, seq))
    want = ((j - i) % dilation == 0) & (np.abs(j - i) <= window * dilation)
    assert (m == want).all() and (m == m.T).all()
    per_row = [sum(1 for t in range(-window, window + 1) if 0 <= r + t * dilation < seq)
               for r in range(seq)]
    assert np.diff(pos).tolist() == per_row


@settings(max_examples=15, deadline=None)
@given(log_seq=st.integers(0, 7))
def test_butterfly_pairs_are_one_bit_apart(log_seq):
    seq = 1 << log_seq
    pos, crd, _ = mask_csr("butterfly", seq)
    _check_csr(pos, crd, seq)
    rows = np.repeat(np.arange(seq), np.diff(pos))
    x = rows ^ crd
    assert ((x & (x - 1)) == 0).all()  # 0 (the diagonal) or a single bit: stride 2^s
    assert (np.diff(pos) == log_seq + 1).all()


@settings(max_examples=20, deadline=None)
@given(groups=st.integers(1, 8), m=st.integers(1, 8), n=st.integers(1, 8),
       seed=st.integers(0, 3))
def test_nm_every_group_holds_n(groups, m, n, seed):
    n = min(n, m)
    seq = groups * m
    dense = pattern_mask("nm", seq, nm=f"{n}:{m}", seed=seed).to_dense() != 0
    assert (dense.reshape(seq, groups, m).sum(axis=2) == n).all()
    pos, crd, _ = mask_csr("nm", seq, nm=f"{n}:{m}", seed=seed)
    _check_csr(pos, crd, seq, diagonal=False)


@settings(max_examples=20, deadline=None)
@given(nb=st.integers(1, 8), block=st.integers(1, 6), g=st.integers(0, 2), w=st.integers(0, 2),
       r=st.integers(0, 2), seed=st.integers(0, 3))
def test_bigbird_is_whole_blocks_with_band_and_globals(nb, block, g, w, r, seed):
    g, r = min(g, nb), min(r, nb)
    seq = nb * block
    pos, crd, _ = mask_csr("bigbird", seq, block=block, global_blocks=g, window_blocks=w,
                           random_blocks=r, seed=seed)
    _check_csr(pos, crd, seq)
    m = np.zeros((seq, seq), dtype=bool)
    m[np.repeat(np.arange(seq), np.diff(pos)), crd] = True
    blocks = m.reshape(nb, block, nb, block)
    full = blocks.all(axis=(1, 3))
    assert (blocks.any(axis=(1, 3)) == full).all()
    bi, bj = np.indices((nb, nb))
    assert full[np.abs(bi - bj) <= w].all() and full[:g].all() and full[:, :g].all()
    extra = full & ~(np.abs(bi - bj) <= w) & (bi >= g) & (bj >= g)
    assert (extra.sum(axis=1) <= r).all()
