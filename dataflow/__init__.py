"""dataflow: a cycle-level simulator of a reconfigurable dataflow accelerator.

Entry points: `load_arch(path)`, `simulate(workload, arch=..., **params) -> SimResult`,
`matmul(a, b, backend="numpy"|"sim", arch=...)`, `fft(x, backend=...)`,
`butterfly_matmul(x, factors, backend=...)` (see `dataflow.butterfly`).

`import dataflow` imports none of them: each name is imported from its module the first time it
is used (`_EXPORTS`), so a command that needs one workload does not wait for the others
(start-up, issue 14).
"""

import importlib

__version__ = "0.1.0"
#: name -> the module it comes from
_EXPORTS = {
    "TensorFormat": "dataflow.ust_frontend.format",
    "butterfly_matmul": "dataflow.butterfly",
    "fft": "dataflow.butterfly",
    "load_arch": "dataflow.api",
    "matmul": "dataflow.ust_frontend.ops",
    "simulate": "dataflow.api",
    "sparse_attention": "dataflow.attention",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dataflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next use finds it without coming here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
