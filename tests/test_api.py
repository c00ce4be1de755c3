import numpy as np
import pytest
import scipy.sparse as sp

import dataflow
from dataflow.testing import assert_close
from dataflow.ust_frontend import Tensor


def test_load_arch_and_simulate_return_values(default_arch):
    r = dataflow.simulate("gemm", arch=default_arch, m=12, k=8, n=8)
    assert r.cycles > 0 and r.output.shape == (12, 8)
    assert r.values_match_reference


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_matmul_dense_and_sparse(backend):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((20, 12), dtype=np.float32)
    b = rng.standard_normal((12, 9), dtype=np.float32)
    out = dataflow.matmul(a, b, backend=backend)
    assert isinstance(out, np.ndarray)
    assert_close(out, a.astype(np.float64) @ b)
    s = sp.random(20, 12, density=0.3, format="csr", dtype=np.float32, random_state=1)
    assert_close(dataflow.matmul(s, b, backend=backend), s.toarray().astype(np.float64) @ b)
    # any UST format goes through CSR by level iteration
    coo = Tensor.from_package(s.tocoo())
    assert_close(dataflow.matmul(coo, b, backend=backend).to_dense(), s.toarray() @ b)


def test_matmul_sim_returns_result_and_torch_package():
    torch = pytest.importorskip("torch")
    a = torch.randn(8, 8)
    b = torch.randn(8, 8)
    out, res = dataflow.matmul(a, b, backend="sim", return_result=True)
    assert isinstance(out, torch.Tensor)
    assert res.cycles > 0
    assert_close(out.numpy(), (a.double() @ b.double()).numpy())


def test_matmul_errors():
    with pytest.raises(ValueError, match="shapes do not agree"):
        dataflow.matmul(np.ones((2, 3)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="unknown backend"):
        dataflow.matmul(np.ones((2, 2)), np.ones((2, 2)), backend="gpu")


def test_value_checks_keep_imaginary_parts():
    import numpy as np

    from dataflow.testing import max_abs_error, values_match

    x = np.array([1 + 1j, 2 - 1j], np.complex64)
    assert values_match(x, x.copy())
    assert not values_match(x, x.real.astype(np.complex64))
    assert max_abs_error(x, np.conj(x)) == 2.0
