"""The Numba CUDA kernels, as plain Python functions (compiled by `cuda.jit` where launched and
by `cuda.compile_ptx` in the registry test).

Importing these modules imports `numba.cuda`, whose mode (GPU or simulator) is fixed by that
first import: launchers call `dataflow.cuda.device.cuda_module()` before importing them.
"""
