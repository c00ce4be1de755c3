"""cupy interop: device buffers are viewed, never copied, by from_package / to_package, and
ops on cupy operands come back on the GPU.

No GPU or cupy here, so most tests inject a minimal stand-in for cupy and cupyx.scipy.sparse
(`fake_cupy`): it keeps "device" memory in a numpy array, exposes only the attributes the
frontend uses (`__cuda_array_interface__`, transpose/reshape, `get()`, `ascontiguousarray`,
`asarray`, csr/csc/coo matrices with cupyx's flags), and refuses implicit conversion to numpy
the way cupy does, so any accidental host access fails the test. The last test runs on real
cupy and is skipped when cupy or a GPU is missing.
"""

import sys
import types

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.testing import assert_close
from dataflow.ust_frontend import NamedFormats, Tensor
from dataflow.ust_frontend.interop import device_pointer
from dataflow.ust_frontend.ops import add, matmul


def _make_fake_cupy():
    cupy = types.ModuleType("cupy")

    class ndarray:  # cupy's name
        def __init__(self, host):
            self._a = host  # stands in for device memory

        shape = property(lambda self: self._a.shape)
        dtype = property(lambda self: self._a.dtype)
        ndim = property(lambda self: self._a.ndim)
        size = property(lambda self: self._a.size)
        strides = property(lambda self: self._a.strides)
        itemsize = property(lambda self: self._a.itemsize)

        @property
        def __cuda_array_interface__(self):
            a = self._a
            return {"shape": a.shape, "typestr": a.dtype.str, "version": 3,
                    "data": (a.__array_interface__["data"][0], False),
                    "strides": None if a.flags.c_contiguous else a.strides}

        def __array__(self, *args, **kwargs):
            raise TypeError("Implicit conversion to a NumPy array is not allowed")

        def transpose(self, *axes):
            return ndarray(self._a.transpose(*axes))

        def reshape(self, *shape):
            return ndarray(self._a.reshape(*shape))

        def get(self):
            return self._a.copy()

    ndarray.__module__ = "cupy"
    cupy.ndarray = ndarray
    cupy.ascontiguousarray = lambda x: x if x._a.flags.c_contiguous else ndarray(
        np.ascontiguousarray(x._a))
    cupy.asarray = lambda x: x if isinstance(x, ndarray) else ndarray(np.array(x))
    cupy.asnumpy = lambda x: x.get()

    csp = types.ModuleType("cupyx.scipy.sparse")

    def matrix_class(fmt):
        class Matrix:
            format = fmt

            def __init__(self, arg, shape=None, copy=False):
                if sp.issparse(arg):  # host scipy -> device (a copy, like cupyx)
                    host = getattr(sp, f"{fmt}_matrix")(arg)
                    parts = ((host.data, (host.row, host.col)) if fmt == "coo"
                             else (host.data, host.indices, host.indptr))
                    arg, shape = _to_device(parts), host.shape
                if fmt == "coo":
                    self.data, (self.row, self.col) = arg
                else:
                    self.data, self.indices, self.indptr = arg
                self.shape = tuple(shape)
                self.has_canonical_format = self.has_sorted_indices = True

            def get(self):
                if fmt == "coo":
                    return sp.coo_matrix((self.data.get(), (self.row.get(), self.col.get())),
                                         shape=self.shape)
                return getattr(sp, f"{fmt}_matrix")(
                    (self.data.get(), self.indices.get(), self.indptr.get()), shape=self.shape)

        Matrix.__name__ = f"{fmt}_matrix"
        Matrix.__module__ = f"cupyx.scipy.sparse._{fmt}"
        return Matrix

    def _to_device(parts):
        return tuple(_to_device(p) if isinstance(p, tuple) else ndarray(np.array(p))
                     for p in parts)

    for fmt in ("csr", "csc", "coo"):
        setattr(csp, f"{fmt}_matrix", matrix_class(fmt))
    csp.issparse = lambda x: type(x).__module__.startswith("cupyx.scipy.sparse")
    cupyx, scipy_mod = types.ModuleType("cupyx"), types.ModuleType("cupyx.scipy")
    cupyx.scipy, scipy_mod.sparse = scipy_mod, csp
    return {"cupy": cupy, "cupyx": cupyx, "cupyx.scipy": scipy_mod, "cupyx.scipy.sparse": csp}


@pytest.fixture
def fake_cupy(monkeypatch):
    mods = _make_fake_cupy()
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return mods["cupy"], mods["cupyx.scipy.sparse"]


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def device_csr(csp, cupy, m, fmt="csr"):
    m = getattr(sp, f"{fmt}_matrix")(m)
    if fmt == "coo":
        return csp.coo_matrix((cupy.asarray(m.data), (cupy.asarray(m.row), cupy.asarray(m.col))),
                              shape=m.shape)
    return getattr(csp, f"{fmt}_matrix")(
        (cupy.asarray(m.data), cupy.asarray(m.indices), cupy.asarray(m.indptr)), shape=m.shape)


