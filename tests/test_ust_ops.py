"""Frontend ops: matmul (GEMM, GEMV, SpMM, SpMV, SpGEMM), sddmm, add/multiply, with
plan/execute, semirings and prolog/epilog; numpy is the definition, sim is held to it."""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dataflow.testing import assert_close
from dataflow.ust_frontend import NamedFormats, Tensor
from dataflow.ust_frontend.cache import PlanCache
from dataflow.ust_frontend.ops import (
    Matmul,
    PlanMismatchError,
    Sddmm,
    add,
    matmul,
    multiply,
    sddmm,
    semiring_matmul,
)


@pytest.fixture
def cache(tmp_path):
    return PlanCache(tmp_path / "plans")


@pytest.fixture(autouse=True)
def _private_default_cache(tmp_path, monkeypatch):
    # function forms use the default cache; keep it out of the user's ~/.cache
    monkeypatch.setenv("DATAFLOW_CACHE_DIR", str(tmp_path / "default"))


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def rand_sparse(m, n, density=0.3, seed=1, fmt="csr"):
    return sp.random(m, n, density=density, format=fmt, dtype=np.float32, random_state=seed)


def dense64(x):
    return x.toarray().astype(np.float64) if sp.issparse(x) else np.asarray(x, np.float64)


CASES = {
    "gemm": (lambda: rand((12, 10)), lambda: rand((10, 6), 1)),
    "gemv": (lambda: rand((12, 10)), lambda: rand((10,), 1)),
    "spmm_csr": (lambda: rand_sparse(12, 10), lambda: rand((10, 6), 1)),
    "spmm_coo": (lambda: Tensor.from_package(rand_sparse(12, 10, fmt="coo")),
                 lambda: rand((10, 6), 1)),
    "spmm_csc": (lambda: rand_sparse(12, 10, fmt="csc"), lambda: rand((10, 6), 1)),
    "spmv": (lambda: rand_sparse(12, 10), lambda: rand((10,), 1)),
    "spgemm": (lambda: rand_sparse(12, 10), lambda: rand_sparse(10, 6, seed=3)),
}


