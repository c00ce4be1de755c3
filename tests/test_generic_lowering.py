"""The generic lowering (dataflow/dfg/index, docs/architecture.md#the-generic-lowering) and the
loop-nest passes `split` and `reorder` (dataflow/dfg/transform.py).

- Today's kernels are instances: the lowering of their statement and formats equals the kernel
  once written by hand (tests/hand_written_kernels.py), node for node.
- Formats with no kernel of their own get one: values equal numpy through map and simulate,
  both engines identical; the frontend routes diagonal and block-row operands to it.
- `split` keeps the values bit for bit, `reorder` keeps them within fp32 rounding; both keep
  cycles above the roofline and refuse what is illegal, naming the loop.
"""

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dataflow.arch import load_arch
from dataflow.dfg import transform
from dataflow.dfg.graph import DFGError
from dataflow.dfg.index import tensors as T
from dataflow.dfg.index.lower import CONCORDANT, index_kernel, lower_index
from dataflow.dfg.index.merge import EwOperand, coiterate
from dataflow.dfg.index.notation import parse_statement
from dataflow.dfg.index.program import index_program
from dataflow.dfg.lower import gemm_kernel, spmm_csr_kernel
from dataflow.dfg.lower_elementwise import dense_elementwise_kernel, lower_elementwise
from dataflow.dfg.lower_sddmm import sddmm_csr_kernel, sddmm_csr_vector_kernel
from dataflow.mapper import map_program
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.testing import assert_close
from dataflow.ust_frontend.index_operands import tensor_levels
from dataflow.ust_frontend.named import NamedFormats as NF
from dataflow.ust_frontend.ops import Matmul, matmul
from dataflow.ust_frontend.tensor import Tensor
from tests import hand_written_kernels as hw
from tests.conftest import ARCH_DIR
from tests.engine_checks import assert_engines_identical

DEFAULT = load_arch(ARCH_DIR / "default.yaml")
MM = "C[i,j] += A[i,k] * B[k,j]"


def same_kernel(a, b) -> list[str]:
    """The fields in which two kernels differ (node names, display labels, left out)."""
    diffs = [f for f in ("name", "loops", "buffers", "vector_var", "carried")
             if getattr(a, f) != getattr(b, f)]
    strip = [[dataclasses.replace(n, name="") for n in k.nodes] for k in (a, b)]
    if strip[0] != strip[1]:
        diffs.append("nodes")
    da, db = a.domain_arrays, b.domain_arrays
    if [n for n, _ in da] != [n for n, _ in db] or any(
            not np.array_equal(x, y) for (_, x), (_, y) in zip(da, db)):
        diffs.append("domain_arrays")
    return diffs


def _run(prog, engine="fast"):
    res = simulate_mapping(map_program(prog, DEFAULT), engine=engine)
    assert res.cycles >= res.roofline_cycles
    return res


# --- notation ------------------------------------------------------------------------------------

def test_notation_reads_reductions_and_refuses_what_it_cannot_lower():
    s = parse_statement("C[i,j] += A[i,k] * B[k,j]")
    assert s.reduction_vars == ("k",) and s.accumulate and not s.elementwise
    assert parse_statement("C[i,j] = A[i,j] + B[i,j]").elementwise
    for bad, why in (("C[i,j] = A[i,k]*B[k,j] + D[i,j]", "product or a sum"),
                     ("C[i] = A[i,i]", "diagonal"), ("C[i,j] -= A[i,j]", "only '=' and '.='"),
                     ("C[i,j] = A[i]", "appears on no"), ("C[i] = C[i]", "both read")):
        with pytest.raises(DFGError, match=why):
            parse_statement(bad)


# --- today's kernels are instances ---------------------------------------------------------------

POS = np.array([0, 2, 2, 5, 6])


@pytest.mark.parametrize("m,k,n", [(4, 6, 8), (3, 5, 1)])
def test_dense_and_csr_products_are_the_hand_written_kernels(m, k, n):
    assert same_kernel(gemm_kernel(m, k, n), hw.gemm_kernel(m, k, n)) == []
    assert same_kernel(spmm_csr_kernel(4, k, n, POS), hw.spmm_csr_kernel(4, k, n, POS)) == []
    assert same_kernel(sddmm_csr_kernel(4, k, 9, POS), hw.sddmm_csr_kernel(4, k, 9, POS)) == []
    # and directly from the notation, with the formats spelled out
    sddmm = index_kernel("C[i,j] = A[i,kk] * B[kk,j] * M[i,j]", {
        "A": T.dense((4, k)), "B": T.dense((k, 9), order=(1, 0), buffer="BT"),
        "M": T.csr((4, 9), POS), "C": T.csr((4, 9), POS)}, name="sddmm_csr")
    assert same_kernel(sddmm, hw.sddmm_csr_kernel(4, k, 9, POS)) == []