def test_dense_device_array_is_a_view_both_ways(fake_cupy):
    cupy, _ = fake_cupy
    host = rand((4, 3))
    x = cupy.asarray(host)
    t = Tensor.from_package(x)
    assert t.on_device and t.tensor_format == NamedFormats.DenseMatrixRight
    assert device_pointer(t.val) == device_pointer(x)  # zero copy
    back = t.to_package()
    assert isinstance(back, cupy.ndarray) and device_pointer(back) == device_pointer(x)
    assert back.shape == (4, 3) and np.array_equal(back.get(), host)
    assert np.array_equal(t.to_dense(), host) and t.get_value((2, 1)) == host[2, 1]
    host_t = t.to_host()
    assert not host_t.on_device and isinstance(host_t.val, np.ndarray)


def test_column_major_device_array_views_only_in_its_own_layout(fake_cupy):
    cupy, _ = fake_cupy
    host = np.asfortranarray(rand((4, 3)))
    x = cupy.ndarray(host)
    col = Tensor.from_package(x, NamedFormats.DenseMatrixLeft)
    assert device_pointer(col.val) == device_pointer(x)
    row = Tensor.from_package(x, NamedFormats.DenseMatrixRight)  # against the memory: a copy
    assert device_pointer(row.val) != device_pointer(x)
    assert np.array_equal(col.to_dense(), host) and np.array_equal(row.to_dense(), host)
    # with no format given, the levels follow the memory order (as nvmath does): a view
    auto = Tensor.from_package(x)
    assert auto.tensor_format == NamedFormats.DenseMatrixLeft
    assert device_pointer(auto.val) == device_pointer(x)
    assert device_pointer(col.to_package()) == device_pointer(x)


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_cupyx_sparse_is_a_view_both_ways(fake_cupy, fmt):
    cupy, csp = fake_cupy
    host = sp.random(6, 5, density=0.4, format="csr", dtype=np.float32, random_state=1)
    x = device_csr(csp, cupy, host, fmt)
    t = Tensor.from_package(x)
    assert t.on_device and t.val is x.data
    if fmt == "coo":
        assert t.crd(0) is x.row and t.crd(1) is x.col
    else:
        assert t.pos(1) is x.indptr and t.crd(1) is x.indices
        assert t.tensor_format == (NamedFormats.CSR if fmt == "csr" else NamedFormats.CSC)
    back = t.to_package()
    assert type(back) is type(x) and back.data is x.data
    assert np.array_equal(t.to_dense(), host.toarray())
    assert_close(t.convert(tensor_format=NamedFormats.DCSR).to_dense(), host.toarray())


def test_cupyx_flags_weaken_the_format(fake_cupy):
    cupy, csp = fake_cupy
    x = device_csr(csp, cupy, np.eye(3, dtype=np.float32))
    x.has_canonical_format = x.has_sorted_indices = False
    t = Tensor.from_package(x)
    levels = t.tensor_format.levels
    assert not levels[1].type.ordered and not levels[1].type.unique


def test_ops_on_device_operands_come_back_on_the_device(fake_cupy):
    cupy, csp = fake_cupy
    a = sp.random(7, 5, density=0.4, format="csr", dtype=np.float32, random_state=2)
    b = rand((5, 3), 1)
    for backend in ("numpy", "sim"):
        out = matmul(device_csr(csp, cupy, a), cupy.asarray(b), backend=backend, cache=False)
        assert isinstance(out, cupy.ndarray)
        assert_close(out.get(), a.toarray().astype(np.float64) @ b)
    s = sp.random(7, 5, density=0.4, format="csr", dtype=np.float32, random_state=3)
    got = add(device_csr(csp, cupy, a), device_csr(csp, cupy, s))
    assert type(got).__name__ == "csr_matrix" and type(got).__module__.startswith("cupyx")
    assert_close(got.get().toarray(), a.toarray() + s.toarray())


def test_real_cupy_round_trip():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("cupy is installed but sees no GPU")
    except cupy.cuda.runtime.CUDARuntimeError as exc:  # no driver
        pytest.skip(f"cupy is installed but sees no GPU ({exc})")
    import cupyx.scipy.sparse as csp

    host = rand((5, 4))
    x = cupy.asarray(host)
    t = Tensor.from_package(x)
    assert t.on_device and t.val.data.ptr == x.data.ptr
    assert t.to_package().data.ptr == x.data.ptr
    s = csp.csr_matrix(sp.random(5, 4, density=0.5, format="csr", dtype=np.float32,
                                 random_state=1))
    ts = Tensor.from_package(s)
    assert ts.val.data.ptr == s.data.data.ptr and ts.pos(1).data.ptr == s.indptr.data.ptr
    assert np.array_equal(ts.to_dense(), s.get().toarray())
    out = matmul(s, x.T.copy(), backend="numpy")
    assert isinstance(out, cupy.ndarray)
    assert_close(out.get(), s.get().toarray().astype(np.float64) @ host.T)
