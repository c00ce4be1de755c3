"""The frontend's lowerings of element-wise ops and SpGEMM: symbolic phases against set
arithmetic and scipy, kernels checked on both engines."""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dataflow.dfg.graph import DFGError
from dataflow.dfg.lower_elementwise import EwOperand, coiterate, lower_elementwise


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