def test_the_vectorised_sddmm_is_the_lowering_plus_split_and_vectorise_reduction():
    got = sddmm_csr_vector_kernel(4, 16, 9, POS, 8)
    assert same_kernel(got, hw.sddmm_csr_vector_kernel(4, 16, 9, POS, 8)) == []
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((4, 16), np.float32), rng.standard_normal((16, 9), np.float32)
    crd = np.array([0, 3, 1, 2, 8, 4])
    tensors = {"A": T.dense((4, 16), val=a), "B": T.dense((16, 9), order=(1, 0), val=b.T,
                                                         buffer="BT"),
               "M": T.csr((4, 9), POS, crd, buffer="C_val")}
    prog = index_program("M[i,j] = A[i,kk] * B[kk,j]", tensors, name="sddmm")
    kern = transform.vectorise_reduction(transform.split(prog.kernels[0], "kk", 8), "kki")
    for k in (prog.kernels[0], kern):
        res = assert_engines_identical(map_program(dataclasses.replace(prog, kernels=(k,)),
                                                   DEFAULT))
        rows = np.repeat(np.arange(4), np.diff(POS))
        assert_close(res.output, np.einsum("pk,kp->p", a[rows].astype(np.float64), b[:, crd]))
    with pytest.raises(DFGError, match="already vectorises"):
        transform.vectorise_reduction(kern, "kko")
    scalar_gemm = dataclasses.replace(gemm_kernel(4, 4, 8), vector_var=None)
    with pytest.raises(DFGError, match="is not a sum over 'j'"):
        transform.vectorise_reduction(scalar_gemm, "j")
    with pytest.raises(DFGError, match="does not step along 'kk' contiguously"):
        transform.vectorise_reduction(scalar_gemm, "kk")  # B's column is n words apart


def _csr_op(a):
    m = sp.csr_matrix(a)
    m.sort_indices()
    return EwOperand(m.data.astype(np.float32), m.indptr.astype(np.int64),
                     m.indices.astype(np.int64))


@pytest.mark.parametrize("kind", ["add", "multiply"])
def test_element_wise_kernels_and_the_merge_are_the_hand_written_ones(kind):
    assert same_kernel(dense_elementwise_kernel(kind, 3, 8),
                       hw.dense_elementwise_kernel(kind, 3, 8)) == []
    a = _csr_op(np.array([[0, 2, 0], [3, 0, 1]]))
    b = _csr_op(np.array([[1, 2, 0], [0, 0, 4]]))
    d = EwOperand(np.ones(6, np.float32))
    op = "+" if kind == "add" else "*"
    for x, y in ((a, b), (a, d), (d, b)):
        co = coiterate(kind, (2, 3), x, y)
        sizes = tuple(o.val.size + (mp is not None) for o, mp in zip((x, y), co.maps))
        sparse_out = not x.is_dense and not y.is_dense
        want = hw.coiteration_kernel(kind, co, (x.is_dense, y.is_dense), sizes, sparse_out)
        levels = {n: T.dense((2, 3), val=o.val) if o.is_dense else
                  T.csr((2, 3), o.pos, o.crd, o.val) for n, o in (("A", x), ("B", y))}
        levels["C"] = T.csr((2, 3)) if sparse_out else T.dense((2, 3))
        got = lower_index(f"C[i,j] = A[i,j] {op} B[i,j]", levels, name=f"{kind}_coiterate")
        assert same_kernel(got.kernel, want) == []
        prog = lower_elementwise(kind, (2, 3), x, y)
        assert same_kernel(prog.kernels[0], want) == []


# --- formats with no kernel of their own ---------------------------------------------------------

FORMATS = {"CSC": NF.CSC, "DCSR": NF.DCSR, "COO": NF.COO, "DCSC": NF.DCSC, "CROW": NF.CROW,
           "BSR": NF.BSR((2, 2)), "DIAI": NF.DIAI, "SkewDIAI": NF.SkewDIAI}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_iterable_format_gets_a_kernel_with_values_equal_to_numpy(fmt):
    rng = np.random.default_rng(1)
    a = (sp.random(12, 10, density=0.3, random_state=2).toarray()).astype(np.float32)
    b = rng.standard_normal((10, 16)).astype(np.float32)
    levels = tensor_levels(Tensor.from_dense(a, FORMATS[fmt]))
    prog = index_program(MM, {"A": levels, "B": T.dense((10, 16), val=b)}, name=f"mm_{fmt}")
    res = _run(prog)
    assert_close(np.asarray(res.output).reshape(12, 16), a.astype(np.float64) @ b)


