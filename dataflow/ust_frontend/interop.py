"""Zero-copy views between UST storage and numpy, scipy.sparse and torch.

``view_of(x)`` returns the format, shape and storage that alias ``x``'s buffers;
``package_of(kind, ...)`` builds an object of the original kind back on the same buffers.
torch is imported only when a torch object is seen (it is an optional extra).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from dataflow.errors import UserError

from .extras import require
from .format import TensorFormat
from .levels import BinOp, Dim, LevelFormat, LevelSpec, LevelType
from .named import NamedFormats
from .storage import Storage

# Deferred imports: torch and cupy are optional (the `torch` extra; cupy where installed):
# imported where a tensor of theirs is met. scipy.sparse is imported where a scipy object is
# built (`scipy_sparse`): importing it takes about 0.3 s, which a command whose operands are
# numpy arrays (the default `dataflow simulate` job) need not wait for (start-up, issue 14).


def scipy_sparse():
    """The scipy.sparse module, imported on first use (see above)."""
    import scipy.sparse

    return scipy.sparse


def is_scipy_sparse(x) -> bool:
    """Whether `x` is a scipy.sparse matrix or array; a scipy object means scipy.sparse is
    imported already, so this imports nothing."""
    sp = sys.modules.get("scipy.sparse")
    return sp is not None and sp.issparse(x)


@dataclass(frozen=True)
class PackageView:
    tensor_format: TensorFormat
    shape: tuple[int, ...]
    storage: Storage
    kind: str  # "numpy", "scipy.csr_array", "torch.sparse_csr", ...
    extra: tuple = ()  # what rebuilding needs beyond the storage (e.g. the scipy class)


def _weaken(fmt: TensorFormat, *, ordered: bool, unique: bool) -> TensorFormat:
    """The same format with its coordinate-storing levels marked unordered / nonunique."""
    if ordered and unique:
        return fmt
    levels = []
    for spec in fmt.levels:
        t = spec.type
        if t.format in (LevelFormat.COMPRESSED, LevelFormat.SINGLETON):
            t = LevelType(t.format, unique=t.unique and unique, ordered=t.ordered and ordered,
                          params=t.params)
        levels.append(LevelSpec(spec.expr, t))
    return TensorFormat([Dim(d) for d in fmt.dims], levels, name=None)


# -- numpy ------------------------------------------------------------------------------------


def dense_permutation(fmt: TensorFormat) -> tuple[int, ...] | None:
    """For an all-dense format, the order of dimensions from outermost to innermost level."""
    if not fmt.is_dense:
        return None
    return tuple(fmt.dims.index(spec.expr.name) for spec in fmt.levels)


def dense_format(order: tuple[int, ...]) -> TensorFormat:
    """The all-dense format whose levels take the dimensions in `order` (outermost first)."""
    rank, order = len(order), tuple(order)
    if order == tuple(range(rank)):
        return NamedFormats.dense(rank, "C")
    if order == tuple(reversed(range(rank))):
        return NamedFormats.dense(rank, "F")
    dims = [Dim(d) for d in NamedFormats.dense(rank).dims]
    levels = [LevelSpec(dims[k], LevelType(LevelFormat.DENSE)) for k in order]
    return TensorFormat(dims, levels, name=None)


def memory_order(x) -> tuple[int, ...] | None:
    """The dimension order (outermost first) in which a strided array is contiguous, or None
    when no order is (a strided slice with gaps). Ties (extent-1 dimensions) keep C order."""
    strides = [int(s) for s in x.strides]
    shape = [int(n) for n in x.shape]
    order = tuple(sorted(range(len(shape)), key=lambda d: (-strides[d], d)))
    expected = int(x.itemsize)
    for d in reversed(order):
        if shape[d] != 1 and strides[d] != expected:
            return None
        expected *= shape[d]
    return order


def _dense_view(xp, x, fmt: TensorFormat | None, package: str) -> PackageView:
    """A dense array of array module `xp` (numpy or cupy) as UST storage in level order.

    Without a format, the levels follow the array's memory order, so a transposed (or any
    permuted) array is a view too, as in nvmath-python; only an array contiguous in no order
    (a slice with gaps) is copied, into row-major order."""
    if fmt is None:
        order = memory_order(x)
        fmt = NamedFormats.dense(x.ndim) if order is None else dense_format(order)
    perm = dense_permutation(fmt)
    if perm is None:
        raise UserError(f"{fmt} is not a dense format; convert after from_package")
    # A transposed view in level order is contiguous exactly when the layouts agree: then
    # ascontiguousarray makes no copy.
    in_level_order = xp.ascontiguousarray(x.transpose(perm))
    storage = Storage((None,) * fmt.num_levels, (None,) * fmt.num_levels,
                      in_level_order.reshape(-1))
    return PackageView(fmt, tuple(int(n) for n in x.shape), storage, package)


def numpy_view(x: np.ndarray, fmt: TensorFormat | None) -> PackageView:
    return _dense_view(np, x, fmt, "numpy")


def numpy_array(fmt: TensorFormat, shape, val: np.ndarray) -> np.ndarray:
    perm = dense_permutation(fmt)
    if perm is None:
        raise UserError(f"{fmt} is not a dense format")
    sizes = [shape[p] for p in perm]
    return val.reshape(sizes).transpose(np.argsort(perm))


# -- scipy ------------------------------------------------------------------------------------


def _sorted_within(indptr: np.ndarray, indices: np.ndarray) -> tuple[bool, bool]:
    """(ordered, unique) of compressed indices within each segment."""
    if len(indices) < 2:
        return True, True
    d = np.diff(indices.astype(np.int64))
    inner = np.ones(len(d), bool)
    boundaries = np.asarray(indptr[1:-1], np.int64) - 1
    inner[boundaries[(boundaries >= 0) & (boundaries < len(d))]] = False
    return bool((d[inner] >= 0).all()), bool((d[inner] > 0).all())


def scipy_view(x) -> PackageView:
    fmt_name = x.format
    cls = type(x)
    shape = tuple(int(n) for n in x.shape)
    if fmt_name in ("csr", "csc", "bsr"):
        ordered, unique = _sorted_within(x.indptr, x.indices)
        if fmt_name == "bsr":
            r, c = x.blocksize
            fmt = NamedFormats.BSRRight(r, c)
            val = x.data.reshape(-1)
            extra = (cls, (r, c))
        else:
            fmt = NamedFormats.CSR if fmt_name == "csr" else NamedFormats.CSC
            val = x.data
            extra = (cls,)
        fmt = _weaken(fmt, ordered=ordered, unique=unique)
        nlev = fmt.num_levels
        pos = [None] * nlev
        crd = [None] * nlev
        pos[1], crd[1] = x.indptr, x.indices
        return PackageView(fmt, shape, Storage(tuple(pos), tuple(crd), val),
                           f"scipy.{fmt_name}", extra)
    if fmt_name == "coo":
        coords = tuple(x.coords) if hasattr(x, "coords") else (x.row, x.col)
        rank = len(shape)
        fmt = NamedFormats.coo(rank)
        ordered = True
        if len(x.data) > 1:
            linear = np.ravel_multi_index(coords, shape) if rank else np.zeros(0)
            ordered = bool((np.diff(linear) >= 0).all())
        fmt = _weaken(fmt, ordered=ordered, unique=True)
        pos = (np.array([0, len(x.data)], dtype=coords[0].dtype),) + (None,) * (rank - 1)
        return PackageView(fmt, shape, Storage(pos, coords, x.data), "scipy.coo", (cls,))
    if fmt_name == "dia":
        ncols = shape[1]
        data = x.data
        if data.shape[1] != ncols:
            padded = np.zeros((data.shape[0], ncols), data.dtype)
            keep = min(ncols, data.shape[1])
            padded[:, :keep] = data[:, :keep]
            data = padded
        offsets = x.offsets
        fmt = NamedFormats.DIAJ
        ordered, unique = _sorted_within(np.array([0, len(offsets)]), offsets)
        fmt = _weaken(fmt, ordered=ordered, unique=unique)
        pos = (np.array([0, len(offsets)], dtype=offsets.dtype), None)
        storage = Storage(pos, (offsets, None), np.ascontiguousarray(data).reshape(-1))
        return PackageView(fmt, shape, storage, "scipy.dia", (cls,))
    raise TypeError(f"scipy.sparse format {fmt_name!r} is not supported; use csr, csc, coo, "
                    "bsr or dia")


def scipy_object(kind: str, extra: tuple, fmt: TensorFormat, shape, storage: Storage):
    cls = extra[0]
    pos, crd, val = storage.pos, storage.crd, storage.val
    if kind in ("scipy.csr", "scipy.csc"):
        return cls((val, crd[1], pos[1]), shape=shape, copy=False)
    if kind == "scipy.bsr":
        r, c = extra[1]
        return cls((val.reshape(-1, r, c), crd[1], pos[1]), shape=shape, blocksize=(r, c),
                   copy=False)
    if kind == "scipy.coo":
        return cls((val, tuple(crd)), shape=shape, copy=False)
    if kind == "scipy.dia":
        return cls((val.reshape(len(crd[0]), shape[1]), crd[0]), shape=shape, copy=False)
    raise ValueError(kind)


def default_package(fmt: TensorFormat) -> tuple[str, tuple] | None:
    """The package kind a tensor of this format goes back to when it came from none."""

    if fmt.is_dense:
        return "numpy", ()
    sp = scipy_sparse()
    plain = _strip(fmt)
    if plain == NamedFormats.CSR:
        return "scipy.csr", (sp.csr_array,)
    if plain == NamedFormats.CSC:
        return "scipy.csc", (sp.csc_array,)
    if fmt.num_dimensions and plain == _strip(NamedFormats.coo(fmt.num_dimensions)):
        return "scipy.coo", (sp.coo_array,)
    if plain == NamedFormats.DIAJ:
        return "scipy.dia", (sp.dia_array,)
    first, second = (fmt.levels + (None, None))[:2]
    if first is not None and isinstance(first.expr, BinOp) and isinstance(second.expr, BinOp) \
            and first.expr.op == "/" and second.expr.op == "/":
        blocksize = (first.expr.rhs.value, second.expr.rhs.value)
        if plain == NamedFormats.BSRRight(*blocksize):
            return "scipy.bsr", (sp.bsr_array, blocksize)
    return None


def _strip(fmt: TensorFormat) -> TensorFormat:
    """The format with every level ordered and unique (package formats differ only there)."""
    levels = [LevelSpec(s.expr, LevelType(s.type.format, params=s.type.params))
              for s in fmt.levels]
    return TensorFormat([Dim(d) for d in fmt.dims], levels)


# -- torch ------------------------------------------------------------------------------------


def is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def torch_view(x) -> PackageView:
    torch = require("torch", "torch")

    x = x.detach()
    if x.device.type != "cpu":
        raise UserError("only CPU torch tensors can be viewed (got device "
                         f"{x.device}); move it with .cpu() first")
    shape = tuple(int(n) for n in x.shape)
    layout = x.layout
    if layout == torch.strided:
        view = numpy_view(x.numpy(), None)
        return PackageView(view.tensor_format, shape, view.storage, "torch.strided")
    if layout == torch.sparse_coo:
        if x.dense_dim():
            raise UserError("hybrid sparse COO tensors (dense_dim > 0) are not supported")
        indices = x._indices().numpy()
        values = x._values().numpy()
        rank = len(shape)
        fmt = _weaken(NamedFormats.coo(rank), ordered=x.is_coalesced(), unique=True)
        pos = (np.array([0, len(values)], np.int64),) + (None,) * (rank - 1)
        storage = Storage(pos, tuple(indices[k] for k in range(rank)), values)
        return PackageView(fmt, shape, storage, "torch.sparse_coo", (x,))
    if len(shape) != 2:
        raise UserError(f"batched torch {layout} tensors are not supported yet")
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        ptr, idx = x.crow_indices().numpy(), x.col_indices().numpy()
    elif layout in (torch.sparse_csc, torch.sparse_bsc):
        ptr, idx = x.ccol_indices().numpy(), x.row_indices().numpy()
    else:
        raise TypeError(f"torch layout {layout} is not supported")
    values = x.values().numpy()
    if layout in (torch.sparse_bsr, torch.sparse_bsc):
        r, c = values.shape[1:3]
        fmt = NamedFormats.BSRRight(r, c) if layout == torch.sparse_bsr \
            else NamedFormats.BSCRight(r, c)
        pos, crd = (None, ptr, None, None), (None, idx, None, None)
        extra = (r, c)
    else:
        fmt = NamedFormats.CSR if layout == torch.sparse_csr else NamedFormats.CSC
        pos, crd, extra = (None, ptr), (None, idx), ()
    storage = Storage(pos, crd, values.reshape(-1))
    return PackageView(fmt, shape, storage, f"torch.{str(layout).split('.')[-1]}", extra)


def torch_object(kind: str, extra: tuple, fmt: TensorFormat, shape, storage: Storage):
    torch = require("torch", "torch")

    t = torch.from_numpy
    pos, crd, val = storage.pos, storage.crd, storage.val
    if kind == "torch.strided":
        return t(numpy_array(fmt, shape, val))
    if kind == "torch.sparse_coo":
        if extra:  # torch keeps indices as one (rank, nnz) tensor: hand back the original
            return extra[0]
        return torch.sparse_coo_tensor(t(np.stack([np.asarray(c, np.int64) for c in crd])),
                                       t(val), size=tuple(shape))
    size = tuple(shape)
    if kind == "torch.sparse_csr":
        return torch.sparse_csr_tensor(t(pos[1]), t(crd[1]), t(val), size=size,
                                       check_invariants=False)
    if kind == "torch.sparse_csc":
        return torch.sparse_csc_tensor(t(pos[1]), t(crd[1]), t(val), size=size,
                                       check_invariants=False)
    r, c = extra
    blocks = t(val.reshape(-1, r, c))
    if kind == "torch.sparse_bsr":
        return torch.sparse_bsr_tensor(t(pos[1]), t(crd[1]), blocks, size=size,
                                       check_invariants=False)
    return torch.sparse_bsc_tensor(t(pos[1]), t(crd[1]), blocks, size=size,
                                   check_invariants=False)


# -- cupy (GPU buffers) -------------------------------------------------------------------------
#
# cupy is imported only when a cupy object (or another object exposing the CUDA array interface,
# e.g. a Numba device array) is seen. A tensor viewing device buffers keeps them as they are:
# `from_package` / `to_package` stay zero-copy; computations that run on the host (to_dense,
# convert, the numpy and sim backends) work on a host copy (`Tensor.to_host`).


def is_device_array(a) -> bool:
    """True for arrays in GPU memory: they expose `__cuda_array_interface__`."""
    if a is None or isinstance(a, np.ndarray):
        return False
    if is_torch(a):  # torch raises (not AttributeError) on the attribute of sparse tensors
        return bool(a.is_cuda) and str(a.layout) == "torch.strided"
    return hasattr(a, "__cuda_array_interface__")


def is_cupy(x) -> bool:
    """A cupy / cupyx.scipy.sparse object, or any other object in GPU memory."""
    if isinstance(x, np.ndarray):
        return False
    return type(x).__module__.split(".")[0] in ("cupy", "cupyx") or is_device_array(x)


def device_pointer(a) -> int:
    """The device address of an array's first element (CUDA array interface `data[0]`)."""
    return int(a.__cuda_array_interface__["data"][0])


