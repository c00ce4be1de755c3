"""``Tensor``: a UST format, a shape, per-level pos/crd arrays and one val array."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from dataflow.errors import UserError
from dataflow.ust_frontend.draw import draw
from dataflow.ust_frontend.files import read_tensor_file

from . import interop
from .format import TensorFormat, as_format
from .levels import ENUMERATING, LevelFormat
from .storage import LayoutError, Storage, build, decode_delta, entries, verify


class PackageError(UserError, TypeError):
    """An object no package view is defined for (a TypeError too, as before)."""


class Tensor:
    """A universal sparse tensor.

    Build one with ``Tensor.from_package`` (a view of numpy / scipy.sparse / torch buffers),
    ``Tensor.from_dense``, ``Tensor.from_file`` or ``Tensor.convert``; the constructor takes
    storage that is already laid out and checks only its array lengths.

    Storage per level (nvmath-python's conventions): dense, batch and range levels store
    nothing; compressed and delta store ``pos`` and ``crd``; loose_compressed stores ``pos`` as
    [lo, hi) pairs and ``crd``; singleton and structured store ``crd``. ``val`` holds every
    stored value, so ``nse == len(val)``.
    """

    __slots__ = ("_package", "_package_extra", "_storage", "base", "shape", "tensor_format")

    def __init__(self, tensor_format: TensorFormat | str, shape: Sequence[int],
                 pos: Sequence[np.ndarray | None], crd: Sequence[np.ndarray | None],
                 val: np.ndarray, *, package: str | None = None, package_extra: tuple = (),
                 base=None):
        self.tensor_format = as_format(tensor_format)
        self.shape = tuple(int(n) for n in shape)
        # device (cupy) buffers are kept as they are: a view, not a host copy
        self._storage = Storage(tuple(pos), tuple(crd),
                                val if interop.is_device_array(val) else np.asarray(val))
        self._package = package
        self._package_extra = package_extra
        self.base = base  # the package object this tensor views, if any
        self._check_lengths()

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_package(cls, x, tensor_format: TensorFormat | str | None = None) -> Tensor:
        """A view (no copy) of a numpy array, scipy.sparse matrix/array, torch tensor, or a
        cupy array / cupyx.scipy.sparse csr/csc/coo matrix (any object with
        ``__cuda_array_interface__`` goes through ``cupy.asarray``, also without a copy).

        numpy and cupy arrays become a dense format (row-major unless ``tensor_format`` names
        another all-dense format); scipy csr/csc/coo/bsr/dia, cupyx csr/csc/coo and torch
        dense/COO/CSR/CSC/BSR/BSC keep their own format. When ``tensor_format`` differs from
        the package's layout the result is converted (a copy, on the host).
        """
        fmt = None if tensor_format is None else as_format(tensor_format)
        if isinstance(x, np.ndarray):
            if fmt is not None and not fmt.is_dense:
                return cls.from_package(x).convert(tensor_format=fmt)
            view = interop.numpy_view(x, fmt)
        elif interop.is_scipy_sparse(x):
            view = interop.scipy_view(x)
        elif interop.is_torch(x) and not interop.is_device_array(x):
            view = interop.torch_view(x)
        elif interop.is_cupy(x):
            if fmt is not None and not fmt.is_dense:
                return cls.from_package(x).convert(tensor_format=fmt)
            view = interop.cupy_view(x, fmt)
        else:
            raise PackageError(f"from_package takes numpy, scipy.sparse, torch or cupy "
                               f"objects, not {type(x).__name__}")
        tensor = cls(view.tensor_format, view.shape, view.storage.pos, view.storage.crd,
                     view.storage.val, package=view.kind, package_extra=view.extra, base=x)
        if fmt is not None and fmt != tensor.tensor_format:
            return tensor.convert(tensor_format=fmt)
        return tensor

    @classmethod
    def from_dense(cls, array, tensor_format: TensorFormat | str | None = None, *,
                   index_type=None) -> Tensor:
        """A tensor of the given format holding the nonzeros of a dense array (a copy)."""
        array = np.asarray(array)
        fmt = as_format(tensor_format) if tensor_format is not None else None
        if fmt is None or fmt.is_dense:
            view = interop.numpy_view(np.array(array), fmt)
            return cls(view.tensor_format, view.shape, view.storage.pos, view.storage.crd,
                       view.storage.val)
        nz = np.nonzero(array)
        storage = build(fmt, array.shape, nz, array[nz], index_type=index_type)
        return cls(fmt, array.shape, storage.pos, storage.crd, storage.val)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Tensor:
        """Load a Matrix Market (.mtx) or FROSTT (.tns) file as a COO tensor."""

        return read_tensor_file(cls, path)

    # -- storage access ----------------------------------------------------------------------
    def pos(self, level: int) -> np.ndarray | None:
        """Positions array of a level (None where the level stores none)."""
        return self._storage.pos[level]

    def crd(self, level: int) -> np.ndarray | None:
        """Coordinates array of a level (None where the level stores none)."""
        return self._storage.crd[level]

    @property
    def val(self) -> np.ndarray:
        return self._storage.val

    @property
    def nse(self) -> int:
        """Number of stored elements (including the explicit zeros the format implies)."""
        return int(self._storage.val.size)

    @property
    def dtype(self) -> np.dtype:
        return self._storage.val.dtype

    @property
    def index_type(self) -> np.dtype | None:
        arrays = [a for a in self._storage.pos + self._storage.crd if a is not None]
        return arrays[0].dtype if arrays else None

    @property
    def extents(self) -> tuple[int, ...]:
        return self.shape

    @property
    def size(self) -> int:
        """Number of elements of the tensor's shape (stored or not), as numpy's ``size``."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def package(self) -> str | None:
        """The package kind this tensor views ("numpy", "torch.strided", "scipy.csr", ...)."""
        return self._package

    @property
    def levels(self) -> tuple[int, ...]:
        """Extent of each level."""
        return self.tensor_format.level_sizes(self.shape)

    @property
    def num_dimensions(self) -> int:
        return len(self.shape)

    @property
    def num_levels(self) -> int:
        return self.tensor_format.num_levels

    # -- device ------------------------------------------------------------------------------
    @property
    def on_device(self) -> bool:
        """True when the buffers live in GPU memory (a view of a cupy object)."""
        return interop.is_device_array(self._storage.val)

    @property
    def device(self) -> str:
        """"cpu" or "cuda", as nvmath-python names the memory space."""
        return "cuda" if self.on_device else "cpu"

    @property
    def device_id(self) -> int | str:
        """"cpu", or the CUDA ordinal of the device buffers."""
        if not self.on_device:
            return "cpu"
        device = getattr(self._storage.val, "device", None)
        return int(getattr(device, "id", 0))

    def to(self, device_id: int | str = "cpu", stream=None) -> Tensor:
        """This tensor on `device_id` ("cpu", or a CUDA ordinal): itself when it is there
        already (nvmath-python's ``to``), else a copy. Moving to a GPU needs cupy."""
        del stream  # host copies are synchronous here
        if device_id == "cpu":
            return self.to_host()
        if not isinstance(device_id, int) or isinstance(device_id, bool) or device_id < 0:
            raise UserError(f"device_id must be 'cpu' or a CUDA ordinal, got {device_id!r}")
        if self.on_device and self.device_id == device_id:
            return self
        return interop.tensor_to_device(self, device_id)

    def clone(self) -> Tensor:
        """A copy with new buffers, of the same format, shape, dtypes and package kind."""
        st = self._host_storage()
        copy = [None if a is None else np.array(a) for a in st.pos], \
            [None if a is None else np.array(a) for a in st.crd]
        extra = () if self._package == "torch.sparse_coo" else self._package_extra
        return Tensor(self.tensor_format, self.shape, copy[0], copy[1], np.array(st.val),
                      package=self._package, package_extra=extra)

    def copy_(self, src: Tensor, stream=None) -> Tensor:
        """Copy `src`'s values into this tensor's buffers, in place (the package object this
        tensor views sees them). `src` must have the same format, shape and structure."""
        del stream
        src = src if isinstance(src, Tensor) else Tensor.from_package(src)
        if src.tensor_format != self.tensor_format or src.shape != self.shape \
                or src.nse != self.nse:
            raise UserError(f"copy_: src ({src.tensor_format}, shape {src.shape}, nse "
                            f"{src.nse}) does not match this tensor ({self.tensor_format}, "
                            f"shape {self.shape}, nse {self.nse})")
        host = src._host_storage()
        for mine, theirs in zip(self._storage.pos + self._storage.crd, host.pos + host.crd):
            if mine is not None:
                mine[...] = interop.to_numpy(theirs) if not self.on_device else theirs
        self._storage.val[...] = host.val if not self.on_device else src.val
        return self

    def to_host(self) -> Tensor:
        """This tensor with numpy buffers: itself when already on the host, else a copy of
        every pos/crd/val array (device -> host)."""
        if not self.on_device:
            return self
        st = self._storage
        return Tensor(self.tensor_format, self.shape, [interop.to_numpy(a) for a in st.pos],
                      [interop.to_numpy(a) for a in st.crd], interop.to_numpy(st.val))

    def _host_storage(self) -> Storage:
        return self.to_host()._storage

    # -- conversion --------------------------------------------------------------------------
    def entries(self) -> tuple[list[np.ndarray], np.ndarray]:
        """Dimension coordinates and values of the stored entries (filler zeros dropped)."""
        return entries(self.tensor_format, self.shape, self._host_storage())

    def to_dense(self) -> np.ndarray:
        """The tensor as a dense numpy array (duplicates summed; a host copy of a device
        tensor)."""
        fmt = self.tensor_format
        if fmt.is_dense:
            return np.array(interop.numpy_array(fmt, self.shape, self._host_storage().val))
        coords, values = entries(fmt, self.shape, self._host_storage(), keep_stored_zeros=True)
        return _scatter(self.shape, coords, values)

    def convert(self, *, tensor_format: TensorFormat | str, index_type=None,
                dtype=None) -> Tensor:
        """This tensor in another format (a copy), through coordinate iteration of the levels.

        Raises LayoutError when the nonzeros do not fit the target (e.g. more than n nonzeros
        in a group of a structured[n, m] level, or two coordinates under a singleton's parent).
        """
        fmt = as_format(tensor_format)
        if index_type is None:  # nvmath keeps the source's index type unless asked
            index_type = self.index_type
        coords, values = self.entries()
        if dtype is not None:
            values = values.astype(dtype)
        if fmt.is_dense:
            return Tensor.from_dense(_scatter(self.shape, coords, values), fmt)
        storage = build(fmt, self.shape, coords, values, index_type=index_type)
        return Tensor(fmt, self.shape, storage.pos, storage.crd, storage.val)

    def to_package(self):
        """The package object this tensor came from, rebuilt on the same buffers.

        Tensors not made by ``from_package`` go to numpy (dense formats) or scipy.sparse
        (CSR, CSC, COO, BSR, DIA); other formats must be converted first.
        """
        kind, extra = self._package, self._package_extra
        if kind is None:
            found = interop.default_package(self.tensor_format)
            if found is None:
                raise UserError(f"no package holds {self.tensor_format}; convert it to a "
                                 "dense, CSR, CSC, COO, BSR or DIA format first")
            kind, extra = found
        if kind == "numpy":
            return interop.numpy_array(self.tensor_format, self.shape, self.val)
        if kind.startswith("scipy."):
            return interop.scipy_object(kind, extra, self.tensor_format, self.shape,
                                        self._storage)
        if kind.startswith(("cupy.", "cupyx.")):
            return interop.cupy_object(kind, extra, self.tensor_format, self.shape,
                                       self._storage)
        return interop.torch_object(kind, extra, self.tensor_format, self.shape, self._storage)

    # -- element access ----------------------------------------------------------------------
    def get_value(self, index: Sequence[int]):
        """The stored value at a dimension index, or None where nothing is stored."""
        if self.on_device:
            return self.to_host().get_value(index)
        index = tuple(int(i) for i in index)
        if len(index) != len(self.shape) or any(not 0 <= i < n
                                                for i, n in zip(index, self.shape)):
            raise IndexError(f"index {index} is outside the shape {self.shape}")
        fmt = self.tensor_format
        lvl = [int(c) for c in fmt.dim2lvl([np.asarray(i) for i in index])]
        found = self._find(0, 0, lvl)
        if not found:
            return None
        return self.val[found].sum() if len(found) > 1 else self.val[found[0]]

    def _find(self, k: int, parent: int, lvl: list[int]) -> list[int]:
        """Positions at the last level that hold level coordinates ``lvl`` (below ``parent``)."""
        fmt = self.tensor_format
        if k == fmt.num_levels:
            return [parent]
        spec = fmt.levels[k]
        lo, hi = fmt.level_bounds(self.shape)[k]
        kind, c = spec.type.format, lvl[k]
        pos, crd = self.pos(k), self.crd(k)
        if kind in ENUMERATING:
            return self._find(k + 1, parent * (hi - lo) + c - lo, lvl)
        if kind is LevelFormat.SINGLETON:
            return self._find(k + 1, parent, lvl) if crd[parent] == c else []
        if kind is LevelFormat.STRUCTURED:
            n = spec.type.params[0]
            start, end = parent * n, parent * n + n
            coords = np.asarray(crd[start:end]) + lo
        elif kind is LevelFormat.LOOSE_COMPRESSED:
            start, end = int(pos[2 * parent]), int(pos[2 * parent + 1])
            coords = crd[start:end]
        else:
            start, end = int(pos[parent]), int(pos[parent + 1])
            coords = crd[start:end]
            if kind is LevelFormat.DELTA:
                coords = decode_delta([0, end - start], coords, lo)
        out = []
        for offset in np.flatnonzero(np.asarray(coords) == c):
            out += self._find(k + 1, start + int(offset), lvl)
        return out

    # -- text --------------------------------------------------------------------------------
    def describe(self) -> str:
        """A text summary of the format, the levels and their storage arrays."""
        fmt = self.tensor_format
        shape = "x".join(map(str, self.shape)) or "scalar"
        name = f" {fmt.name}" if fmt.name else ""
        lines = [f"Tensor {shape} {self.dtype}, format{name}: {fmt}"]
        sizes = self.levels
        for k, spec in enumerate(fmt.levels):
            stored = []
            for label, array in (("pos", self.pos(k)), ("crd", self.crd(k))):
                if array is not None:
                    stored.append(f"{label}[{array.size}] {array.dtype}")
            lines.append(f"  level {k}: {spec!s:<28} size {sizes[k]:<6} "
                         f"{'  '.join(stored) or '(no storage)'}")
        lines.append(f"  val[{self.nse}] {self.dtype}   nse {self.nse}")
        return "\n".join(lines)

    def __str__(self) -> str:
        """What nvmath-python prints: format, shape, levels, index and value dtypes, nse,
        sparsity, then the stored arrays."""
        sparsity = 1.0 - self.nse / self.size if self.size else 0.0
        lines = [f"tensor format: {self.tensor_format.name or self.tensor_format}",
                 f"  {self.tensor_format}",
                 f"extents: {self.shape}  levels: {self.levels}",
                 f"index type: {self.index_type}  dtype: {self.dtype}  device: "
                 f"{self.device_id}",
                 f"nse: {self.nse}  sparsity: {100 * sparsity:.2f}%"]
        host = self._host_storage()
        for k in range(self.num_levels):
            for label, array in (("pos", host.pos[k]), ("crd", host.crd[k])):
                if array is not None:
                    lines.append(f"{label}[{k}] = {np.array2string(np.asarray(array))}")
        lines.append(f"val = {np.array2string(np.asarray(host.val))}")
        return "\n".join(lines)

    def draw(self, ax=None, **kwargs):
        """A matplotlib Figure of the sparsity pattern, the levels and their storage arrays.

        See ``dataflow.ust_frontend.draw.draw`` for the keyword arguments.
        """

        return draw(self.to_host(), ax=ax, **kwargs)

    def __repr__(self) -> str:
        name = self.tensor_format.name or str(self.tensor_format)
        return (f"Tensor(shape={self.shape}, format={name!r}, nse={self.nse}, "
                f"dtype={self.dtype})")

    # -- checks ------------------------------------------------------------------------------
    def verify(self) -> Tensor:
        """Check every level's storage invariants (O(nse)); return self, raise ValueError."""
        verify(self.tensor_format, self.shape, self._host_storage())
        return self

    def _check_lengths(self):
        fmt, st = self.tensor_format, self._storage
        if len(self.shape) != fmt.num_dimensions:
            raise UserError(f"shape {self.shape} does not match the {fmt.num_dimensions} "
                             f"dimensions of {fmt}")
        if len(st.pos) != fmt.num_levels or len(st.crd) != fmt.num_levels:
            raise UserError(f"{fmt} has {fmt.num_levels} levels, but pos/crd were given for "
                             f"{len(st.pos)}/{len(st.crd)}")
        if st.val.ndim != 1:
            raise UserError(f"val must be one-dimensional, got shape {st.val.shape}")
        for k, spec in enumerate(fmt.levels):
            if spec.type.stores_pos and st.pos[k] is None:
                raise UserError(f"level {k} ({spec}) needs a pos array")
            if spec.type.stores_crd and st.crd[k] is None:
                raise UserError(f"level {k} ({spec}) needs a crd array")


def _scatter(shape: tuple[int, ...], coords, values: np.ndarray) -> np.ndarray:
    """A dense array with ``values`` added at ``coords`` (duplicates summed)."""
    if not shape:
        return np.array(values.sum(), values.dtype)
    out = np.zeros(shape, values.dtype)
    np.add.at(out, tuple(coords), values)
    return out


__all__ = ["LayoutError", "PackageError", "Tensor"]
