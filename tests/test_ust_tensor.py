"""UST tensors: storage layouts, zero-copy interop, conversion and file loading."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.ust_frontend import NamedFormats, Tensor

# The 4x8 example of REFERENCES.md ("Universal Sparse Tensor").
EXAMPLE_ENTRIES = [(0, 0), (0, 1), (1, 1), (1, 3), (2, 2), (3, 3)]


def example_matrix() -> np.ndarray:
    a = np.zeros((4, 8))
    for n, (i, j) in enumerate(EXAMPLE_ENTRIES):
        a[i, j] = n + 1
    return a


def assert_same_array(actual, expected, *, rtol=0.0, atol=0.0):
    """The one comparison helper: shape, then dtype kind, then values within tolerances."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype.kind == expected.dtype.kind, (actual.dtype, expected.dtype)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def test_reference_example_csr_storage():
    t = Tensor.from_dense(example_matrix(), NamedFormats.CSR)
    assert t.pos(0) is None and t.crd(0) is None
    assert t.pos(1).tolist() == [0, 2, 4, 5, 6]
    assert t.crd(1).tolist() == [0, 1, 1, 3, 2, 3]
    assert t.val.tolist() == [1, 2, 3, 4, 5, 6]
    assert t.nse == 6


def test_reference_example_coo_storage():
    t = Tensor.from_dense(example_matrix(), NamedFormats.COO)
    assert t.pos(0).tolist() == [0, 6]
    assert t.crd(0).tolist() == [0, 0, 1, 1, 2, 3]
    assert t.crd(1).tolist() == [0, 1, 1, 3, 2, 3]
    assert t.pos(1) is None


@pytest.mark.parametrize("make", [sp.csr_array, sp.csr_matrix, sp.csc_array, sp.coo_array])
def test_scipy_views_share_memory(make):
    s = make(example_matrix())
    t = Tensor.from_package(s)
    assert np.shares_memory(t.val, s.data)
    back = t.to_package()
    assert type(back) is type(s)
    assert np.shares_memory(back.data, s.data)
    assert_same_array(t.to_dense(), example_matrix())


def test_convert_between_formats_keeps_values():
    a = example_matrix()
    t = Tensor.from_package(sp.csr_array(a))
    for fmt in (NamedFormats.CSC, NamedFormats.COO, NamedFormats.DCSR, NamedFormats.DIAJ):
        assert_same_array(t.convert(tensor_format=fmt).to_dense(), a)