RANDOM_FORMATS = [NF.CSR, NF.CSC, NF.DCSR, NF.COO, NF.CCOL, NF.DIAI, NF.SkewDIAJ,
                  NF.BSR((2, 3)), NF.BSC((2, 2))]


@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 9), k=st.integers(1, 9), n=st.sampled_from([1, 3, 8]),
       density=st.floats(0.0, 1.0), fmt=st.sampled_from(range(len(RANDOM_FORMATS))),
       concordant=st.booleans(), seed=st.integers(0, 99))
def test_random_shapes_formats_and_orders_give_numpy_values(m, k, n, density, fmt, concordant,
                                                            seed):
    a = sp.random(m, k, density=density, random_state=seed).toarray().astype(np.float32)
    b = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    levels = tensor_levels(Tensor.from_dense(a, RANDOM_FORMATS[fmt]))
    try:
        prog = index_program(MM, {"A": levels, "B": T.dense((k, n), val=b)},
                             order=CONCORDANT if concordant else None)
    except DFGError as e:  # partial blocks or skew diagonals whose filler leaves C
        assert "reaches" in str(e)
        return
    res = simulate_mapping(map_program(prog, DEFAULT), engine="fast")
    assert_close(np.asarray(res.output).reshape(m, n), a.astype(np.float64) @ b)


def test_a_scatter_and_a_padded_gather_run_identically_on_both_engines():
    a = sp.random(9, 9, density=0.3, random_state=4).toarray().astype(np.float32)
    b = np.arange(72, dtype=np.float32).reshape(9, 8) / 7
    csc = index_program(MM, {"A": tensor_levels(Tensor.from_dense(a, NF.CSC)),
                             "B": T.dense((9, 8), val=b)})
    assert [n.op.value for n in csc.kernels[0].nodes][-1] == "scatter_acc"
    band = sp.diags([np.ones(9 - abs(o)) * (o + 3) for o in (-2, 0, 1)], [-2, 0, 1]).toarray()
    dia = index_program(MM, {"A": tensor_levels(Tensor.from_dense(band, NF.DIAI)),
                             "B": T.dense((9, 8), val=b)}, order=("k", "i", "j"))
    gather = next(n for n in dia.kernels[0].nodes if n.op.value == "gather")
    assert gather.addr.const == 2 * 8  # B padded by two rows each side: offsets -2 .. 1
    for prog, want in ((csc, a @ b), (dia, band @ b)):
        res = assert_engines_identical(map_program(prog, DEFAULT))
        assert_close(np.asarray(res.output).reshape(9, 8), want)


def test_the_vector_loop_is_chosen_as_the_hand_written_kernels_chose_it():
    assert gemm_kernel(4, 4, 8).vector_var == "j"
    assert sddmm_csr_kernel(4, 4, 8, POS).vector_var is None  # kk is the reduction
    band = tensor_levels(Tensor.from_dense(np.eye(8, k=1) + np.eye(8), NF.DIAI))
    spmv = index_kernel(MM, {"A": band, "B": T.dense((8, 1))}, order=("k", "i", "j"))
    assert spmv.vector_var == "i"  # a column loop of one iteration is no vector
    scalar = index_kernel(MM, {"A": T.dense((4, 4)), "B": T.dense((4, 8))}, vector=None)
    assert scalar.vector_var is None


def test_what_the_lowering_cannot_express_is_refused_by_name():
    csr = T.csr((4, 4), POS[:5] * 0 + np.array([0, 1, 2, 3, 4]), np.arange(4))
    with pytest.raises(DFGError, match="both sparse"):
        index_kernel(MM, {"A": csr, "B": csr})
    with pytest.raises(DFGError, match="loop 'p' .* before its parent loop 'k'"):
        index_kernel(MM, {"A": tensor_levels(Tensor.from_dense(np.eye(4), NF.CSC)),
                          "B": T.dense((4, 8))}, order=("i", "j", "k"))
    with pytest.raises(DFGError, match="not a permutation"):
        index_kernel(MM, {"A": T.dense((4, 4)), "B": T.dense((4, 8))}, order=("i", "j"))
    with pytest.raises(DFGError, match="output index 'i' reaches"):
        index_kernel(MM, {"A": tensor_levels(Tensor.from_dense(np.eye(4, k=1), NF.DIAJ)),
                          "B": T.dense((4, 8))})
    sampled = index_kernel("C[i,j] = A[i,j] * B[j,i]", {"A": csr, "B": T.dense((4, 4)),
                                                        "C": T.csr((4, 4))})
    assert sampled.nodes[-1].addr.terms == (("p", 1),)  # written at A's positions
    with pytest.raises(DFGError, match="sparse output needs"):
        index_kernel("C[j,i] = A[i,j] * B[j,i]", {"A": csr, "B": T.dense((4, 4)),
                                                 "C": T.csr((4, 4))})