@pytest.mark.parametrize("backend", ["numpy", "sim"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matmul_kinds_match_definition(case, backend, cache):
    ma, mb = CASES[case]
    a, b = ma(), mb()
    op = Matmul(a, b)
    if backend == "sim":
        op.plan(backend="sim", cache=cache)
    out = op.execute(backend)
    out = out.to_dense() if isinstance(out, Tensor) else out
    ad = a.to_dense() if isinstance(a, Tensor) else dense64(a)
    expect = ad.astype(np.float64) @ dense64(b)
    assert_close(out, expect, dtype=np.float32)
    assert op.op.startswith("matmul:")
    if backend == "sim":
        assert op.last_result.cycles > 0


def test_kind_names_and_notes(cache):
    assert Matmul(rand_sparse(4, 5), rand((5,))).op == "matmul:spmv"
    assert Matmul(rand((4, 5)), rand((5,))).op == "matmul:gemv"
    op = Matmul(rand_sparse(4, 5), rand_sparse(5, 3))
    assert op.op == "matmul:spgemm"
    plan = op.plan(cache=cache)
    assert any("Gustavson" in n for n in plan.notes)
    assert "spgemm_gustavson" in plan.summary  # B is not densified


def test_plan_survives_new_values_and_rejects_new_structure(cache):
    s = rand_sparse(12, 10)
    op = Matmul(s, rand((10, 6), 1))
    plan = op.plan(cache=cache)
    first = op.execute("sim")
    s2 = s.copy()
    s2.data = s2.data * 3 - 1  # same pos/crd, new values
    b2 = rand((10, 6), 7)
    op.reset_operands(s2, b2)
    second = op.execute("sim")
    assert op._plan is plan and cache.stats.builds == 1
    assert_close(second, s2.toarray().astype(np.float64) @ b2)
    assert not np.allclose(first, second)
    op.reset_operands(rand_sparse(12, 10, seed=9))  # another sparsity pattern
    with pytest.raises(PlanMismatchError, match="structure changed"):
        op.execute("sim")


@pytest.mark.parametrize("dataflow", ["os", "ws", "is"])
def test_gemm_plan_on_a_systolic_array(dataflow, cache):
    from tests.archs import small_systolic

    a, b = rand((9, 6)), rand((6, 5), 1)
    op = Matmul(a, b)
    plan = op.plan(arch=small_systolic(4, 4), dataflow=dataflow, cache=cache)
    assert plan.dataflow == dataflow and f"systolic {dataflow}" in plan.summary
    assert_close(op.execute("sim"), a.astype(np.float64) @ b)
    op.reset_operands(b=rand((6, 5), 2))
    assert_close(op.execute("sim"), a.astype(np.float64) @ rand((6, 5), 2))


def test_execute_without_plan_plans_on_default_arch():
    op = Matmul(rand((4, 4)), rand((4, 4), 1))
    out = op.execute("sim")
    assert op._plan.backend == "sim" and op._plan.arch.name
    assert_close(out, rand((4, 4)).astype(np.float64) @ rand((4, 4), 1))


def test_numpy_plan_maps_nothing(cache):
    plan = Matmul(rand((3, 4)), rand((4, 2))).plan(backend="numpy", cache=cache)
    assert plan.kernel_mappings == () and "numpy reference" in plan.summary
    with pytest.raises(PlanMismatchError, match="only 'sim' plans"):
        plan.bind(None)


def test_semirings_numpy_and_sim_refuses():
    s, b = rand_sparse(8, 6), rand((6, 5), 1)
    d = s.toarray()
    got = Matmul(s, b, semiring="min_plus").execute("numpy")
    # absent entries of A take no part; a row with none gives the semiring zero (+inf)
    expect = np.where(d[:, :, None] != 0, d[:, :, None] + b[None], np.inf).min(axis=1)
    assert_close(np.where(np.isinf(expect), 0, got), np.where(np.isinf(expect), 0, expect))
    assert np.array_equal(np.isinf(got), np.isinf(expect))
    custom = {"add": np.maximum, "mul": lambda x, y: x * y, "zero": -np.inf}
    got = Matmul(rand((4, 3)), rand((3, 2), 1), semiring=custom).execute("numpy")
    assert_close(got, (rand((4, 3))[:, :, None] * rand((3, 2), 1)[None]).max(axis=1))
    op = Matmul(s, b, semiring="max_plus")
    with pytest.raises(NotImplementedError, match="sim backend"):
        op.plan(backend="sim")
    with pytest.raises(NotImplementedError, match="sim backend"):
        op.execute("sim")
    with pytest.raises(ValueError, match="unknown semiring"):
        Matmul(s, b, semiring="tropical")
    with pytest.raises(ValueError, match="'add' and 'mul'"):
        Matmul(s, b, semiring={"add": np.add})


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 6), k=st.integers(1, 6), n=st.integers(1, 4),
       density=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_plus_times_semiring_is_matmul(m, k, n, density, seed):
    a = Tensor.from_package(rand_sparse(m, k, density, seed))
    b = Tensor.from_package(rand((k, n), seed))
    assert_close(semiring_matmul(a, b, {"add": np.add, "mul": np.multiply}),
                 a.to_dense().astype(np.float64) @ b.to_dense())


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_prolog_and_epilog(backend, cache):
    s, b = rand_sparse(10, 8), rand((8, 4), 1)

    def relu(x):
        return np.maximum(x, 0)

    op = Matmul(s, b, prolog={"a": np.abs}, epilog=relu)
    if backend == "sim":
        op.plan(cache=cache)
    assert_close(op.execute(backend), relu(np.abs(s.toarray()).astype(np.float64) @ b))
    both = Matmul(s, b, prolog=lambda v: 2 * v)
    assert_close(both.execute(backend), 4 * (s.toarray().astype(np.float64) @ b))
    with pytest.raises(ValueError, match="prolog keys"):
        Matmul(s, b, prolog={"c": np.abs})


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_sddmm(backend, cache):
    a, b = rand((9, 7)), rand((7, 6), 1)
    mask = rand_sparse(9, 6, 0.4, seed=5, fmt="coo")  # any format: read through CSR
    out = sddmm(a, b, mask, backend=backend, cache=cache)
    assert out.tensor_format == NamedFormats.CSR
    csr = mask.tocsr()
    assert np.array_equal(out.pos(1), csr.indptr) and np.array_equal(out.crd(1), csr.indices)
    assert_close(out.to_dense(), csr.toarray() * (a.astype(np.float64) @ b))
    op = Sddmm(a, b, mask)
    with pytest.raises(ValueError, match="mask shape"):
        op.reset_operands(mask=rand_sparse(9, 5))


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_sddmm_prolog_epilog(backend, cache):
    a, b, mask = rand((5, 4)), rand((4, 6), 1), rand_sparse(5, 6, 0.5, seed=3)
    out = sddmm(a, b, mask, backend=backend, cache=cache, prolog={"b": np.abs},
                epilog=lambda v: v * 10)
    assert_close(out.to_dense(), 10 * mask.toarray() * (a.astype(np.float64) @ np.abs(b)))


def test_sddmm_semiring_on_numpy_and_a_clear_error_on_sim(cache):
    a, b, mask = rand((5, 4)), rand((4, 6), 1), rand_sparse(5, 6, 0.5, seed=3)
    out = sddmm(a, b, mask, semiring="max_plus")
    csr = mask.tocsr()
    rows = np.repeat(np.arange(5), np.diff(csr.indptr))
    # C.val[p] = mask.val[p] + max_k (A[i, k] + B[k, j])
    want = csr.data.astype(np.float64) + np.array(
        [max(a[i, k] + b[k, j] for k in range(4)) for i, j in zip(rows, csr.indices)])
    assert_close(out.val, want)
    with pytest.raises(NotImplementedError, match="sim backend computes plus-times only"):
        sddmm(a, b, mask, backend="sim", semiring="max_plus", cache=cache)
    with pytest.raises(ValueError, match="unknown semiring"):
        sddmm(a, b, mask, semiring="tropical")


def test_elementwise_semiring_on_numpy_and_a_clear_error_on_sim(cache):
    s, t = rand_sparse(5, 4, 0.4, seed=1), rand_sparse(5, 4, 0.4, seed=2)
    sd, td = s.toarray().astype(np.float64), t.toarray().astype(np.float64)
    ins, int_ = sd != 0, td != 0
    # min_plus: add is min over the union, multiply is + over the intersection; an absent
    # entry is +inf, so the result is dense
    got = add(s, t, semiring="min_plus")
    want = np.where(ins & int_, np.minimum(sd, td),
                    np.where(ins, sd, np.where(int_, td, np.inf)))
    assert isinstance(got, np.ndarray) and np.array_equal(np.isinf(got), np.isinf(want))
    assert_close(np.where(np.isinf(want), 0, got), np.where(np.isinf(want), 0, want))
    got = multiply(s, t, semiring="min_plus")
    want = np.where(ins & int_, sd + td, np.inf)
    assert np.array_equal(np.isinf(got), np.isinf(want))
    assert_close(np.where(np.isinf(want), 0, got), np.where(np.isinf(want), 0, want))
    with pytest.raises(NotImplementedError, match="sim backend computes plus-times only"):
        add(s, t, backend="sim", semiring="min_plus", cache=cache)
    # plus_times is the default op, so it runs on the sim
    assert_close(add(s, t, backend="sim", semiring="plus_times", cache=cache).toarray(),
                 sd + td)


def test_sddmm_sim_reports_cycles(cache):
    op = Sddmm(rand((6, 5)), rand((5, 4), 1), rand_sparse(6, 4, 0.5))
    op.plan(cache=cache)
    op.execute("sim")
    # two multiplies per (entry, kk) iteration: a*b, then the mask value
    assert op.last_result.cycles > 0 and op.last_result.macs == 2 * op.mask.nse * 5


def test_elementwise():
    s, t = rand_sparse(6, 5, seed=1), rand_sparse(6, 5, seed=2)
    got = add(s, t)
    assert sp.issparse(got)
    assert_close(got.toarray(), s.toarray() + t.toarray())
    got = multiply(Tensor.from_package(s), Tensor.from_package(t))
    assert isinstance(got, Tensor) and not got.tensor_format.is_dense
    assert_close(got.to_dense(), s.toarray() * t.toarray())
    d = rand((6, 5))
    assert_close(add(d, s), d + s.toarray())
    assert_close(multiply(d, d), d * d)
    with pytest.raises(ValueError, match="shapes differ"):
        add(d, rand((5, 6)))


def _ew_operand(kind, seed):
    """Operand factories for element-wise cases: (package object, dense float64 copy)."""
    if kind == "dense":
        x = rand((7, 6), seed)
        return x, x.astype(np.float64)
    x = rand_sparse(7, 6, 0.35, seed=seed, fmt=kind)
    return x, x.toarray().astype(np.float64)


@pytest.fixture(scope="module")
def ew_cache(tmp_path_factory):
    # one cache for the element-wise tests: a structure mapped once is reused (mapping the
    # scatter kernel of sparse * dense is the slow part of these tests)
    return PlanCache(tmp_path_factory.mktemp("ew_plans"))


@pytest.mark.parametrize("backend", ["numpy", "sim"])
@pytest.mark.parametrize("pair", [("csr", "csr"), ("coo", "csc"), ("csr", "dense"),
                                  ("dense", "csc"), ("dense", "dense")])
@pytest.mark.parametrize("kind", ["add", "multiply"])
def test_elementwise_backends_match_numpy(kind, pair, backend, ew_cache):
    cache = ew_cache
    (a, ad), (b, bd) = _ew_operand(pair[0], 1), _ew_operand(pair[1], 2)
    got = (add if kind == "add" else multiply)(a, b, backend=backend, cache=cache)
    want = ad + bd if kind == "add" else ad * bd
    if "dense" in pair:
        assert isinstance(got, np.ndarray)
        assert_close(got, want)
        return
    assert sp.issparse(got)  # A is scipy: the result is a scipy CSR with scipy's structure
    ref = getattr(a.tocsr(), "__add__" if kind == "add" else "multiply")(b.tocsr()).tocsr()
    ref.sort_indices()
    assert np.array_equal(got.indptr, ref.indptr) and np.array_equal(got.indices, ref.indices)
    assert_close(got.toarray(), want)


def test_elementwise_sim_other_ranks_and_ust_results(cache):
    v, w = rand((10,)), Tensor.from_dense(np.where(rand((10,), 3) > 0.3, 1.0, 0.0),
                                          NamedFormats.SparseVector)
    assert_close(add(v, w, backend="sim", cache=cache), v + w.to_dense())
    t3 = np.where(rand((2, 3, 4)) > 0.2, rand((2, 3, 4), 4), 0).astype(np.float32)
    s3 = Tensor.from_dense(t3, NamedFormats.coo(3))
    assert_close(add(s3, rand((2, 3, 4), 5), backend="sim", cache=cache).to_dense(),
                 t3 + rand((2, 3, 4), 5))
    s, t = (Tensor.from_package(rand_sparse(5, 4, 0.5, seed=q)) for q in (6, 7))
    got = multiply(s, t, backend="sim", cache=cache)
    assert isinstance(got, Tensor) and got.tensor_format == NamedFormats.CSR
    assert_close(got.to_dense(), s.to_dense() * t.to_dense())


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_elementwise_prolog_epilog(backend, cache):
    s, d = rand_sparse(6, 5, 0.4, seed=2), rand((6, 5), 3)
    got = add(s, d, backend=backend, cache=cache, prolog={"a": np.abs}, epilog=lambda x: 3 * x)
    assert_close(got, 3 * (np.abs(s.toarray()) + d))
    t = rand_sparse(6, 5, 0.6, seed=4)
    got = multiply(s, t, backend=backend, cache=cache, prolog=lambda v: v + 1,
                   epilog=np.negative)
    # the prolog maps stored values only: absent entries stay absent (not 0 + 1)
    want = -np.where((s.toarray() != 0) & (t.toarray() != 0),
                     (s.toarray() + 1.0) * (t.toarray() + 1.0), 0)
    assert_close(got.toarray(), want)
    with pytest.raises(ValueError, match="prolog keys"):
        add(s, d, prolog={"x": np.abs})


def test_elementwise_plan_reused_for_new_values(cache):
    from dataflow.ust_frontend.ops import Elementwise

    s, t = rand_sparse(8, 6, 0.3, seed=1), rand_sparse(8, 6, 0.3, seed=2)
    op = Elementwise("add", s, t)
    op.plan(cache=cache)
    assert op.plan_source == "built"
    s2 = s.copy()
    s2.data = s2.data * 5
    op.reset_operands(a=s2)
    assert_close(op.execute("sim").toarray(), s2.toarray() + t.toarray())
    again = Elementwise("add", s2, t)
    again.plan(cache=cache)
    assert again.plan_source == "memory" and again._plan is op._plan
    with pytest.raises(PlanMismatchError, match="structure changed"):
        op.reset_operands(b=rand_sparse(8, 6, 0.3, seed=9))
        op.execute("sim")


def test_elementwise_engines_agree(ew_cache):
    """Both engines run the co-iteration kernel (gathers through position maps, a scatter)
    to identical values and cycle counts."""
    from dataflow.pe_array.simulate import simulate_mapping
    from dataflow.ust_frontend.ops import Elementwise

    op = Elementwise("multiply", _ew_operand("csr", 1)[0], rand((7, 6)))
    mapping = op.plan(cache=ew_cache).bind(op._lower())  # mapped by the test above
    fast, ref = (simulate_mapping(mapping, engine=e) for e in ("fast", "reference"))
    assert np.array_equal(fast.output, ref.output) and fast.cycles == ref.cycles
    assert fast.spm_reads_per_line.tolist() == ref.spm_reads_per_line.tolist()


def test_function_form_torch_and_default_cache(tmp_path):
    torch = pytest.importorskip("torch")
    a, b = torch.randn(6, 5), torch.randn(5, 3)
    out, res = matmul(a, b, backend="sim", return_result=True)
    assert isinstance(out, torch.Tensor) and res.cycles > 0
    assert_close(out.numpy(), (a.double() @ b.double()).numpy())
    assert list((tmp_path / "default").glob("*.plan"))  # went through the default disk cache


# A format no package has, written by a user as a string: row pairs, compressed pairs of rows,
# then dense columns within a stored pair row (a 2 x 1 block format, block-compressed).
CUSTOM = "(i, j) -> (i / 2 : compressed, j : compressed, i % 2 : dense)"


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_a_custom_string_format_runs_through_every_op(backend, ew_cache):
    cache = ew_cache
    s = rand_sparse(6, 5, 0.4, seed=11)
    c = Tensor.from_package(s).convert(tensor_format=CUSTOM)
    assert str(c.tensor_format) != str(NamedFormats.CSR) and c.to_dense().shape == (6, 5)
    sd = s.toarray().astype(np.float64)
    b = rand((5, 3), 1)
    assert_close(matmul(c, b, backend=backend, cache=cache).to_dense(), sd @ b)  # SpMM
    c2 = Tensor.from_package(rand_sparse(5, 4, 0.5, seed=12)).convert(tensor_format=CUSTOM)
    assert_close(matmul(c, c2, backend=backend, cache=cache).to_dense(),
                 sd @ c2.to_dense().astype(np.float64))  # SpGEMM
    mask_c = Tensor.from_package(rand_sparse(6, 4, 0.5, seed=13)).convert(tensor_format=CUSTOM)
    a = rand((6, 5), 2)
    got = sddmm(a, c2.to_dense(), mask_c, backend=backend, cache=cache)
    assert_close(got.to_dense(), mask_c.to_dense() * (a.astype(np.float64) @ c2.to_dense()))
    t = Tensor.from_package(rand_sparse(6, 5, 0.4, seed=14)).convert(tensor_format=CUSTOM)
    assert_close(add(c, t, backend=backend, cache=cache).to_dense(), sd + t.to_dense())
    assert_close(multiply(c, t, backend=backend, cache=cache).to_dense(), sd * t.to_dense())
