"""One rule for NaN and infinity (docs/conventions.md): only stored entries multiply, NaN
propagates through stored products and through the softmax row it reaches. Every backend
equals the numpy reference element-wise, NaN positions included."""

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.attention.api import sparse_attention
from dataflow.testing import assert_close
from dataflow.ust_frontend.ops import matmul, sddmm

BACKENDS = ("numpy", "sim", "cuda")
SPECIALS = (np.inf, -np.inf, np.nan)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf - inf, 0 * inf


def same(actual, expected):
    actual, expected = (np.asarray(getattr(x, "val", x), np.float64) for x in (actual, expected))
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(actual), np.isinf(expected))
    np.testing.assert_array_equal(actual[np.isinf(actual)], expected[np.isinf(expected)])
    fin = np.isfinite(expected)
    assert_close(actual[fin], expected[fin])


def _a():
    return sp.random(6, 5, density=0.4, random_state=1, format="csr", dtype=np.float32)


def _b():
    return np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)


def test_inf_in_b_meets_only_stored_entries_of_a():
    a, b = _a(), _b()
    b[0, 0] = -np.inf
    out = matmul(a, b)
    stores_col0 = a.toarray()[:, 0] != 0
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(np.isinf(out[:, 0]), stores_col0)


@pytest.mark.parametrize("layout", ["csr", "coo", "dense"])
@pytest.mark.parametrize("where", ["b", "a"])
@pytest.mark.parametrize("special", SPECIALS)
def test_matmul_backends_agree(layout, where, special):
    a, b = _a(), _b()
    if where == "b":
        b[0, 0], b[3, 2] = special, special
    else:
        a.data[[0, 3]] = special
    a = {"csr": a, "coo": a.tocoo(), "dense": a.toarray()}[layout]
    ref = matmul(a, b, backend="numpy")
    for be in BACKENDS[1:]:
        same(matmul(a, b, backend=be), ref)


@pytest.mark.parametrize("special", SPECIALS)
def test_dense_a_sparse_b(special):
    a, b = _b().T.copy(), _a().T.tocsr()
    a[0, 0] = special
    ref = matmul(a, b, backend="numpy")
    for be in BACKENDS[1:]:
        same(matmul(a, b, backend=be), ref)


@pytest.mark.parametrize("special", SPECIALS)
def test_sddmm_backends_agree(special):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((6, 3), dtype=np.float32), rng.standard_normal((3, 5),
                                                                                dtype=np.float32)
    a[1, 0] = special
    mask = sp.random(6, 5, density=0.5, random_state=3, format="csr", dtype=np.float32)
    ref = sddmm(a, b, mask, backend="numpy")
    for be in BACKENDS[1:]:
        same(sddmm(a, b, mask, backend=be), ref)


@pytest.mark.parametrize("operand", ["q", "k", "v"])
@pytest.mark.parametrize("special", SPECIALS)
def test_attention_backends_agree(operand, special):
    rng = np.random.default_rng(4)
    x = {n: rng.standard_normal((8, 4), dtype=np.float32) for n in "qkv"}
    x[operand][3, 1] = special
    ref = sparse_attention(x["q"], x["k"], x["v"], "window", backend="numpy", window=2)
    for be in BACKENDS[1:]:
        same(sparse_attention(x["q"], x["k"], x["v"], "window", backend=be, window=2), ref)
    assert not np.isnan(ref).any(axis=1).all()  # only rows that attend it can turn NaN
    if special != special:
        assert np.isnan(ref).any()


def test_nan_query_row_is_nan_and_empty_row_is_zero():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((4, 3), dtype=np.float32) for _ in range(3))
    q[0, 0] = np.nan
    mask = np.array([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 1, 1]], np.float32)
    for be in BACKENDS:
        out = sparse_attention(q, k, v, mask, backend=be)
        assert np.isnan(out[0]).all() and not np.isnan(out[1:]).any()
        np.testing.assert_array_equal(out[2], 0.0)