# --- split and reorder ---------------------------------------------------------------------------

def _spmm_program(n=16):
    a = sp.random(8, 12, density=0.3, random_state=5, format="csr", dtype=np.float32)
    a.sort_indices()
    b = np.random.default_rng(2).standard_normal((12, n)).astype(np.float32)
    prog = index_program(MM, {"A": T.csr((8, 12), a.indptr, a.indices, a.data),
                              "B": T.dense((12, n), val=b)}, name="spmm")
    return prog, a.toarray().astype(np.float64) @ b


def test_split_strip_mines_without_changing_a_value():
    prog, want = _spmm_program()
    kern = transform.split(prog.kernels[0], "j", 8)
    assert [lp.var for lp in kern.loops] == ["i", "jo", "ji", "p"] and kern.vector_var == "ji"
    assert kern.nodes[-1].addr.terms == (("i", 16), ("jo", 8), ("ji", 1))
    before = _run(prog)
    after = assert_engines_identical(map_program(dataclasses.replace(prog, kernels=(kern,)),
                                                 DEFAULT))
    assert np.array_equal(after.output, before.output)  # the same iterations, in order
    assert after.cycles >= after.roofline_cycles
    with pytest.raises(DFGError, match="sparse loop 'p' hangs off it"):
        transform.split(prog.kernels[0], "i", 2)
    with pytest.raises(DFGError, match="not a multiple of 3"):
        transform.split(prog.kernels[0], "j", 3)


def test_reorder_that_moves_the_reduction_innermost_keeps_the_accumulator_in_its_register():
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((16, 64), (64, 32)))
    outer = index_program("C[i,j] += A[i,kk] * B[kk,j]", {"A": T.dense((16, 64), val=a),
                          "B": T.dense((64, 32), val=b)}, order=("i", "kk", "j"), name="gemm")
    inner = transform.reorder(outer.kernels[0], ("i", "j", "kk"))
    assert same_kernel(inner, gemm_kernel(16, 64, 32)) == []
    slow = _run(outer)
    fast = _run(dataclasses.replace(outer, kernels=(inner,)))
    for res in (slow, fast):
        assert_close(np.asarray(res.output).reshape(16, 32), a.astype(np.float64) @ b)
    assert fast.spm_writes * 8 <= slow.spm_writes  # one flush per C vector, not per (kk, vector)
    assert fast.cycles < slow.cycles


def test_split_and_reorder_keep_a_diagonal_product_in_the_register_across_diagonals():
    """Rows outermost, the diagonals innermost: y's vector is flushed once per row block, not
    once per diagonal (here the cycles grow: A's diagonals, stored one after the other, are
    then streamed in windows that span them all)."""
    m = 512
    band = sp.diags([np.arange(1, m + 1 - abs(o), dtype=float) for o in (-1, 0, 2)],
                    [-1, 0, 2]).toarray().astype(np.float32)
    x = np.linspace(-1, 1, m, dtype=np.float32).reshape(m, 1)
    prog = index_program(MM, {"A": tensor_levels(Tensor.from_dense(band, NF.DIAI)),
                              "B": T.dense((m, 1), val=x)}, order=("k", "i", "j"))
    assert [lp.var for lp in prog.kernels[0].loops] == ["p", "i", "j"]
    kern = transform.reorder(transform.split(prog.kernels[0], "i", 8), ("io", "ii", "j", "p"))
    diag_outer, row_outer = _run(prog), _run(dataclasses.replace(prog, kernels=(kern,)))
    for res in (diag_outer, row_outer):
        assert_close(np.asarray(res.output).reshape(m, 1), band.astype(np.float64) @ x)
    assert row_outer.spm_writes * 2 < diag_outer.spm_writes


