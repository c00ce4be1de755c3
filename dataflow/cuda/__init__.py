"""The CUDA path: the dataflow ops as Numba CUDA kernels, on a GPU or in the CUDA simulator.

- `have_gpu()` (a CUDA device is present), `execution_mode()` ("gpu" or "cudasim").
- Host functions (numpy in and out): `gemm`, `spmm`, `sddmm`, `butterfly`, `butterfly_linear`,
  `butterfly_ffn`, `fft`, `fnet_attention`, `sparse_attention`, `microtile_matmul`, `relu_ffn`,
  `moe` (`dataflow.cuda.ops`).
- `measure(op_name, fn, *args)`: CUDA-event timing with FLOP/s and GB/s (`dataflow.cuda.runner`).
- `registry.kernels()`: every kernel with its signatures (compiled to PTX for sm_80 / sm_90 in
  the tests); `gpu_spec.load_gpu(...)` and `roofline` model a GPU from its datasheet numbers.

Importing this package does not import numba.cuda: the first launch decides GPU or simulator.
"""

from dataflow.cuda import ops, runner
from dataflow.cuda.device import GpuUnavailableError, execution_mode, have_gpu, on_simulator
from dataflow.cuda.frontend import register as _register_frontend

_register_frontend()  # matmul / sddmm (..., backend="cuda") in dataflow.ust_frontend

_OPS = ("gemm", "spmm", "sddmm", "butterfly", "butterfly_linear", "butterfly_ffn", "fft",
        "fnet_attention", "sparse_attention", "microtile_matmul", "microtile_index", "relu_ffn",
        "moe")


def __getattr__(name):
    if name in _OPS:

        return getattr(ops, name)
    if name in ("measure", "Runner", "OpTiming"):

        return getattr(runner, name)
    raise AttributeError(f"module 'dataflow.cuda' has no attribute {name!r}")


__all__ = ["GpuUnavailableError", "OpTiming", "Runner", "butterfly", "butterfly_ffn",
           "butterfly_linear", "execution_mode", "fft", "fnet_attention", "gemm", "have_gpu",
           "measure", "microtile_index", "microtile_matmul", "moe", "on_simulator", "relu_ffn",
           "sddmm", "sparse_attention", "spmm"]
