"""The frontend's lowerings of element-wise ops and SpGEMM: symbolic phases against set
arithmetic and scipy, kernels checked on both engines."""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dataflow.dfg.graph import DFGError
from dataflow.dfg.lower_elementwise import EwOperand, coiterate, lower_elementwise
from dataflow.dfg.lower_spgemm import gustavson_symbolic


def csr_operand(m):
    m = sp.csr_matrix(m)
    m.sort_indices()
    return EwOperand(m.data.astype(np.float32), m.indptr.astype(np.int64),
                     m.indices.astype(np.int64))


def random_pattern(draw, r, c):
    bits = draw(st.lists(st.booleans(), min_size=r * c, max_size=r * c))
    return np.array(bits, bool).reshape(r, c)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), r=st.integers(1, 5), c=st.integers(1, 5),
       kind=st.sampled_from(["add", "multiply"]))
def test_coiterate_is_union_or_intersection_with_position_maps(data, r, c, kind):
    pa, pb = random_pattern(data.draw, r, c), random_pattern(data.draw, r, c)
    va = np.where(pa, np.arange(1, r * c + 1).reshape(r, c), 0)
    vb = np.where(pb, 100 * np.arange(1, r * c + 1).reshape(r, c), 0)
    a, b = csr_operand(va), csr_operand(vb)
    co = coiterate(kind, (r, c), a, b)
    want = (pa | pb) if kind == "add" else (pa & pb)
    rows = np.repeat(np.arange(r), np.diff(co.pos))
    got = np.zeros((r, c), bool)
    got[rows, co.crd] = True
    assert np.array_equal(got, want) and co.nnz == want.sum()
    for x, v, mp in ((a, va, co.maps[0]), (b, vb, co.maps[1])):
        ext = np.concatenate([x.val, [0]])
        read = x.val if mp is None else ext[mp]  # what the kernel reads along S
        assert np.array_equal(read, v[rows, co.crd])


def test_coiterate_with_a_dense_operand_and_errors():
    a = csr_operand(np.array([[0, 2], [3, 0]]))
    d = EwOperand(np.ones(4, np.float32))
    full = coiterate("add", (2, 2), a, d)
    assert full.full and full.maps[1] is None and full.maps[0].tolist() == [2, 0, 1, 2]
    part = coiterate("multiply", (2, 2), a, d)
    assert part.crd.tolist() == [1, 0] and part.maps == (None, None)
    with pytest.raises(DFGError, match="unknown element-wise op 'sub'"):
        coiterate("sub", (2, 2), a, d)
    with pytest.raises(DFGError, match="dense operand B has 3 values"):
        coiterate("add", (2, 2), a, EwOperand(np.ones(3)))
    bad = EwOperand(np.ones(2), np.array([0, 2, 2]), np.array([1, 0]))
    with pytest.raises(DFGError, match="sorted, unique"):
        coiterate("add", (2, 2), bad, d)


def test_elementwise_kernels_are_one_loop_nest_each():
    a = csr_operand(np.array([[0, 2], [3, 0]]))
    b = csr_operand(np.array([[1, 2], [0, 0]]))
    prog = lower_elementwise("add", (2, 2), a, b)
    (kern,) = prog.kernels
    assert [lp.var for lp in kern.loops] == ["i", "p"] and prog.outputs == (("C", (3,)),)
    assert [n.op.value for n in kern.nodes] == ["load", "gather", "load", "gather", "add",
                                                "store"]
    dense = lower_elementwise("multiply", (2, 2), EwOperand(np.ones(4)), EwOperand(np.ones(4)))
    assert dense.kernels[0].vector_var == "j" and dense.macs == 4


# --- SpGEMM (Gustavson) ---------------------------------------------------------------------

def _csr(m):
    m = sp.csr_matrix(m)
    m.sort_indices()
    return m


@settings(max_examples=30, deadline=None)
@given(data=st.data(), m=st.integers(1, 5), k=st.integers(1, 5), n=st.integers(1, 5))
def test_gustavson_symbolic_matches_scipy_structure_and_flops(data, m, k, n):
    pa, pb = random_pattern(data.draw, m, k), random_pattern(data.draw, k, n)
    a, b = _csr(pa.astype(np.float64)), _csr(pb.astype(np.float64))
    s = gustavson_symbolic((m, k), a.indptr, a.indices, (k, n), b.indptr, b.indices)
    # C's structure: (i, j) with some k where both patterns hold (no cancellation: counts)
    want = _csr(a @ b)
    assert np.array_equal(s.pos, want.indptr) and np.array_equal(s.crd, want.indices)
    # one partial product per (A entry, B entry in the row it selects): Gustavson's flops
    assert s.products == int(np.diff(b.indptr)[a.indices].sum())
    # each C entry's contributions: exactly its k's, in increasing A position (Gustavson order)
    rows = np.repeat(np.arange(m), np.diff(s.pos))
    for e in range(s.nnz):
        t = slice(s.contrib_pos[e], s.contrib_pos[e + 1])
        ks = a.indices[s.a_idx[t]]
        assert np.array_equal(ks, np.flatnonzero(pa[rows[e]] & pb[:, s.crd[e]]))
        assert np.array_equal(b.indices[s.b_idx[t]], np.full(len(ks), s.crd[e]))
        assert np.all(np.diff(s.a_idx[t]) > 0)


