"""Backend dispatch: executors registered from another module (as dataflow/cuda does) run
through the same plan/execute, prolog/epilog and packaging as the built-in backends."""

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.testing import assert_close
from dataflow.ust_frontend import Tensor
from dataflow.ust_frontend import backends as ust_backends
from dataflow.ust_frontend.ops import (
    Elementwise,
    Matmul,
    Sddmm,
    add,
    available_backends,
    matmul,
    multiply,
    register_backend,
    sddmm,
    unregister_backend,
)


@pytest.fixture(autouse=True)
def _private_default_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAFLOW_CACHE_DIR", str(tmp_path / "default"))


@pytest.fixture
def fake_backend(monkeypatch):
    """A 'fake' backend whose executors compute in float64 with plain numpy and log calls."""
    monkeypatch.setattr(ust_backends, "_EXECUTORS", {f: {} for f in ust_backends.OP_FAMILIES})
    calls = []

    def mm(op):
        a, b = op.prologued_operands()
        calls.append(("matmul", op.op))
        return a.to_dense().astype(np.float64) @ b.to_dense().astype(np.float64)

    def sd(op):
        a, b = op.dense_operands()
        pos, crd, val = op.mask_csr()
        rows = np.repeat(np.arange(len(pos) - 1), np.diff(pos))
        calls.append(("sddmm", op.op))
        return val * np.einsum("pk,kp->p", a[rows], b[:, crd])

    def ew(op):
        calls.append(("elementwise", op.kind))
        f = np.add if op.kind == "add" else np.multiply
        return f(op.a.to_dense(), op.b.to_dense())

    register_backend("matmul", "fake", mm)
    register_backend("sddmm", "fake", sd)
    register_backend("elementwise", "fake", ew)
    return calls


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_registered_backend_runs_every_family(fake_backend):
    a = sp.random(9, 7, density=0.4, format="csr", dtype=np.float32, random_state=1)
    b, x = rand((7, 5)), rand((7,), 2)
    got = matmul(a, b, backend="fake", epilog=lambda c: 2 * c)
    assert_close(got, 2 * (a.toarray().astype(np.float64) @ b))
    assert_close(matmul(a, x, backend="fake"), a.toarray().astype(np.float64) @ x)  # SpMV
    mask = sp.random(9, 5, density=0.3, format="csr", dtype=np.float32, random_state=4)
    out = sddmm(rand((9, 7)), b, mask, backend="fake", prolog={"a": np.abs})
    want = mask.toarray() * (np.abs(rand((9, 7))).astype(np.float64) @ b)
    assert_close(out.to_dense(), want)
    d1, d2 = rand((4, 6)), rand((4, 6), 3)
    assert_close(add(d1, d2, backend="fake"), d1 + d2)
    assert_close(multiply(d1, d2, backend="fake"), d1 * d2)
    assert [c[0] for c in fake_backend] == ["matmul", "matmul", "sddmm", "elementwise",
                                            "elementwise"]
    assert fake_backend[1] == ("matmul", "matmul:spmv")


def test_stateful_ops_plan_and_execute_on_a_registered_backend(fake_backend, tmp_path):
    from dataflow.ust_frontend.cache import PlanCache

    op = Matmul(rand((6, 4)), rand((4, 3), 1))
    plan = op.plan(backend="fake", cache=PlanCache(tmp_path / "p"))
    assert plan.backend == "fake" and plan.kernel_mappings == ()
    assert_close(op.execute(), rand((6, 4)).astype(np.float64) @ rand((4, 3), 1))
    assert isinstance(Sddmm(rand((3, 2)), rand((2, 3)), np.eye(3, dtype=np.float32))
                      .execute("fake"), Tensor)


def test_unknown_backend_lists_the_available_ones(fake_backend):
    with pytest.raises(ValueError, match=r"unknown backend 'nope' for matmul; available: "
                                         r"numpy, sim, fake"):
        matmul(rand((2, 2)), rand((2, 2)), backend="nope")
    unregister_backend("sddmm", "fake")
    with pytest.raises(ValueError, match=r"for sddmm; available: numpy, sim$"):
        Sddmm(rand((2, 2)), rand((2, 2)), np.eye(2, dtype=np.float32)).execute("fake")
    assert available_backends("elementwise") == ("numpy", "sim", "fake")


def test_cuda_is_looked_up_in_its_module(monkeypatch):
    monkeypatch.setattr(ust_backends, "_EXECUTORS", {f: {} for f in ust_backends.OP_FAMILIES})
    monkeypatch.setitem(ust_backends.BACKEND_MODULES, "cuda", "dataflow._no_such_module_")
    with pytest.raises(ValueError,
                       match=r"unknown backend 'cuda' for elementwise \(importing "
                             r"dataflow._no_such_module_ failed.*available: numpy, sim"):
        Elementwise("add", rand((2, 2)), rand((2, 2))).execute("cuda")


def test_registration_errors(fake_backend):
    with pytest.raises(ValueError, match="unknown op 'conv'.*matmul"):
        register_backend("conv", "x", lambda op: None)
    with pytest.raises(ValueError, match="'sim' is built in"):
        register_backend("matmul", "sim", lambda op: None)
    with pytest.raises(TypeError, match="must be callable"):
        register_backend("matmul", "x", 3)
    with pytest.raises(ValueError, match="already has a 'fake' executor"):
        register_backend("matmul", "fake", lambda op: None)
    register_backend("matmul", "fake", lambda op: np.zeros((2, 2)), replace=True)
    assert_close(matmul(rand((2, 2)), rand((2, 2)), backend="fake"), np.zeros((2, 2)))