def to_numpy(a):
    """A host (numpy) copy of a device array; host arrays and None pass through."""
    if not is_device_array(a):
        return a
    if hasattr(a, "get"):  # cupy.ndarray.get(): device -> host copy
        return a.get()
    import cupy

    return cupy.asnumpy(cupy.asarray(a))  # any __cuda_array_interface__ object


def cupy_view(x, fmt: TensorFormat | None) -> PackageView:
    """A view of a cupy array or a cupyx.scipy.sparse csr/csc/coo matrix (device buffers)."""
    import cupy

    if not isinstance(x, cupy.ndarray) and not _is_cupyx_sparse(x):
        x = cupy.asarray(x)  # another __cuda_array_interface__ object: cupy wraps, no copy
    shape = tuple(int(n) for n in x.shape)
    if isinstance(x, cupy.ndarray):
        return _dense_view(cupy, x, fmt, "cupy.ndarray")
    fmt_name = x.format
    # cupyx keeps flags instead of scanning: canonical = sorted and free of duplicates
    canonical = bool(getattr(x, "has_canonical_format", False))
    if fmt_name in ("csr", "csc"):
        ordered = canonical or bool(getattr(x, "has_sorted_indices", False))
        fmt = _weaken(NamedFormats.CSR if fmt_name == "csr" else NamedFormats.CSC,
                      ordered=ordered, unique=canonical)
        storage = Storage((None, x.indptr), (None, x.indices), x.data)
        return PackageView(fmt, shape, storage, f"cupyx.{fmt_name}", (type(x),))
    if fmt_name == "coo":
        fmt = _weaken(NamedFormats.coo(2), ordered=canonical, unique=True)
        nnz = int(x.data.size)
        pos = (np.array([0, nnz], np.int64), None)  # a host array: it holds no device data
        return PackageView(fmt, shape, Storage(pos, (x.row, x.col), x.data), "cupyx.coo",
                           (type(x),))
    raise TypeError(f"cupyx.scipy.sparse format {fmt_name!r} is not supported; use csr, csc "
                    "or coo")


