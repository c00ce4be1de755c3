"""Issue 15: MLIR sparse_tensor spellings, as a corpus of encodings written after MLIR's own
round-trip, invalid-encoding and integration tests; plus a fuzz of the parser."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataflow import TensorFormat as TopLevelTensorFormat
from dataflow.ust_frontend import (
    Dimension,
    FormatError,
    LevelFormat,
    LevelProperty,
    NamedFormats,
    Tensor,
    TensorFormat,
)
from dataflow.ust_frontend.storage import LayoutError

VALID = [
    "(d0) -> (d0 : compressed)",
    "(d0, d1) -> (d0 : dense, d1 : compressed)",
    "(d0, d1) -> (d1 : dense, d0 : compressed)",
    "(d0, d1) -> (d1 : compressed, d0 : compressed)",
    "(d0, d1) -> (d0 : compressed, d1 : compressed)",
    "(d0, d1) -> (d0 : compressed, d1 : dense)",
    "(d0, d1) -> (d0 : dense, d1 : dense)",
    "(d0, d1, d2) -> (d2 : dense, d0 : compressed, d1 : compressed)",
    "(d0, d1, d2) -> (d0 : compressed, d1 : compressed, d2 : compressed)",
    "(d0, d1, d2) -> (d0 : dense, d1 : dense, d2 : dense)",
    "(d0, d1) -> (d0 : compressed(nonunique, nonordered), d1 : singleton(nonordered))",
    "(d0, d1, d2) -> (d0 : dense, d1 : loose_compressed(nonunique), d2 : singleton)",
    "(d0, d1) -> (d0 : compressed(nonunique), d1 : singleton)",
    "(d0, d1, d2) -> (d0 : compressed(nonunique), d1 : singleton(nonunique), d2 : singleton)",
    "(d0, d1, d2) -> (d0 : compressed(nonunique), d1 : singleton(nonunique, soa), "
    "d2 : singleton(soa))",
    "(d0, d1) -> (d0 : dense, d1 : loose_compressed)",
    "(d0, d1) -> (d0 : dense, d1 : compressed(nonordered))",
    "(i, j) -> (i floordiv 2 : dense, j floordiv 3 : compressed, i mod 2 : dense, "
    "j mod 3 : dense)",
    "(i, j, k) -> (i floordiv 2 : dense, j floordiv 3 : dense, k floordiv 4 : compressed, "
    "i mod 2 : dense, j mod 3 : dense, k mod 4 : dense)",
    "{l0, l1} (d0 = l0, d1 = l1) -> (l0 = d0 : dense, l1 = d1 : compressed)",
    "{il, jl, ii, jj} (i = il * 2 + ii, j = jl * 3 + jj) -> (il = i floordiv 2 : dense, "
    "jl = j floordiv 3 : compressed, ii = i mod 2 : dense, jj = j mod 3 : dense)",
    "[s0](d0, d1) -> (d0 * (s0 * 4) : dense, d0 : dense, d1 : compressed)",
    "(d0 : #sparse_tensor<slice(1, 4, 1)>, d1 : #sparse_tensor<slice(1, 4, 2)>) -> "
    "(d0 : dense, d1 : compressed)",
    "(d0 : #sparse_tensor<slice(1, ?, 1)>, d1 : #sparse_tensor<slice(?, 4, 2)>) -> "
    "(d0 : dense, d1 : compressed)",
    "(i, j) -> (i : dense, j floordiv 4 : dense, j mod 4 : structured[2, 4])",
    "(i, j, k) -> (i : dense, j : dense, k floordiv 4 : dense, k mod 4 : structured[2, 4])",
    "(i, j, k) -> (i : dense, k floordiv 4 : dense, j : dense, k mod 4 : structured[2, 4])",
    "(d0, d1, d2, d3) -> (d0 : dense, d1 : dense, d2 : dense, d3 : compressed)",
    "(d0, d1, d2) -> (d0 : batch, d1 : dense, d2 : compressed)",
    "(d0, d1) -> (d1 - d0 : compressed, d0 : range)",
    "() -> ()",
    "#sparse_tensor.encoding<{ map = (d0, d1) -> (d0 : dense, d1 : compressed), "
    "posWidth = 32, crdWidth = 32 }>",
    "#sparse_tensor.encoding<{ map = (d0, d1) -> (d1 : dense, d0 : compressed), "
    "posWidth = 0, crdWidth = 64 }>",
    "#sparse_tensor.encoding<{ map = (d0, d1) -> (d0 : dense, d1 : compressed), "
    "explicitVal = 1.0 : f64, implicitVal = 0.0 : f64 }>",
    "#sparse_tensor.encoding<{ map = (i, j) -> (i : dense, j floordiv 4 : dense, "
    "j mod 4 : structured[2, 4]), crdWidth = 8 }>",
]

INVALID = [
    # wrongly accepted before issue 15
    "(d0, d1, d2) -> (d0 : compressed(nonunique), d1 : singleton(soa, nonunique), "
    "d2 : singleton)",
    "(d0, d1) -> (d0 : compressed(nonunique, soa), d1 : singleton(soa))",
    "(i, j, k) -> (i floordiv 2 : dense, i mod 2 : dense, j : dense, k floordiv 4 : dense, "
    "k mod 4 : structured[2, 4])",
    # after MLIR's invalid_encoding tests
    "(d0) -> (d0 : dense, d1 : compressed)",
    "(d0, d1) -> (d0 : dense, d0 : compressed)",
    "(d0, d1) -> (d0 : strange, d1 : compressed)",
    "{l0, l1, l2} (d0, d1) -> (l0 = d0 : dense, l1 = d1 : compressed)",
    "{l0} (d0, d1) -> (l0 = d0 : dense, l1 = d1 : compressed)",
    "{l1, l0} (d0, d1) -> (l0 = d0 : dense, l1 = d1 : compressed)",
    "(d0 : #sparse_tensor<slice(-1, ?, 1)>, d1 : #sparse_tensor<slice(?, 4, 2)>) -> "
    "(d0 : dense, d1 : compressed)",
    "(d0 : #sparse_tensor<slice(1, 0, 1)>) -> (d0 : dense)",
    "#sparse_tensor.encoding<{ map = (d0) -> (d0 : dense), posWidth = 42 }>",
    "#sparse_tensor.encoding<{ map = (d0) -> (d0 : dense), crdWidth = 128 }>",
    "#sparse_tensor.encoding<{ key = 1 }>",
    "#sparse_tensor.encoding<{ lvlTypes = [ \"dense\", \"compressed\" ] }>",
    "(d0, d1) -> (d0 : dense, d1 : singleton)",
    "(d0, d1) -> (d0 : singleton, d1 : compressed)",
    "(d0, d1) -> (d0 : dense(nonunique), d1 : compressed)",
    "(d0, d1) -> (d0 : dense, d1 : compressed(nonunique, unique))",
    "(i, j) -> (i : dense, j floordiv 4 : dense, j mod 4 : structured[2, 8])",
    "(i, j) -> (i : dense, j floordiv 4 : dense, j mod 4 : structured[5, 4])",
    "(i, j) -> (i : compressed, j floordiv 4 : dense, j mod 4 : structured[2, 4])",
    "(i, j) -> (i : dense, j floordiv 4 : dense, j mod 4 : block2_4)",
    "(i, j) -> (i floordiv 2 : dense, j : compressed)",
    "(i, j) -> (i mod 2 : dense, j : compressed)",
    "(d0, d1) -> (d0 : dense)",
    "(d0, d0) -> (d0 : dense, d0 : dense)",
    "[s0](d0, d1) -> (d0 * (s1 * 4) : dense, d0 : dense, d1 : compressed)",
    "{a, b} (i = a, j = a) -> (a = i : dense, b = j : compressed)",
    "(d0, d1) -> (d0 : dense, d1 : compressed",
    "(d0, d1) -> (d0 : dense d1 : compressed)",
    "(d0, d1) (d0 : dense, d1 : compressed)",
    "#sparse_tensor.encoding<{ map = (d0) -> (d0 : dense) ",
]


def test_corpus_counts():
    accepted = sum(_parses(s) for s in VALID)
    refused = sum(not _parses(s) for s in INVALID)
    assert (accepted, refused) == (len(VALID), len(INVALID))


def _parses(source: str) -> bool:
    try:
        TensorFormat(source)
    except FormatError:
        return False
    return True


@pytest.mark.parametrize("source", VALID)
def test_valid_spellings_round_trip_through_the_mlir_printer(source):
    f = TensorFormat(source)
    for text in (f.to_mlir(), str(f)):  # the map alone: the same format, widths left out
        assert TensorFormat(text) == f and TensorFormat(text).to_mlir() == f.to_mlir()
    whole = TensorFormat(f.to_mlir(encoding=True))
    assert whole == f and whole.to_mlir(encoding=True) == f.to_mlir(encoding=True)
    assert "/" not in f.to_mlir() and "%" not in f.to_mlir() and "unordered" not in f.to_mlir()


@pytest.mark.parametrize("source", INVALID)
def test_invalid_spellings_name_the_column(source):
    with pytest.raises(FormatError) as err:
        TensorFormat(source)
    assert err.value.column is not None
    assert f"(column {err.value.column})" in str(err.value)


def test_mlir_printer_spelling_and_widths():
    f = TensorFormat("#sparse_tensor.encoding<{ map = (i, j) -> (i : compressed(nonunique, "
                     "nonordered), j : singleton), posWidth = 32, crdWidth = 16 }>")
    assert f.to_mlir(encoding=True) == (
        "#sparse_tensor.encoding<{ map = (d0, d1) -> (d0 : compressed(nonunique, nonordered), "
        "d1 : singleton), posWidth = 32, crdWidth = 16 }>")
    assert f.pos_dtype is np.int32 and f.crd_dtype is np.int16
    assert NamedFormats.CSR.pos_dtype is None
    assert NamedFormats.BSRRight(2, 3).to_mlir() == (
        "(d0, d1) -> (d0 floordiv 2 : dense, d1 floordiv 3 : compressed, d0 mod 2 : dense, "
        "d1 mod 3 : dense)")
    assert TensorFormat(NamedFormats.CSR.to_mlir(), pos_width=64).pos_dtype is np.int64


def test_level_variables_and_bindings_mean_the_plain_map():
    explicit = TensorFormat(VALID[20])
    assert explicit == NamedFormats.BSRRight((2, 3))
    assert TensorFormat(VALID[19]) == NamedFormats.CSR


def test_legacy_block_spelling_hints_structured():
    with pytest.raises(FormatError, match=re.escape("structured[2, 4]")):
        TensorFormat("(i, j) -> (i : dense, j floordiv 4 : dense, j mod 4 : block2_4)")


# -- robustness ------------------------------------------------------------------------------


def test_deep_and_long_expressions_are_format_errors():
    deep = "(i) -> (" + "(" * 1000 + "i" + ")" * 1000 + " : dense)"
    long_sum = "(i, j) -> (" + " + ".join(["i"] * 10_000) + " : compressed, i : range)"
    for source in (deep, long_sum):
        with pytest.raises(FormatError) as err:
            TensorFormat(source)
        assert err.value.rule == "too-complex" and len(str(err.value)) < 600


def test_errors_echo_a_bounded_window():
    source = "(i) -> (i : dense" + ", i : dense" * 1000 + " x)"
    with pytest.raises(FormatError) as err:
        TensorFormat(source)
    message = str(err.value)
    assert len(message) < 600 and f"(column {err.value.column})" in message
    quoted, caret = message.splitlines()[-2:]
    assert quoted[caret.index("^")] == source[err.value.column]


@pytest.mark.parametrize("value", [42, None, 3.5, b"(i) -> (i : dense)", {"i": 1}])
def test_wrong_types_are_format_errors(value):
    with pytest.raises(FormatError):
        TensorFormat(value)


# -- the object spelling -----------------------------------------------------------------------


def test_dimension_objects_build_named_formats():
    first, second = Dimension(dimension_name="first"), Dimension(dimension_name="second")
    bsr = TensorFormat([first, second], {first // 2: LevelFormat.DENSE,
                                         second // 3: LevelFormat.COMPRESSED,
                                         first % 2: LevelFormat.DENSE,
                                         second % 3: LevelFormat.DENSE}, name="BSR")
    assert bsr == NamedFormats.BSRRight((2, 3)) == NamedFormats.BSRRight(2, 3)
    assert bsr.name == "BSR" and TopLevelTensorFormat is TensorFormat
    coo = TensorFormat([first, second], {first: (LevelFormat.COMPRESSED,
                                                 LevelProperty.NONUNIQUE),
                                         second: LevelFormat.SINGLETON})
    assert coo == NamedFormats.COO
    dia = TensorFormat([first, second], {second - first: LevelFormat.COMPRESSED,
                                         first: LevelFormat.RANGE})
    assert dia == NamedFormats.DIAI
    nm = TensorFormat([first, second], {first: LevelFormat.DENSE,
                                        second // 4: LevelFormat.DENSE,
                                        second % 4: (LevelFormat.STRUCTURED, (2, 4))})
    assert nm == NamedFormats.NM(2, 4)
    with pytest.raises(FormatError):
        TensorFormat([first, second], {first: "dense", second: LevelFormat.DENSE})


def test_nvmath_named_formats():
    N = NamedFormats
    assert N.BatchedCSR == TensorFormat("(b, i, j) -> (b : dense, i : dense, j : compressed)")
    assert N.TorchBatchedCSR.levels[0].format is LevelFormat.BATCH
    assert N.CSRd(2) == N.CSR and N.CSCd(2) == N.CSC and N.COOd(2) == N.COO
    assert N.CSFd(3) == N.csf(3) and N.DensedRight(2) == N.DenseMatrixRight
    assert N.DensedLeft(2) == N.DenseMatrixLeft
    assert N.BSRRightd((2, 3)) == N.BSRRight(2, 3) and N.BSCRightd((2, 3)) == N.BSCRight(2, 3)
    assert N.BSR3((2, 2, 2)).num_levels == 6 and N.BlockVector(4).num_levels == 2
    assert N.BatchedDIAIUniform.num_dimensions == 3 == N.BatchedDIAINonUniform.num_dimensions
    assert LevelProperty.NONORDERED is LevelProperty.UNORDERED


# -- fuzz ------------------------------------------------------------------------------------

_SEEDS = VALID + INVALID
_PIECES = ["(", ")", ",", ":", "->", "=", "{", "}", "[", "]", "*", "mod", "floordiv", "d0",
           "l0", "s0", "-", "+", "?", "#sparse_tensor<slice(1, 4, 1)>", "soa", "9" * 30, " "]


@st.composite
def mutated(draw) -> str:
    text = draw(st.sampled_from(_SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "insert", "swap", "repeat"]))
        at = draw(st.integers(0, len(text)))
        end = draw(st.integers(at, min(len(text), at + 12)))
        if kind == "delete":
            text = text[:at] + text[end:]
        elif kind == "insert":
            piece = draw(st.sampled_from(_PIECES) | st.text(max_size=3))
            text = text[:at] + piece + text[at:]
        elif kind == "swap" and end > at:
            other = draw(st.integers(0, max(0, len(text) - (end - at))))
            chunk = text[at:end]
            rest = text[:at] + text[end:]
            text = rest[:other] + chunk + rest[other:]
        else:
            text = text[:at] + text[at:end] * draw(st.integers(2, 50)) + text[end:]
    return text


@settings(max_examples=300, deadline=None)
@given(mutated())
def test_fuzzed_spellings_raise_only_format_errors(source):
    try:
        f = TensorFormat(source)
    except FormatError as err:
        assert len(str(err)) < 1200
        return
    assert TensorFormat(f.to_mlir(encoding=True)) == f


def test_index_widths_are_the_index_dtypes():
    """posWidth / crdWidth of the MLIR attribute decide the dtypes of the stored arrays, and an
    index that does not fit its width is refused (issue 15, section 1)."""
    fmt = TensorFormat("#sparse_tensor.encoding<{ map = (i, j) -> (i : dense, j : compressed), "
                       "posWidth = 16, crdWidth = 8 }>")
    a = np.eye(6, dtype=np.float32)
    t = Tensor.from_dense(a, fmt)
    assert t.pos(1).dtype == np.int16 and t.crd(1).dtype == np.int8
    assert np.array_equal(t.to_dense(), a)
    assert t.convert(tensor_format=fmt).crd(1).dtype == np.int8
    wide = np.zeros((2, 300), np.float32)
    wide[0, 200] = 1.0
    with pytest.raises(LayoutError, match="crdWidth"):
        Tensor.from_dense(wide, fmt)