def test_gustavson_symbolic_errors():
    a = _csr(np.eye(2))
    with pytest.raises(DFGError, match="shapes do not agree"):
        gustavson_symbolic((2, 2), a.indptr, a.indices, (3, 2), a.indptr, a.indices)
    with pytest.raises(DFGError, match="malformed CSR operand B"):
        gustavson_symbolic((2, 2), a.indptr, a.indices, (2, 2), a.indptr[:2], a.indices)
    with pytest.raises(DFGError, match=r"CSR operand A: column index out of range \[0, 2\)"):
        gustavson_symbolic((2, 2), a.indptr, np.array([0, 5]), (2, 2), a.indptr, a.indices)


@pytest.mark.parametrize("a_kind", ["csr", "coo", "dense", "empty"])
def test_spgemm_on_the_sim_equals_scipy_without_densifying_b(a_kind, tmp_path):
    from dataflow.pe_array.simulate import simulate_mapping
    from dataflow.testing import assert_close
    from dataflow.ust_frontend.cache import PlanCache
    from dataflow.ust_frontend.ops import Matmul

    b = sp.random(9, 7, density=0.3, format="csr", dtype=np.float32, random_state=3)
    a = {"csr": lambda: sp.random(8, 9, density=0.3, format="csr", dtype=np.float32,
                                  random_state=1),
         "coo": lambda: sp.random(8, 9, density=0.3, format="coo", dtype=np.float32,
                                  random_state=2),
         "dense": lambda: np.random.default_rng(0).standard_normal((8, 9)).astype(np.float32),
         "empty": lambda: sp.csr_matrix((8, 9), dtype=np.float32)}[a_kind]()
    op = Matmul(a, b)
    plan = op.plan(cache=PlanCache(tmp_path))
    got = op.execute("sim")
    ad = a.toarray() if sp.issparse(a) else a
    assert_close(got, (sp.csr_matrix(ad.astype(np.float64)) @ b.astype(np.float64)).toarray(),
                 dtype=np.float32)
    res = op.last_result
    st = op._spgemm
    assert plan.program_name.startswith("spgemm_gustavson")
    assert res.macs == st.products  # one multiply per partial product, none for B's zeros
    assert "B_val" in dict(op._lower().inputs) and dict(op._lower().inputs)["B_val"].size == b.nnz
    if a_kind == "csr":  # both engines: identical values and cycles
        ref = simulate_mapping(plan.bind(op._lower()), engine="reference")
        assert np.array_equal(ref.output, res.output) and ref.cycles == res.cycles


def _closed_form_compute_cycles(kres, schedule_length):
    """Per tile of n iterations on U copies at II: (ceil(n / U) - 1) * II + schedule length,
    plus that tile's SPM-conflict stalls (the engine's modulo-schedule timing)."""
    return sum((-(-t.iterations // kres.copies) - 1) * kres.ii + schedule_length
               + t.stall_cycles_spm_conflict for t in kres.tiles if t.iterations)


@pytest.mark.parametrize("op_kind", ["spgemm", "add", "multiply_dense"])
def test_new_kernels_do_exactly_their_work_in_closed_form_time(op_kind, tmp_path):
    """SpGEMM runs one iteration per partial product, co-iteration one per entry of S, and
    each kernel's cycles follow the modulo-schedule closed form."""
    from dataflow.ust_frontend.cache import PlanCache
    from dataflow.ust_frontend.ops import Elementwise, Matmul

    a = sp.random(10, 8, density=0.3, format="csr", dtype=np.float32, random_state=1)
    b = sp.random(8, 6, density=0.3, format="csr", dtype=np.float32, random_state=2)
    if op_kind == "spgemm":
        op = Matmul(a, b)
    elif op_kind == "add":
        op = Elementwise("add", a, sp.random(10, 8, density=0.3, format="csr",
                                             dtype=np.float32, random_state=3))
    else:
        op = Elementwise("multiply", a, np.ones((10, 8), np.float32))
    plan = op.plan(cache=PlanCache(tmp_path))
    op.execute("sim")
    (kres,) = op.last_result.kernels
    work = sum(t.iterations for t in kres.tiles)
    if op_kind == "spgemm":
        assert work == op._spgemm.products == int(np.diff(b.indptr)[a.indices].sum())
    elif op_kind == "add":
        assert work == op._coiteration.nnz == len(np.union1d(*(
            np.flatnonzero(m.toarray().ravel()) for m in (a, op.b.to_package()))))
    else:
        assert work == a.nnz  # the intersection with a dense operand: A's entries
    km = plan.kernel_mappings[0]
    assert kres.compute_cycles == _closed_form_compute_cycles(kres, km.schedule_length)
    assert kres.ii >= kres.mii
