"""nvmath-python's UST API on dataflow (issue 15, sections 2 and 3): each entry point as
nvmath's examples call it, checked against numpy."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from dataflow.errors import UserError
from dataflow.testing import assert_close
from dataflow.ust_frontend import Matmul, NamedFormats, Tensor, matmul
from dataflow.ust_frontend.torch_inject import TorchUST, reformat_model

A = np.array([[1.0, 0.0, 2.0, 0.0], [0.0, 3.0, 0.0, 0.0], [4.0, 0.0, 0.0, 5.0]])
B = np.arange(8.0).reshape(4, 2) / 4 - 1
C0 = np.array([[1.0, -1.0], [2.0, 0.5], [0.0, 3.0]])
# float16 keeps about 3 decimal digits: the stated tolerance for float16 results
TOL = {np.float16: dict(rtol=2e-3, atol=2e-3)}


def expected(a, b, c, alpha, beta):
    return alpha * (np.asarray(a, np.complex128) @ np.asarray(b, np.complex128)) + beta * c


# -- tensors: views, printing, the nvmath attributes ------------------------------------------

@pytest.mark.parametrize("make", [lambda x: x.T, lambda x: np.asfortranarray(x),
                                  lambda x: x.reshape(2, 3, 2).transpose(2, 0, 1)])
def test_permuted_numpy_array_is_a_view_that_sees_writes(make):
    x = make(np.arange(12.0).reshape(3, 4))
    t = Tensor.from_package(x)
    assert np.shares_memory(t.val, x)
    x[(0,) * x.ndim] = 42.0
    assert_close(t.to_dense(), x)
    back = t.to_package()
    assert np.shares_memory(back, x) and back.shape == x.shape


def test_transposed_torch_tensor_is_a_view_and_goes_back_to_torch():
    x = torch.arange(6.0).reshape(2, 3).T
    t = Tensor.from_package(x)
    assert t.tensor_format == NamedFormats.dense(2, "F")
    x[1, 0] = -7.0
    assert t.to_dense()[1, 0] == -7.0
    back = t.to_package()
    assert isinstance(back, torch.Tensor) and back.data_ptr() == x.data_ptr()


def test_convert_keeps_int64_indices_unless_asked():
    t = Tensor.from_package(torch.tensor(A).to_sparse_csr())
    assert t.index_type == np.int64
    assert t.convert(tensor_format=NamedFormats.CSC).index_type == np.int64
    assert t.convert(tensor_format=NamedFormats.CSC, index_type=np.int32).index_type == np.int32


def test_tensor_attributes_to_clone_copy_and_print():
    t = Tensor.from_package(sp.csr_array(A))
    assert t.size == 12 and t.device_id == "cpu" and t.device == "cpu"
    assert t.to(device_id="cpu") is t
    with pytest.raises(UserError, match="device_id"):
        t.to(device_id="gpu")
    c = t.clone()
    assert not np.shares_memory(c.val, t.val)
    c.val[:] = 0
    assert_close(t.to_dense(), A)
    d = np.zeros((2, 2))
    Tensor.from_package(d).copy_(Tensor.from_package(np.ones((2, 2))))
    assert_close(d, np.ones((2, 2)))
    with pytest.raises(UserError, match="copy_"):
        Tensor.from_package(d).copy_(Tensor.from_package(np.ones((3, 2))))
    text = str(t)
    for part in ("CSR", "(3, 4)", "int32", "float64", "nse: 5", "58.33%",
                 "val = [1. 2. 3. 4. 5.]"):
        assert part in text, part


# -- matmul: alpha, beta, c, dtypes, complex, on numpy and sim --------------------------------

@pytest.mark.parametrize("backend", ["numpy", "sim"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.complex64,
                                   np.complex128])
def test_matmul_in_place_c_matches_numpy(backend, dtype):
    scale = 1j if np.issubdtype(dtype, np.complexfloating) else 1
    a, b = (A * scale).astype(dtype), (B * (1 + scale)).astype(dtype)
    c = (C0 * (1 - scale)).astype(dtype)
    want = expected(a, b, c, 1.5, -0.5)
    if scale == 1:
        want = want.real
    # scipy.sparse has no float16: the sparse operand is a UST CSR tensor
    r = matmul(Tensor.from_dense(a, NamedFormats.CSR), b, c, alpha=1.5, beta=-0.5,
               backend=backend)
    assert r is c and c.dtype == dtype
    assert_close(c, want.astype(dtype), **TOL.get(dtype, {}))


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_complex_matmul_keeps_the_imaginary_part(backend):
    a = Tensor.from_package(sp.csr_array(np.array([[2j, 0], [0, 4j]])))
    b = np.ones((2, 2), np.complex128)
    out = matmul(a, b, backend=backend).to_package()
    assert out.dtype == np.complex128
    assert_close(out, np.array([[2j, 2j], [4j, 4j]]))


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_matmul_result_keeps_the_operands_dtype(dtype):
    out = matmul(A.astype(dtype), B.astype(dtype))
    assert out.dtype == dtype
    assert_close(out, (A @ B).astype(dtype), **TOL.get(dtype, {}))


def test_matmul_on_cuda_simulator_honours_alpha_beta_c():
    c = C0.astype(np.float32)
    want = expected(A, B, C0, 2.0, 0.5).real.astype(np.float32)
    r = matmul(sp.csr_array(A.astype(np.float32)), B.astype(np.float32), c, alpha=2.0,
               beta=0.5, backend="cuda")
    assert r is c
    assert_close(c, want, dtype=np.float32)


def test_ust_c_backed_by_torch_is_written_in_place_and_stays_torch():
    tc = torch.tensor(C0)
    c = Tensor.from_package(tc)
    a = Tensor.from_package(torch.tensor(A).to_sparse_csr())
    b = Tensor.from_package(torch.tensor(B))
    r = matmul(a, b, c, alpha=1.2, beta=2.4)
    assert r is c
    assert isinstance(r.to_package(), torch.Tensor)
    assert_close(tc.numpy(), expected(A, B, C0, 1.2, 2.4).real)
    # without c the result is in A's package: torch for torch-backed UST operands
    assert isinstance(matmul(a, b).to_package(), torch.Tensor)


def test_torch_operands_give_torch_results_and_torch_c():
    a, b = torch.tensor(A), torch.tensor(B)
    assert isinstance(matmul(a, b), torch.Tensor)
    c = torch.tensor(C0)
    assert matmul(a, b, c, beta=1.0) is c
    assert_close(c.numpy(), A @ B + C0)


def test_stateful_matmul_context_manager_with_reset_operands():
    c = np.zeros((3, 2))
    with Matmul(sp.csr_array(A), B, c, alpha=1.0, beta=1.0) as mm:
        mm.plan(backend="numpy")
        assert mm.execute() is c
        assert_close(c, A @ B)
        mm.reset_operands(b=2 * B)
        mm.execute()
        assert_close(c, A @ B + 2 * (A @ B))
        c2 = np.ones((3, 2))
        mm.reset_operands(c=c2, alpha=-1.0, beta=0.5)
        assert mm.execute() is c2
        assert_close(c2, -(A @ (2 * B)) + 0.5)
    assert mm._plan is None


def test_scalar_prologs_and_epilog_as_nvmath_places_them():
    c = np.zeros((3, 2))
    with Matmul(sp.csr_array(A), np.ones((4, 2)), c, beta=1.0) as mm:
        mm.plan(prologs={"a": lambda x: 3.14 * math.sin(x), "b": lambda x: 6.28 * math.cos(x)},
                epilog=lambda x: max(x, 0.0), backend="numpy")
        mm.execute()
    stored = np.where(A != 0, 3.14 * np.sin(A), 0.0)
    assert_close(c, np.maximum(stored @ np.full((4, 2), 6.28 * math.cos(1.0)), 0.0))


def test_scalar_max_plus_semiring_folds_into_c():
    a = Tensor.from_package(sp.csr_array(np.array([[2.0, 0.0], [0.0, 4.0]])))
    c = np.full((2, 2), 3.0)
    with Matmul(a, np.ones((2, 2)), c, beta=1.0, options={"codegen": False}) as mm:
        mm.plan(semiring={"mul": lambda x, y: x + y, "add": lambda x, y: max(x, y),
                          "atomic_add": None}, backend="numpy")
        mm.execute()
    assert_close(c, np.array([[3.0, 3.0], [5.0, 5.0]]))


def test_bad_matmul_arguments_are_user_errors():
    with pytest.raises(UserError, match="'a' is required"):
        matmul(None, B)
    with pytest.raises(UserError, match="backend="):
        matmul(A, B, "sim")
    with pytest.raises(UserError, match="shape"):
        matmul(A, B, np.zeros((2, 2)))
    with pytest.raises(UserError, match="alpha"):
        matmul(A, B, alpha=np.ones(2))
    with pytest.raises(UserError, match="qualifiers"):
        matmul(A, B, qualifiers=[1, 0])


# -- torch interface --------------------------------------------------------------------------

def test_torch_ust_and_reformat_model_on_a_tiny_sequential():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
    with torch.no_grad():
        model[0].weight[model[0].weight < 0] = 0
    x = torch.rand(3, 8)
    with torch.no_grad():
        y = model(x)

    def func(weight):
        if torch.count_nonzero(weight) < 0.7 * weight.numel():
            return TorchUST.from_torch(weight.to_sparse_csr())
        return None

    report = reformat_model(model, func=func)
    assert type(model[0]).__name__ == "UstLinear" and isinstance(model[2], torch.nn.Linear)
    assert report.left_in_torch == [("2", "func returned None")]
    with torch.no_grad():
        z = model(x)
    assert torch.allclose(y, z, atol=1e-6)
    with pytest.raises(UserError, match="func"):
        reformat_model(model, func=lambda w: "csr")
