"""dataflow: a cycle-level simulator of a reconfigurable dataflow accelerator.

Entry points: `load_arch(path)`, `simulate(workload, arch=..., **params) -> SimResult`,
`matmul(a, b, backend="numpy"|"sim", arch=...)`, `fft(x, backend=...)`,
`butterfly_matmul(x, factors, backend=...)` (see `dataflow.butterfly`).

`import dataflow` imports none of them: each name is imported from its module the first time it
is used (`_EXPORTS`), so a command that needs one workload does not wait for the others
(start-up, issue 14).
"""

from dataflow.lazy_exports import lazy_exports

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

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
