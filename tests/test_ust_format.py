"""The UST format language: parsing, printing, semantic rules, level sizes, named formats."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataflow.ust_frontend import (
    Dim,
    FormatError,
    LevelFormat,
    LevelSpec,
    LevelType,
    NamedFormats,
    TensorFormat,
)

# -- parsing and printing ------------------------------------------------------------------


def test_parse_csr_levels():
    f = TensorFormat("(i, j) -> (i : dense, j : compressed)")
    assert f.dims == ("i", "j")
    assert f.num_dimensions == 2 and f.num_levels == 2
    assert f.levels[0] == LevelSpec(Dim("i"), LevelType(LevelFormat.DENSE))
    assert f.levels[1].type == LevelType(LevelFormat.COMPRESSED)
    assert f.is_identity
    assert f == NamedFormats.CSR
    assert str(f) == "(i, j) -> (i : dense, j : compressed)"
    assert repr(f) == "TensorFormat('(i, j) -> (i : dense, j : compressed)')"


def test_equality_ignores_dimension_names_and_labels():
    a = TensorFormat("(r, c) -> (c : dense, r : compressed)")
    assert a == NamedFormats.CSC and hash(a) == hash(NamedFormats.CSC)
    assert a != NamedFormats.CSR
    assert len({a, NamedFormats.CSC, TensorFormat.parse(str(a))}) == 1


def test_formats_are_immutable_and_pickle():
    f = NamedFormats.CSR
    with pytest.raises(AttributeError):
        f.dims = ("x",)
    again = pickle.loads(pickle.dumps(f))
    assert again == f and again.name == "CSR"


@pytest.mark.parametrize("source", [
    ("#sparse_tensor.encoding<{ map = (i, j) -> (i : dense, j floordiv 4 : dense, "
     "j mod 4 : structured[2, 4]) }>"),
    "(i, j) -> (i : dense, j // 4 : dense, j % 4 : structured[2, 4])",
    "(i,j)->(i:dense,j/4:dense,j%4:structured[2,4])",
    ("#sparse_tensor.encoding<{ map = (d0, d1) -> (d0 : dense, d1 floordiv 4 : dense, "
     "d1 mod 4 : structured[2, 4]), posWidth = 32, crdWidth = 8 }>"),
])
def test_mlir_and_nvmath_spellings_agree(source):
    assert TensorFormat(source) == NamedFormats.NM(2, 4)


def test_mlir_property_spellings():
    f = TensorFormat("#sparse_tensor.encoding<{ map = (i, j) -> "
                     "(i : compressed(nonunique, nonordered), j : singleton(soa)) }>")
    assert f.levels[0].type == LevelType(LevelFormat.COMPRESSED, unique=False, ordered=False)
    assert f.levels[1].type.soa
    assert str(f) == ("(i, j) -> (i : compressed(nonunique, unordered), "
                      "j : singleton(soa))")
    assert TensorFormat(str(f)) == f


def test_scalar_and_delta_and_loose():
    assert NamedFormats.Scalar.num_dimensions == 0 and NamedFormats.Scalar.num_levels == 0
    f = TensorFormat("(i, j) -> (i : dense, j : delta(4)(unordered))")
    assert f.levels[1].type == LevelType(LevelFormat.DELTA, ordered=False, params=(4,))
    assert TensorFormat(str(f)) == f
    g = TensorFormat("(i, j) -> (i : dense, j : loose_compressed(nonunique))")
    assert g.levels[1].type.format is LevelFormat.LOOSE_COMPRESSED


def test_programmatic_construction_is_validated():
    i, j = Dim("i"), Dim("j")
    f = TensorFormat([i, j], [LevelSpec(j, LevelType(LevelFormat.DENSE)),
                              LevelSpec(i, LevelType(LevelFormat.COMPRESSED))], name="mine")
    assert f == NamedFormats.CSC and f.name == "mine"
    with pytest.raises(FormatError) as err:
        TensorFormat([i, j], [LevelSpec(i, LevelType(LevelFormat.DENSE))])
    assert err.value.rule == "unused-dimension" and err.value.column is None


# -- hypothesis: generated valid formats round-trip through their canonical string ----------

_NAMES = st.sampled_from(["i", "j", "k", "l", "row", "col", "b0", "x_1"])


@st.composite
def valid_formats(draw) -> str:
    """A random valid format string, built so that every semantic rule holds."""
    rank = draw(st.integers(0, 4))
    names = draw(st.lists(_NAMES, min_size=rank, max_size=rank, unique=True))
    nbatch = draw(st.integers(0, max(0, rank - 1)))
    chains: list[list[tuple[str, str]]] = []  # each chain: (expr, role) in required order
    rest = names[nbatch:]
    k = 0
    while k < len(rest):
        kind = draw(st.sampled_from(["plain", "block", "addsub"]))
        if kind == "addsub" and k + 1 < len(rest):
            a, b = rest[k], rest[k + 1]
            op = draw(st.sampled_from(["+", "-"]))
            closed = draw(st.sampled_from([a, b]))
            chains.append([(f"{a} {op} {b}", "addsub"), (closed, "range")])
            k += 2
            continue
        if kind == "block":
            c = draw(st.integers(1, 5))
            chains.append([(f"{rest[k]} / {c}", "div"), (f"{rest[k]} % {c}", f"mod{c}")])
        else:
            chains.append([(rest[k], "plain")])
        k += 1
    order: list[tuple[str, str]] = []
    while chains:
        chain = chains[draw(st.integers(0, len(chains) - 1))]
        order.append(chain.pop(0))
        chains = [c for c in chains if c]
    props = st.lists(st.sampled_from(["nonunique", "unordered"]), unique=True, max_size=2)
    soa = draw(st.booleans())  # MLIR: only singleton levels take soa, and all of them or none
    levels, previous = [], None
    for name in names[:nbatch]:
        levels.append(f"{name} : batch")
        previous = "batch"
    for position, (expr, role) in enumerate(order):
        if role == "range":
            kind = "range"
        elif nbatch and position == 0:
            kind = "dense"
        else:
            choices = ["dense", "compressed", "loose_compressed", "delta"]
            if previous in ("compressed", "loose_compressed", "singleton", "delta"):
                choices.append("singleton")
            kind = draw(st.sampled_from(choices))
        text = kind
        if kind == "delta":
            text = f"delta({draw(st.integers(1, 16))})"
        if kind in ("compressed", "loose_compressed", "singleton", "delta"):
            chosen = draw(props)
            if kind == "singleton" and soa:
                chosen = [*chosen, "soa"]
            if chosen:
                text += f"({', '.join(chosen)})"
        levels.append(f"{expr} : {text}")
        previous = kind
    if order and order[-1][1].startswith("mod") and all(
            lvl.split(" : ")[1] in ("dense", "batch") for lvl in levels[:-1]) \
            and sum(" / " in lvl for lvl in levels) == 1 and draw(st.booleans()):
        m = int(order[-1][1][3:])
        n = draw(st.integers(1, m))
        levels[-1] = f"{order[-1][0]} : structured[{n}, {m}]"
    return f"({', '.join(names)}) -> ({', '.join(levels)})"


@settings(max_examples=300, deadline=None)
@given(valid_formats())
def test_generated_formats_round_trip(source):
    f = TensorFormat(source)
    canonical = str(f)
    again = TensorFormat(canonical)
    assert again == f
    assert str(again) == canonical
    assert hash(again) == hash(f)


@settings(max_examples=100, deadline=None)
@given(valid_formats(), st.data())
def test_dim2lvl_and_lvl2dim_are_inverse(source, data):
    f = TensorFormat(source)
    shape = tuple(data.draw(st.integers(1, 6)) for _ in f.dims)
    coords = [np.arange(n) for n in shape]
    grid = [g.ravel() for g in np.meshgrid(*coords, indexing="ij")] if shape else []
    lvl = f.dim2lvl(grid)
    back = f.lvl2dim(lvl)
    for a, b in zip(back, grid):
        assert np.array_equal(a, b)
    # every level coordinate lies within the level's bounds
    for (lo, hi), c in zip(f.level_bounds(shape), lvl):
        assert ((c >= lo) & (c < hi)).all()


# -- level sizes ---------------------------------------------------------------------------


def test_level_sizes():
    assert NamedFormats.DIAJ.level_sizes((4, 4)) == (7, 4)
    assert NamedFormats.DIAI.level_bounds((3, 5)) == ((-2, 5), (0, 3))
    assert NamedFormats.SkewDIAI.level_bounds((3, 5)) == ((0, 7), (0, 3))
    assert NamedFormats.BSRRight(2, 3).level_sizes((5, 9)) == (3, 3, 2, 3)
    assert NamedFormats.NM(2, 4).level_sizes((3, 8)) == (3, 2, 4)
    assert NamedFormats.CSC.level_sizes((3, 5)) == (5, 3)
    with pytest.raises(ValueError):
        NamedFormats.CSR.level_sizes((3,))


def test_dim2lvl_examples_match_nvmath_docs():
    f = NamedFormats.BSRRight(2, 2)
    assert [int(c) for c in f.dim2lvl([1, 2])] == [0, 1, 1, 0]
    assert [int(c) for c in NamedFormats.CSC.dim2lvl([0, 4])] == [4, 0]
    assert [int(c) for c in f.lvl2dim([0, 1, 1, 0])] == [1, 2]


# -- named formats match the examples in docs/references.md#universal-sparse-tensor ---------


@pytest.mark.parametrize("named, source", [
    (NamedFormats.CSR, "(i, j) -> (i : dense, j : compressed)"),
    (NamedFormats.CSC, "(i, j) -> (j : dense, i : compressed)"),
    (NamedFormats.COO, "(i, j) -> (i : compressed(nonunique), j : singleton)"),
    (NamedFormats.BSRRight(2, 3),
     "(i, j) -> (i / 2 : dense, j / 3 : compressed, i % 2 : dense, j % 3 : dense)"),
    (NamedFormats.DIAJ, "(i, j) -> (j - i : compressed, j : range)"),
    (NamedFormats.DIAI, "(i, j) -> (j - i : compressed, i : range)"),
    (NamedFormats.SkewDIAI, "(i, j) -> (i + j : compressed, i : range)"),
    (NamedFormats.NM(2, 4),
     "(i, j) -> (i : dense, j floordiv 4 : dense, j mod 4 : structured[2, 4])"),
    (NamedFormats.DCSR, "(i, j) -> (i : compressed, j : compressed)"),
    (NamedFormats.DenseMatrixLeft, "(i, j) -> (j : dense, i : dense)"),
    (NamedFormats.dense(3), "(a, b, c) -> (a : dense, b : dense, c : dense)"),
    (NamedFormats.DELTA(8), "(i, j) -> (i : dense, j : delta(8))"),
    # issue 15: BatchedCSR is nvmath's (a dense batch level); the batch-level one is torch's
    (NamedFormats.BatchedCSR, "(b, i, j) -> (b : dense, i : dense, j : compressed)"),
    (NamedFormats.TorchBatchedCSR, "(b, i, j) -> (b : batch, i : dense, j : compressed)"),
])
def test_named_formats_match_references(named, source):
    assert named == TensorFormat(source)
    assert TensorFormat(str(named)) == named


def test_named_format_properties():
    assert NamedFormats.CSR.is_identity and not NamedFormats.CSC.is_identity
    assert not NamedFormats.COO.is_unique and NamedFormats.CSR.is_unique
    assert NamedFormats.DenseMatrixLeft.is_dense and not NamedFormats.CSR.is_dense
    assert NamedFormats.BSR(2, 2) == NamedFormats.BSRRight(2, 2)
    assert NamedFormats.BSC(2, 2) != NamedFormats.BSRRight(2, 2)
    assert NamedFormats.coo(3).num_levels == 3


# -- one test per semantic rule: rule name, column and message fragment --------------------

RULE_CASES = [
    # (source, rule, the text at the reported column, message fragment)
    ("(i, j) -> (i : dense j : dense)", "syntax", "j : dense)", "expected ',' or ')'"),
    ("(i, j) -> (i : dense, j $ dense)", "syntax", "$ dense", "unexpected character"),
    ("(i, j) -> (i : dense, j : compresed)", "unknown-level-type", "compresed",
     "unknown level type 'compresed'"),
    ("(i, j) -> (i : dense, j : compressed(shiny))", "unknown-property", "shiny",
     "unknown level property"),
    ("(i, j) -> (i : dense, j : compressed(unique, nonunique))", "contradictory-properties",
     "nonunique", "contradictory level properties"),
    ("(i, j) -> (i : compressed(ordered, nonordered), j : dense)",
     "contradictory-properties", "nonordered", "contradictory"),
    ("(i, i) -> (i : dense, i : compressed)", "duplicate-dimension", "i) ->",
     "declared twice"),
    ("(i, j) -> (i : dense, k : compressed)", "undeclared-dimension", "k : compressed",
     "'k', which is not among"),
    ("(i, j) -> (i : dense)", "unused-dimension", "j) ->", "'j' is not used"),
    ("(i, j) -> (i : dense, i : compressed, j : dense)", "dimension-reused", "i : compressed",
     "already used"),
    ("(i, j) -> (i : dense, 3 : dense, j : dense)", "constant-level", "3 : dense",
     "needs a dimension"),
    ("(i, j) -> (i : dense(nonunique), j : compressed)", "level-properties", "i : dense",
     "take properties"),
    ("(b, i, j) -> (i : dense, b : batch, j : compressed)", "batch-outermost", "b : batch",
     "batch levels must all come before"),
    ("(b, i, j) -> (i : batch, b : dense, j : compressed)", "batch-identity", "i : batch",
     "plain dimension 'b'"),
    ("(b, i, j) -> (b : batch, i : compressed, j : compressed)", "batch-then-dense",
     "i : compressed", "must be dense"),
    ("(i, j) -> (i : dense, j : singleton)", "singleton-parent", "j : singleton",
     "must follow a compressed"),
    ("(i, j) -> (i : dense, j : delta(0))", "delta-bits", "j : delta", "bit width"),
    ("(i, j) -> (i : dense, j / 4 : dense, j % 4 : structured[3, 2])", "structured-n-m",
     "j % 4 : structured", "0 < n <= m"),
    ("(i, j) -> (j / 4 : dense, j % 4 : structured[2, 4], i : dense)", "structured-last",
     "j % 4 : structured", "must be the last level"),
    ("(i, j) -> (i : compressed, j / 4 : dense, j % 4 : structured[2, 4])",
     "structured-after-dense", "i : compressed", "must be dense"),
    ("(i, j) -> (i : dense, j / 4 : dense, j % 4 : structured[2, 8])", "structured-block",
     "j % 4 : structured", "must equal the block size"),
    ("(i, j) -> (j - i : compressed, j / 2 : range)", "range-operand", "j / 2 : range",
     "plain dimension"),
    ("(i, j) -> (i : dense, j : range)", "range-without-addsub", "j : range",
     "earlier, still open '+' or '-'"),
    ("(i, j, k) -> (i + j + k : compressed, k : range)", "addsub-operands", "i + j + k",
     "exactly two different plain dimensions"),
    ("(i, j) -> (j - j : compressed, i : range)", "addsub-operands", "j - j",
     "two different"),
    ("(i, j, k) -> (i + j : compressed, j - k : compressed, j : range, k : range)",
     "addsub-reuse", "j - k", "already used"),
    ("(i, j) -> (j - i : compressed, i : dense)", "dimension-reused", "i : dense",
     "already used"),
    ("(i, j) -> (j - i : compressed)", "addsub-unclosed", "j - i", "needs a later range"),
    ("(i, j) -> (i : dense, 4 / j : dense, j % 4 : dense)", "divmod-operands", "4 / j",
     "plain dimension on the left"),
    ("(i, j) -> (i : dense, j / 0 : dense, j % 0 : dense)", "divmod-constant", "j / 0",
     "must be > 0"),
    ("(i, j) -> (i : dense, j / -2 : dense, j % -2 : dense)", "divmod-constant", "j / -2",
     "must be > 0"),
    ("(i, j) -> (i : dense, j / 2 : dense, j / 3 : dense, j % 2 : dense)", "div-reuse",
     "j / 3", "divided more than once"),
    ("(i, j) -> (i : dense, j / 2 : compressed)", "div-unmatched", "j / 2",
     "needs a later 'j % 2'"),
    ("(i, j) -> (i : dense, j / 2 : dense, j % 3 : dense)", "mod-unmatched", "j % 3",
     "does not match the earlier 'j / 2'"),
    ("(i, j) -> (i : dense, j % 2 : dense)", "mod-unmatched", "j % 2",
     "needs an earlier 'j / 2'"),
    ("#sparse_tensor.encoding<{ posWidth = 32 }>", "syntax", "{ posWidth", "no 'map"),
    # issue 15: MLIR's rules and spellings
    ("(i, j, k) -> (i : compressed(nonunique), j : singleton(soa, nonunique), k : singleton)",
     "soa-mixed", "k : singleton", "must all be soa"),
    ("(i, j) -> (i : compressed(nonunique, soa), j : singleton(soa))", "soa-singleton",
     "i : compressed", "only singleton levels"),
    ("(i, j, k) -> (i / 2 : dense, i % 2 : dense, j : dense, k / 4 : dense, "
     "k % 4 : structured[2, 4])", "structured-one-block", "i / 2", "only its own dimension"),
    ("(i, j) -> (i * j : dense, i : dense, j : compressed)", "mul-operands", "i * j",
     "product of positive constants"),
    ("(i, j) -> (i * 0 : dense, i : dense, j : compressed)", "mul-operands", "i * 0",
     "positive"),
    ("[s0](i, j) -> (i + s0 : dense, i : dense, j : compressed)", "symbol-use", "i + s0",
     "only be a factor"),
    ("{a, b} (i = a, j = a) -> (a = i : dense, b = j : compressed)", "binding-mismatch",
     "j = a", "does not invert"),
    ("{l0} (i, j) -> (l0 = i : dense, l1 = j : compressed)", "level-var-undeclared",
     "l1 = j", "not declared"),
    ("{l1, l0} (i, j) -> (l0 = i : dense, l1 = j : compressed)", "level-var-order",
     "l0 = i", "declared as level 1"),
    ("{l0, l1, l2} (i, j) -> (l0 = i : dense, l1 = j : compressed)", "level-var-count",
     "-> (l0", "3 level variables declared but 2"),
    ("(i : #sparse_tensor<slice(-1, ?, 1)>) -> (i : dense)", "slice-value", "-1, ?",
     "offsets are >= 0"),
    ("#sparse_tensor.encoding<{ map = (i) -> (i : dense), posWidth = 42 }>", "index-width",
     "42 }", "one of 0, 8, 16, 32, 64"),
    ("#sparse_tensor.encoding<{ key = 1 }>", "encoding-key", "key = 1", "unknown encoding key"),
    ("(i) -> (" + "(" * 40 + "i" + ")" * 40 + " : dense)", "too-complex", "(" * 8,
     "nested deeper"),
]


@pytest.mark.parametrize("source, rule, at, fragment", RULE_CASES,
                         ids=[f"{c[1]}-{n}" for n, c in enumerate(RULE_CASES)])
def test_semantic_rule(source, rule, at, fragment):
    with pytest.raises(FormatError) as err:
        TensorFormat(source)
    e = err.value
    assert e.rule == rule
    assert e.column is not None and source[e.column:].startswith(at), (e.column, str(e))
    message = str(e)
    assert fragment in message
    assert f"[{rule}]" in message and repr(source) in message
    # the caret sits under the offending column of the quoted source
    quoted, caret = message.splitlines()[-2:]
    assert caret.index("^") == quoted.index(repr(source)) + 1 + e.column


def test_every_rule_has_a_test():
    import re

    from dataflow.ust_frontend import parser, rules

    declared = {"syntax"}  # the parser's default rule
    for module in (parser, rules):
        with open(module.__file__) as handle:
            text = handle.read()
        declared |= set(re.findall(r'(?:fail\(|rule=|rule = )"([a-z-]+)"', text))
    assert declared == {case[1] for case in RULE_CASES}


def test_format_error_is_a_value_error():
    with pytest.raises(ValueError):
        TensorFormat("(i) -> (i : sparse)")
