"""Is there a GPU, and which numba.cuda (real or simulator) do the kernels run on.

numba-cuda decides once, when `numba.cuda` is first imported, whether it drives a real GPU or
the CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`, every thread a Python thread). So the decision is
made here, before any kernel module is imported: `cuda_module()` looks for a device through the
CUDA driver (ctypes, no numba import), and with none it switches the simulator on. Code that
launches kernels calls `cuda_module()` first; code that only compiles PTX (the registry test)
imports the kernel modules in a process where the simulator is off.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from types import SimpleNamespace

import numpy as np

from dataflow.errors import UserError
from dataflow.ust_frontend.extras import require

# Deferred imports: numba.cuda reads its configuration when first imported: imported here, on
# demand, through `require` (numba-cuda is the `cuda` extra; numba's own built-in numba.cuda has
# no `numba.cuda.core`, so that module is what tells the two apart).


class GpuUnavailableError(UserError):
    """A kernel launch was asked for on a real GPU in a process that cannot have one."""


@functools.lru_cache(maxsize=1)
def _driver_device_count() -> int:
    """CUDA devices the driver reports (0 without a driver or a device); no numba involved."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if lib.cuInit(0) != 0:
            return 0
        count = ctypes.c_int(0)
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return int(count.value)
    return 0


def have_gpu() -> bool:
    """True when a CUDA device is present and usable (asks the driver, not numba)."""
    return _driver_device_count() > 0


def simulator_requested() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def cuda_module():
    """`numba.cuda`, imported in the mode this process can run: the real GPU when there is one
    and the simulator was not asked for, otherwise the CUDA simulator.

    Raises `GpuUnavailableError` when numba.cuda was already imported in GPU mode by someone
    else in a process without a GPU (the mode cannot change after the first import)."""
    _fix_mode()
    if _DRY_RUN[0]:
        return _HOST
    require("numba.cuda.core.config", "cuda", needed_for="the CUDA path")
    cuda = require("numba.cuda", "cuda", needed_for="the CUDA path")
    if not on_simulator() and not have_gpu():
        raise GpuUnavailableError(
            "numba.cuda was imported in GPU mode but this machine has no CUDA device; set "
            "NUMBA_ENABLE_CUDASIM=1 before anything imports numba.cuda to run the kernels in "
            "the CUDA simulator")
    return cuda


def _fix_mode() -> None:
    """Switch the simulator on before numba.cuda is first imported when there is no GPU."""
    if "numba.cuda" not in sys.modules and not have_gpu() and not simulator_requested():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        if "numba.core.config" in sys.modules:  # numba read its environment when imported
            require("numba.core.config", "cuda").reload_config()


def on_simulator() -> bool:
    """True when the kernels of this process run in the CUDA simulator (imports numba.cuda)."""
    config = require("numba.cuda.core.config", "cuda", needed_for="the CUDA path")
    return bool(config.ENABLE_CUDASIM)


class _HostArray(np.ndarray):
    """A host array standing in for a device array during a dry run (never launched on)."""

    def copy_to_host(self, ary=None, stream=0):
        if ary is None:
            return np.array(self)
        ary[...] = self
        return ary


def _host_array(shape, dtype=np.float32, **_):
    return np.zeros(shape, dtype).view(_HostArray)


#: What the host functions call on `numba.cuda` while a dry run only records launches: copies
#: and allocations on the host, so a modelled GPU cost needs no numba-cuda.
_HOST = SimpleNamespace(
    to_device=lambda x, **_: np.array(x).view(_HostArray),
    device_array=_host_array,
    device_array_like=lambda x, **_: _host_array(np.shape(x), np.asarray(x).dtype))
_DRY_RUN = [False]


@contextlib.contextmanager
def host_launches():
    """Within this block `cuda_module()` hands out host stand-ins for device memory, for a dry
    run (`runner.dry_run`) whose launches are recorded, never executed: `dataflow compare`
    models a GPU with the core install. The kernel modules still import numba (a core
    dependency), never numba-cuda."""
    saved = _DRY_RUN[0]
    _DRY_RUN[0] = True
    try:
        yield
    finally:
        _DRY_RUN[0] = saved


def execution_mode() -> str:
    """'gpu' or 'cudasim': where `cuda_module()` launches kernels in this process."""
    cuda_module()
    return "cudasim" if on_simulator() else "gpu"


def device_name() -> str:
    """The GPU's name, or a line saying the kernels run in the simulator."""
    cuda = cuda_module()
    if on_simulator():
        return "CUDA simulator (NUMBA_ENABLE_CUDASIM=1; no GPU timing)"
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    return f"{name} (sm_{dev.compute_capability[0]}{dev.compute_capability[1]})"