def _is_cupyx_sparse(x) -> bool:
    return type(x).__module__.split(".")[0] == "cupyx" and hasattr(x, "format")


def cupy_object(kind: str, extra: tuple, fmt: TensorFormat, shape, storage: Storage):
    """The cupy object a device tensor came from, rebuilt on the same device buffers."""
    pos, crd, val = storage.pos, storage.crd, storage.val
    if kind == "cupy.ndarray":
        return numpy_array(fmt, shape, val)  # reshape/transpose: views, on cupy arrays too
    cls = extra[0]
    if kind in ("cupyx.csr", "cupyx.csc"):
        return cls((val, crd[1], pos[1]), shape=tuple(shape), copy=False)
    if kind == "cupyx.coo":
        return cls((val, (crd[0], crd[1])), shape=tuple(shape), copy=False)
    raise ValueError(kind)


def tensor_to_device(tensor, device_id: int):
    """A copy of a UST tensor with every buffer on CUDA device `device_id` (needs cupy)."""
    try:
        import cupy
    except ImportError as e:
        raise UserError(f"to(device_id={device_id}) needs cupy, which is not installed") from e
    with cupy.cuda.Device(device_id):
        host = tensor.to_host()
        pos = [None if a is None else cupy.asarray(a) for a in host._storage.pos]
        crd = [None if a is None else cupy.asarray(a) for a in host._storage.crd]
        return type(tensor)(tensor.tensor_format, tensor.shape, pos, crd,
                            cupy.asarray(host.val))


def to_device_like(result, like):
    """`result` (numpy or scipy.sparse) copied to the GPU when `like` lives there."""
    if not is_cupy(like):
        return result

    if is_scipy_sparse(result):
        import cupyx.scipy.sparse as csp

        return csp.csr_matrix(scipy_sparse().csr_matrix(result))
    import cupy

    return cupy.asarray(result)
