"""UST tensors: storage layouts, zero-copy interop, conversion and file loading."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dataflow.ust_frontend import FormatError, LayoutError, NamedFormats, Tensor, TensorFormat

# The 4x8 example of docs/references.md#universal-sparse-tensor.
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


# -- hypothesis: dense -> format -> dense for every named format ---------------------------

SMALL = st.integers(1, 7)


@st.composite
def sparse_arrays(draw, shape, *, nm: tuple[int, int] | None = None, integers=True):
    """A random array of the given shape, about half zeros (N:M-conforming when asked)."""
    size = int(np.prod(shape)) if shape else 1
    density = draw(st.sampled_from([0.0, 0.2, 0.5, 1.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    values = rng.integers(1, 9, size).astype(np.float64) if integers else rng.random(size)
    a = (values * (rng.random(size) < density)).reshape(shape)
    if nm is not None:
        n, m = nm
        rows, cols = a.shape
        for r in range(rows):
            for g in range(0, cols, m):
                group = np.flatnonzero(a[r, g:g + m])
                a[r, g + group[n:]] = 0
    return a


def _matrix(draw, *, nm=None):
    return draw(sparse_arrays((draw(SMALL), draw(SMALL)), nm=nm))


def _fixed(fmt):
    return lambda draw: (fmt, _matrix(draw))


def _vector(fmt):
    return lambda draw: (fmt, draw(sparse_arrays((draw(SMALL),))))


def _blocked(builder):
    def make(draw):
        return builder(draw(st.integers(1, 3)), draw(st.integers(1, 3))), _matrix(draw)
    return make


def _nm(draw):
    m = draw(st.integers(1, 4))
    n = draw(st.integers(1, m))
    return NamedFormats.NM(n, m), _matrix(draw, nm=(n, m))


def _delta(draw):
    return NamedFormats.DELTA(draw(st.integers(1, 3))), _matrix(draw)


def _ranked(builder, *args):
    def make(draw):
        rank = draw(st.integers(1, 3))
        shape = tuple(draw(st.integers(1, 4)) for _ in range(rank))
        return builder(rank, *args), draw(sparse_arrays(shape))
    return make


def _batched(fmt):
    def make(draw):
        shape = (draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4)))
        return fmt, draw(sparse_arrays(shape))
    return make


def _scalar(draw):
    return NamedFormats.Scalar, np.array(float(draw(st.integers(0, 3))))


NAMED_CASES = {
    "Scalar": _scalar,
    "DenseVector": _vector(NamedFormats.DenseVector),
    "SparseVector": _vector(NamedFormats.SparseVector),
    **{name: _fixed(getattr(NamedFormats, name)) for name in (
        "DenseMatrixRight", "DenseMatrixLeft", "COO", "CSR", "CSC", "DCSR", "DCSC", "CROW",
        "CCOL", "DIAI", "DIAJ", "SkewDIAI", "SkewDIAJ", "ELL")},
    "BSRRight": _blocked(NamedFormats.BSRRight),
    "BSRLeft": _blocked(NamedFormats.BSRLeft),
    "BSCRight": _blocked(NamedFormats.BSCRight),
    "BSCLeft": _blocked(NamedFormats.BSCLeft),
    "NM": _nm,
    "DELTA": _delta,
    "BatchedCSR": _batched(NamedFormats.BatchedCSR),
    "TorchBatchedCSR": _batched(NamedFormats.TorchBatchedCSR),
    "BatchedDIAIUniform": _batched(NamedFormats.BatchedDIAIUniform),
    "BatchedDIAINonUniform": _batched(NamedFormats.BatchedDIAINonUniform),
    "BatchedDenseMatrix": _batched(NamedFormats.BatchedDenseMatrix),
    "dense-C": _ranked(NamedFormats.dense, "C"),
    "dense-F": _ranked(NamedFormats.dense, "F"),
    "coo-rank": _ranked(NamedFormats.coo),
    "csf-rank": _ranked(NamedFormats.csf),
}


@pytest.mark.parametrize("case", sorted(NAMED_CASES))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_named_format_round_trip(case, data):
    fmt, a = data.draw(st.composite(lambda draw: NAMED_CASES[case](draw))())
    t = Tensor.from_dense(a, fmt).verify()
    assert t.tensor_format == fmt and t.shape == a.shape
    assert_same_array(t.to_dense(), a)
    assert t.nse == t.val.size
    # the stored-entry walk finds exactly the nonzeros
    _, values = t.entries()
    assert_same_array(np.sort(values), np.sort(a[a != 0]))
    # element access agrees with the dense array wherever something is stored
    index = tuple(data.draw(st.integers(0, n - 1)) for n in a.shape)
    got = t.get_value(index)
    if got is None:
        assert a[index] == 0
    else:
        assert got == a[index]
    # delta gaps fit their bit width
    for level, spec in enumerate(fmt.levels):
        if spec.type.format.value == "delta":
            assert ((t.crd(level) >= 0) & (t.crd(level) < 2 ** spec.type.params[0])).all()
    # and a second conversion lands on identical storage
    again = t.convert(tensor_format=fmt)
    for level in range(fmt.num_levels):
        for mine, theirs in ((t.pos(level), again.pos(level)), (t.crd(level), again.crd(level))):
            assert (mine is None) == (theirs is None)
            if mine is not None:
                assert mine.tolist() == theirs.tolist()
    assert_same_array(again.val, t.val)


def test_every_named_format_has_a_round_trip_case():
    attributes = {name for name, value in vars(NamedFormats).items()
                  if isinstance(value, TensorFormat)}
    builders = {"BSRRight", "BSRLeft", "BSCRight", "BSCLeft", "NM", "DELTA"}
    assert attributes | builders <= set(NAMED_CASES)


# -- against scipy --------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_csr_csc_coo_storage_equals_scipy(data):
    a = _matrix(data.draw)
    csr, csc, coo = sp.csr_array(a), sp.csc_array(a), sp.coo_array(a)
    t = Tensor.from_dense(a, NamedFormats.CSR)
    assert t.pos(1).tolist() == csr.indptr.tolist()
    assert t.crd(1).tolist() == csr.indices.tolist()
    assert_same_array(t.val, csr.data)
    t = Tensor.from_dense(a, NamedFormats.CSC)
    assert t.pos(1).tolist() == csc.indptr.tolist()
    assert t.crd(1).tolist() == csc.indices.tolist()
    assert_same_array(t.val, csc.data)
    t = Tensor.from_dense(a, NamedFormats.COO)
    assert t.pos(0).tolist() == [0, coo.nnz]
    assert t.crd(0).tolist() == coo.row.tolist()
    assert t.crd(1).tolist() == coo.col.tolist()
    # and the views of scipy's objects convert to the same storage
    for fmt, s in ((NamedFormats.CSR, coo), (NamedFormats.CSC, csr), (NamedFormats.COO, csc)):
        mine = Tensor.from_package(s).convert(tensor_format=fmt)
        ref = Tensor.from_dense(a, fmt)
        assert [None if x is None else x.tolist() for x in map(mine.crd, range(2))] == \
            [None if x is None else x.tolist() for x in map(ref.crd, range(2))]
        assert_same_array(mine.val, ref.val)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_bsr_storage_equals_scipy(data):
    r, c = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    shape = (r * data.draw(st.integers(1, 3)), c * data.draw(st.integers(1, 3)))
    a = data.draw(sparse_arrays(shape))
    ref = sp.bsr_array(a, blocksize=(r, c))
    view = Tensor.from_package(ref)
    assert_same_array(view.to_dense(), a)
    ref.sort_indices()  # scipy's dense -> BSR may leave block columns unsorted
    t = Tensor.from_dense(a, NamedFormats.BSRRight(r, c))
    assert t.pos(1).tolist() == ref.indptr.tolist()
    assert t.crd(1).tolist() == ref.indices.tolist()
    assert_same_array(t.val, ref.data.reshape(-1))
    assert Tensor.from_package(ref).tensor_format == NamedFormats.BSRRight(r, c)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_dia_storage_equals_scipy(data):
    a = _matrix(data.draw)
    ref = sp.dia_array(a)
    t = Tensor.from_dense(a, NamedFormats.DIAJ)
    offsets = np.sort(ref.offsets)
    assert t.pos(0).tolist() == [0, len(offsets)]
    assert t.crd(0).tolist() == offsets.tolist()
    ncols = a.shape[1]
    mine = t.val.reshape(len(offsets), ncols)
    theirs = np.zeros_like(mine)  # scipy may store fewer columns than the matrix has
    width = min(ncols, ref.data.shape[1])
    theirs[:, :width] = ref.data[np.argsort(ref.offsets), :width]
    for k, d in enumerate(offsets):
        valid = [j for j in range(ncols) if 0 <= j - d < a.shape[0]]
        assert_same_array(mine[k, valid], theirs[k, valid])
    view = Tensor.from_package(ref)
    assert_same_array(view.to_dense(), a)
    assert_same_array(view.convert(tensor_format=NamedFormats.CSR).to_dense(), a)


def test_dia_from_scipy_keeps_negative_offsets():
    a = np.diag([1.0, 2, 3]) + np.diag([4.0, 5], -1)
    t = Tensor.from_package(sp.dia_matrix(a))
    assert t.tensor_format == TensorFormat("(i, j) -> (j - i : compressed, j : range)")
    assert sorted(t.crd(0).tolist()) == [-1, 0]
    assert t.levels == (5, 3)
    assert_same_array(t.to_dense(), a)


# -- zero-copy views ------------------------------------------------------------------------


def test_numpy_views_share_memory():
    a = example_matrix()
    t = Tensor.from_package(a)
    assert t.tensor_format == NamedFormats.DenseMatrixRight
    assert np.shares_memory(t.val, a)
    assert np.shares_memory(t.to_package(), a)
    assert isinstance(t.to_package(), np.ndarray)
    f = np.asfortranarray(a)
    t = Tensor.from_package(f, NamedFormats.DenseMatrixLeft)
    assert np.shares_memory(t.val, f) and np.shares_memory(t.to_package(), f)
    assert_same_array(t.to_package(), a)
    # without a format the levels follow the memory order: a view (issue 15; this asserted a
    # copy before), as in nvmath-python; a format that disagrees with the layout still copies
    assert Tensor.from_package(f).tensor_format == NamedFormats.DenseMatrixLeft
    assert np.shares_memory(Tensor.from_package(f).val, f)
    assert not np.shares_memory(Tensor.from_package(f, NamedFormats.DenseMatrixRight).val, f)


SCIPY_MAKERS = {
    "csr_array": sp.csr_array, "csr_matrix": sp.csr_matrix,
    "csc_array": sp.csc_array, "csc_matrix": sp.csc_matrix,
    "coo_array": sp.coo_array, "coo_matrix": sp.coo_matrix,
    "bsr_array": lambda a: sp.bsr_array(a, blocksize=(2, 4)),
    "bsr_matrix": lambda a: sp.bsr_matrix(a, blocksize=(2, 2)),
    # full-width diagonals (scipy's own dense -> DIA may store fewer columns, then we copy)
    "dia_array": lambda a: sp.dia_array(_full_width_diagonals(a), shape=a.shape),
    "dia_matrix": lambda a: sp.dia_matrix(_full_width_diagonals(a), shape=a.shape),
}


def _full_width_diagonals(a):
    offsets = np.unique(np.subtract(*np.nonzero(a)[::-1]))
    data = np.zeros((len(offsets), a.shape[1]))
    for k, d in enumerate(offsets):
        for j in range(a.shape[1]):
            if 0 <= j - d < a.shape[0]:
                data[k, j] = a[j - d, j]
    return data, offsets


@pytest.mark.parametrize("kind", sorted(SCIPY_MAKERS))
def test_scipy_every_kind_is_a_view(kind):
    a = example_matrix()
    s = SCIPY_MAKERS[kind](a)
    t = Tensor.from_package(s).verify()
    assert np.shares_memory(t.val, s.data)
    if s.format in ("csr", "csc", "bsr"):
        assert np.shares_memory(t.pos(1), s.indptr) and np.shares_memory(t.crd(1), s.indices)
    elif s.format == "coo":
        assert np.shares_memory(t.crd(0), s.row) and np.shares_memory(t.crd(1), s.col)
    else:
        assert np.shares_memory(t.crd(0), s.offsets)
    back = t.to_package()
    assert type(back) is type(s)
    assert np.shares_memory(back.data, s.data)
    assert_same_array(back.toarray(), a)
    assert_same_array(t.to_dense(), a)


def test_torch_views_share_memory():
    torch = pytest.importorskip("torch")
    a = example_matrix()
    dense = torch.from_numpy(a.copy())
    cases = [dense, dense.to_sparse(), dense.to_sparse_csr(), dense.to_sparse_csc(),
             dense.to_sparse_bsr((2, 2)), dense.to_sparse_bsc((2, 4))]
    for x in cases:
        t = Tensor.from_package(x).verify()
        stored = x if x.layout == torch.strided else x.values()
        assert np.shares_memory(t.val, stored.numpy()), x.layout
        assert_same_array(t.to_dense(), a)
        back = t.to_package()
        assert back.layout == x.layout
        back_stored = back if back.layout == torch.strided else back.values()
        assert back_stored.data_ptr() == stored.data_ptr()
        assert_same_array(back.to_dense().numpy(), a)
    csr = dense.to_sparse_csr()
    t = Tensor.from_package(csr)
    assert np.shares_memory(t.pos(1), csr.crow_indices().numpy())
    assert np.shares_memory(t.crd(1), csr.col_indices().numpy())
    coo = dense.to_sparse()
    t = Tensor.from_package(coo)
    assert np.shares_memory(t.crd(0), coo.indices().numpy())
    assert t.convert(tensor_format=NamedFormats.CSR).pos(1).tolist() == [0, 2, 4, 5, 6]


def test_unsupported_package_is_rejected():
    with pytest.raises(TypeError):
        Tensor.from_package([[1, 2], [3, 4]])
    with pytest.raises(TypeError):
        Tensor.from_package(sp.lil_array(example_matrix()).tolil())


# -- conversion between random pairs of formats ---------------------------------------------

PAIR_FORMATS = [
    NamedFormats.CSR, NamedFormats.CSC, NamedFormats.COO, NamedFormats.DCSR, NamedFormats.DCSC,
    NamedFormats.CROW, NamedFormats.CCOL, NamedFormats.DIAI, NamedFormats.DIAJ,
    NamedFormats.SkewDIAI, NamedFormats.SkewDIAJ, NamedFormats.ELL, NamedFormats.DELTA(2),
    NamedFormats.BSRRight(2, 3), NamedFormats.BSRLeft(3, 1), NamedFormats.BSCLeft(2, 2),
    NamedFormats.NM(2, 4), NamedFormats.DenseMatrixRight, NamedFormats.DenseMatrixLeft,
    TensorFormat("(i, j) -> (j : compressed(nonunique), i : singleton)"),
    TensorFormat("(i, j) -> (i / 2 : compressed, j : compressed, i % 2 : dense)"),
    TensorFormat("(r, c) -> (c / 3 : dense, r : loose_compressed, c % 3 : compressed)"),
]


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(PAIR_FORMATS), st.sampled_from(PAIR_FORMATS), st.data())
def test_convert_random_pairs(source_format, target_format, data):
    a = _matrix(data.draw, nm=(2, 4))
    source = Tensor.from_dense(a, source_format)
    target = source.convert(tensor_format=target_format).verify()
    assert target.tensor_format == target_format
    assert_same_array(target.to_dense(), a)
    assert_same_array(target.convert(tensor_format=source_format).to_dense(), a)


def test_convert_to_custom_string_format():
    a = example_matrix()
    t = Tensor.from_dense(a, NamedFormats.CSR).convert(
        tensor_format="(i, j) -> (j : compressed, i : compressed)")
    assert t.tensor_format == NamedFormats.DCSC
    assert t.pos(0).tolist() == [0, 4] and t.crd(0).tolist() == [0, 1, 2, 3]
    assert t.pos(1).tolist() == [0, 1, 3, 4, 6] and t.crd(1).tolist() == [0, 0, 1, 2, 1, 3]


def test_structured_storage_pads_each_group_to_n():
    a = np.array([[1.0, 0, 0, 2, 0, 0, 0, 0]])
    t = Tensor.from_dense(a, NamedFormats.NM(2, 4))
    assert t.crd(2).tolist() == [0, 3, 0, 1]
    assert t.val.tolist() == [1, 2, 0, 0]
    assert t.get_value([0, 5]) == 0 and t.get_value([0, 6]) is None


def test_structured_rejects_too_many_nonzeros():
    a = np.array([[1.0, 2, 3, 0]])
    with pytest.raises(LayoutError, match="group 0 has 3 nonzeros"):
        Tensor.from_dense(a, NamedFormats.NM(2, 4))


def test_singleton_under_unique_parent_rejects_two_coordinates():
    with pytest.raises(LayoutError, match="singleton"):
        Tensor.from_dense(example_matrix(), "(i, j) -> (i : compressed, j : singleton)")


def test_delta_gap_coding_bridges_wide_gaps_with_zeros():
    a = np.zeros((1, 10))
    a[0, [2, 9]] = [5.0, 7.0]
    t = Tensor.from_dense(a, NamedFormats.DELTA(2))  # gaps of at most 3
    assert t.crd(1).tolist() == [2, 3, 3, 1]
    assert t.val.tolist() == [5, 0, 0, 7]
    assert_same_array(t.to_dense(), a)
    assert t.convert(tensor_format=NamedFormats.CSR).nse == 2


def test_ell_layout_gives_every_row_the_same_slot_width():
    t = Tensor.from_dense(example_matrix(), NamedFormats.ELL)
    assert t.pos(1).tolist() == [0, 2, 2, 4, 4, 5, 6, 7]
    assert t.crd(1).tolist() == [0, 1, 1, 3, 2, 0, 3, 0]


def test_coo_duplicates_are_summed_and_explicit_zeros_kept():
    s = sp.coo_array((np.array([1.0, 2.0, 0.0]), (np.array([0, 0, 1]), np.array([1, 1, 2]))),
                     shape=(2, 3))
    t = Tensor.from_package(s)
    csr = t.convert(tensor_format=NamedFormats.CSR)
    assert csr.pos(1).tolist() == [0, 1, 2] and csr.crd(1).tolist() == [1, 2]
    assert csr.val.tolist() == [3.0, 0.0]
    assert t.get_value([0, 1]) == 3.0 and t.get_value([1, 2]) == 0.0
    assert t.get_value([1, 1]) is None


def test_unsorted_scipy_indices_get_an_unordered_format():
    s = sp.csr_array((np.array([1.0, 2.0]), np.array([2, 0]), np.array([0, 2])), shape=(1, 3))
    t = Tensor.from_package(s)
    assert not t.tensor_format.is_ordered
    assert np.shares_memory(t.crd(1), s.indices)
    assert t.convert(tensor_format=NamedFormats.CSR).crd(1).tolist() == [0, 2]
    assert_same_array(t.to_dense(), np.array([[2.0, 0, 1]]))


def test_from_package_with_a_target_format_converts():
    a = example_matrix()
    t = Tensor.from_package(a, tensor_format=NamedFormats.CSR)
    assert t.pos(1).tolist() == [0, 2, 4, 5, 6]
    t = Tensor.from_package(sp.csr_array(a), tensor_format=NamedFormats.COO)
    assert t.tensor_format == NamedFormats.COO


def test_to_package_of_converted_tensors():
    a = example_matrix()
    for fmt, kind in ((NamedFormats.CSR, "csr"), (NamedFormats.CSC, "csc"),
                      (NamedFormats.COO, "coo"), (NamedFormats.DIAJ, "dia"),
                      (NamedFormats.BSRRight(2, 2), "bsr")):
        t = Tensor.from_dense(a, fmt)
        p = t.to_package()
        assert p.format == kind and np.shares_memory(p.data, t.val)
        assert_same_array(p.toarray(), a)
    with pytest.raises(ValueError, match="convert it"):
        Tensor.from_dense(a, NamedFormats.DCSR).to_package()


def test_describe_and_repr():
    t = Tensor.from_dense(example_matrix(), NamedFormats.CSR)
    text = t.describe()
    assert "format CSR" in text and "pos[5] int32" in text and "crd[6] int32" in text
    assert "(no storage)" in text and "nse 6" in text
    assert repr(t) == "Tensor(shape=(4, 8), format='CSR', nse=6, dtype=float64)"


def test_get_value_rejects_out_of_range_index():
    t = Tensor.from_dense(example_matrix(), NamedFormats.CSR)
    with pytest.raises(IndexError):
        t.get_value([4, 0])


@pytest.mark.parametrize("fmt, pos, crd, val, complaint", [
    (NamedFormats.CSR, [None, [0, 2, 1]], [None, [0, 1]], [1.0, 2.0], "non-decreasing"),
    (NamedFormats.CSR, [None, [0, 2, 2]], [None, [1, 0]], [1.0, 2.0], "strictly increasing"),
    (NamedFormats.CSR, [None, [0, 1, 2]], [None, [0, 5]], [1.0, 2.0], "outside the level"),
    (NamedFormats.CSR, [None, [0, 2]], [None, [0, 1]], [1.0, 2.0], "expected 3"),
    (NamedFormats.CSR, [None, [0, 1, 2]], [None, [0, 1]], [1.0], "val has 1 entries"),
    (NamedFormats.NM(1, 2), [None] * 3, [None, None, [0, 2]], [1.0, 2.0], "offsets outside"),
    (NamedFormats.DELTA(1), [None, [0, 1, 2]], [None, [2, 0]], [1.0, 2.0], "fit in 1 bits"),
    (NamedFormats.ELL, [None, [0, 1, 1, 0]], [None, [0, 1]], [1.0, 2.0], "not ranges"),
])
def test_verify_names_the_broken_level(fmt, pos, crd, val, complaint):
    arrays = [[None if a is None else np.array(a) for a in side] for side in (pos, crd)]
    t = Tensor(fmt, (2, 2), arrays[0], arrays[1], np.array(val))
    with pytest.raises(ValueError, match=complaint):
        t.verify()


def test_storage_is_checked_against_the_format():
    with pytest.raises(ValueError, match="needs a pos array"):
        Tensor(NamedFormats.CSR, (2, 2), [None, None], [None, np.array([0])], np.ones(1))
    with pytest.raises(FormatError):
        Tensor("(i) -> (j : dense)", (2,), [None], [None], np.ones(2))


# -- files ----------------------------------------------------------------------------------


def test_matrix_market_general(tmp_path):
    path = tmp_path / "a.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real general\n% a comment\n"
                    "3 4 3\n3 4 2.5\n1 1 1.0\n2 3 -4.0\n")
    t = Tensor.from_file(path)
    assert t.tensor_format == NamedFormats.COO and t.shape == (3, 4)
    assert t.crd(0).tolist() == [0, 1, 2] and t.crd(1).tolist() == [0, 2, 3]
    assert t.val.tolist() == [1.0, -4.0, 2.5]


@pytest.mark.parametrize("field", ["integer", "pattern"])
def test_matrix_market_symmetric(tmp_path, field):
    path = tmp_path / "s.mtx"
    value = {"integer": " 7", "pattern": ""}[field]
    path.write_text(f"%%MatrixMarket matrix coordinate {field} symmetric\n"
                    f"3 3 2\n1 1{value}\n3 1{value}\n")
    dense = Tensor.from_file(str(path)).to_dense()
    v = 7 if field == "integer" else 1
    assert_same_array(dense.astype(float), np.array([[v, 0, v], [0, 0, 0], [v, 0, 0]], float))


def test_frostt_tensor(tmp_path):
    path = tmp_path / "t.tns"
    path.write_text("# a 3-way tensor\n1 1 1 1.5\n2 3 1 -2\n1 1 2 3\n")
    t = Tensor.from_file(path)
    assert t.shape == (2, 3, 2)
    assert t.tensor_format == NamedFormats.coo(3)
    assert t.crd(0).tolist() == [0, 0, 1]
    assert t.crd(2).tolist() == [0, 1, 0]
    expected = np.zeros((2, 3, 2))
    expected[0, 0, 0], expected[1, 2, 0], expected[0, 0, 1] = 1.5, -2, 3
    assert_same_array(t.to_dense(), expected)
    assert_same_array(t.convert(tensor_format=NamedFormats.csf(3)).to_dense(), expected)


def test_frostt_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.tns"
    path.write_text("1 1 1.0\n0 2 2.0\n")
    with pytest.raises(ValueError, match=r"bad.tns:2: FROSTT coordinates are 1-based"):
        Tensor.from_file(path)
    with pytest.raises(ValueError, match="unknown tensor file type"):
        Tensor.from_file(tmp_path / "x.csv")
