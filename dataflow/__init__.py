"""dataflow: a cycle-level simulator of a reconfigurable dataflow accelerator.

Entry points: `load_arch(path)`, `simulate(workload, arch=..., **params) -> SimResult`,
`matmul(a, b, backend="numpy"|"sim", arch=...)`, `fft(x, backend=...)`,
`butterfly_matmul(x, factors, backend=...)` (see `dataflow.butterfly`).
"""

from dataflow.api import load_arch, simulate
from dataflow.attention import sparse_attention
from dataflow.butterfly import butterfly_matmul, fft
from dataflow.ust_frontend.format import TensorFormat
from dataflow.ust_frontend.ops import matmul

__version__ = "0.1.0"
__all__ = [
    "TensorFormat",
    "butterfly_matmul",
    "fft",
    "load_arch",
    "matmul",
    "simulate",
    "sparse_attention",
]
