"""Is there a GPU, and which numba.cuda (real or simulator) do the kernels run on.

numba-cuda decides once, when `numba.cuda` is first imported, whether it drives a real GPU or
the CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`, every thread a Python thread). So the decision is
made here, before any kernel module is imported: `cuda_module()` looks for a device through the
CUDA driver (ctypes, no numba import), and with none it switches the simulator on. Code that
launches kernels calls `cuda_module()` first; code that only compiles PTX (the registry test)
imports the kernel modules in a process where the simulator is off.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

from dataflow.errors import UserError

# Deferred imports: numba.cuda reads its configuration when first imported: imported here, on demand.


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
    if "numba.cuda" not in sys.modules and not have_gpu() and not simulator_requested():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        if "numba.core.config" in sys.modules:  # numba read its environment when imported
            from numba.core import config

            config.reload_config()
    from numba import cuda

    if not on_simulator() and not have_gpu():
        raise GpuUnavailableError(
            "numba.cuda was imported in GPU mode but this machine has no CUDA device; set "
            "NUMBA_ENABLE_CUDASIM=1 before anything imports numba.cuda to run the kernels in "
            "the CUDA simulator")
    return cuda


def on_simulator() -> bool:
    """True when the kernels of this process run in the CUDA simulator (imports numba.cuda)."""
    from numba.cuda.core import config

    return bool(config.ENABLE_CUDASIM)


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