def test_reorder_refuses_illegal_orders_naming_the_loop():
    prog, _ = _spmm_program()
    kern = prog.kernels[0]
    with pytest.raises(DFGError, match="loop 'p' is sparse and cannot be outermost"):
        transform.reorder(kern, ("p", "i", "j"))
    with pytest.raises(DFGError, match="loop 'j' is the vector loop"):
        transform.reorder(kern, ("j", "i", "p"))
    with pytest.raises(DFGError, match="not a permutation"):
        transform.reorder(kern, ("i", "j"))
    ew = dense_elementwise_kernel("add", 4, 8)
    assert transform.reorder(ew, ("i", "j")) is ew
    # a store that overwrites one word from several iterations keeps its order
    overwrite = index_kernel("y[i] = A[i,j]", {"A": T.dense((4, 8))}, vector=None)
    overwrite = dataclasses.replace(overwrite, nodes=tuple(
        dataclasses.replace(n, op=type(n.op).STORE) if n.op.accumulates else n
        for n in overwrite.nodes), carried=())
    with pytest.raises(DFGError, match="may write one word from two iterations"):
        transform.reorder(overwrite, ("j", "i"))
    with pytest.raises(DFGError, match="ties the iteration order"):
        transform.reorder(dataclasses.replace(kern, carried=((0, 3, 1),)), ("i", "p", "j"))


# --- the frontend ---------------------------------------------------------------------------------

def _band(m=24, n=24, offsets=(-2, 0, 3)):
    rng = np.random.default_rng(6)
    return sp.diags([rng.standard_normal(max(m, n)) for _ in offsets], list(offsets),
                    shape=(m, n), format="dia", dtype=np.float32)


@pytest.mark.parametrize("shape", [(24, 24), (16, 24), (24, 20)])
def test_the_frontend_runs_a_diagonal_matrix_times_a_vector_on_its_own_format(shape):
    a = _band(*shape)
    b = np.random.default_rng(7).standard_normal((shape[1], 8)).astype(np.float32)
    x = b[:, 0].copy()
    out, res = matmul(a, x, backend="sim", return_result=True)
    assert res.kernels[0].kernel == "spmm_dia"
    assert_close(out, a.toarray().astype(np.float64) @ x)
    for fmt in (NF.DIAI, NF.SkewDIAI):
        out, res = matmul(Tensor.from_dense(a.toarray(), fmt), x, backend="sim",
                          return_result=True)
        assert res.kernels[0].kernel == "spmm_dia"
        assert_close(out.to_dense(), a.toarray().astype(np.float64) @ x)
    out, res = matmul(a, b, backend="sim", return_result=True)
    assert res.kernels[0].kernel == "spmm_csr"  # more columns: CSR measured faster
    assert_close(out, a.toarray().astype(np.float64) @ b)


def test_block_rows_take_the_generic_path_and_other_formats_still_convert_to_csr():
    a = sp.random(16, 16, density=0.2, random_state=8).toarray().astype(np.float32)
    b = np.ones((16, 8), np.float32)
    for pkg, kernel in ((sp.bsr_matrix(a, blocksize=(4, 4)), "spmm_bsr"),
                        (sp.csc_matrix(a), "spmm_csr"), (sp.coo_matrix(a), "spmm_csr")):
        out, res = matmul(pkg, b, backend="sim", return_result=True)
        assert res.kernels[0].kernel == kernel
        assert_close(out, a.astype(np.float64) @ b)


def test_a_diagonal_plan_serves_new_values_even_where_a_stored_entry_becomes_zero():
    a = _band()
    b = np.ones(24, np.float32)
    with Matmul(a, b) as mm:
        mm.plan(backend="sim", cache=False)
        first = mm.execute("sim")
        assert_close(first, a.toarray().astype(np.float64) @ b)
        zeroed = a.copy()
        zeroed.data[1, 5:9] = 0  # same structure, some stored values now zero
        mm.reset_operands(zeroed)
        assert_close(mm.execute("sim"), zeroed.toarray().astype(np.float64) @ b)


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_on_the_generic_path_a_stored_zero_of_a_diagonal_meets_an_inf_as_ieee_says():
    """docs/conventions.md#nan-and-infinity: a diagonal's stored zero multiplies (as in
    scipy's own DIA product), while the numpy reference reads the nonzero entries only."""
    a = _band()
    a.data[1, 5] = 0  # A[5, 5], on the main diagonal, stored as zero
    b = np.ones(24, np.float32)
    b[5] = np.inf
    sim, ref = matmul(a, b, backend="sim"), matmul(a, b, backend="numpy")
    assert np.isnan(sim[5]) and np.isfinite(ref[5])
    assert np.isnan((a @ b)[5])  # scipy's DIA product agrees with the engine
    keep = np.ones_like(sim, bool)
    keep[5] = False
    assert np.array_equal(np.isinf(sim[keep]), np.isinf(ref[keep]))
