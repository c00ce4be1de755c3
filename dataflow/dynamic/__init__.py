"""PIT-style dynamic sparsity (docs/references.md#pit): micro-tile gathers (SRead), write-back
(SWrite), the run-time index build, and ReLU activation sparsity in an FFN.

Workloads `dynamic-spmm` and `relu-ffn` register themselves when this package is imported.
"""

from dataflow.dynamic import workloads as _workloads  # noqa: F401 (registers the workloads)
from dataflow.dynamic.api import make_dynamic_operands, simulate_dynamic_matmul
from dataflow.dynamic.ffn import make_ffn_operands, simulate_relu_ffn
from dataflow.dynamic.microtile import GRANULARITIES, build_index, random_mask
from dataflow.dynamic.stats import DynamicStats

__all__ = ["GRANULARITIES", "DynamicStats", "build_index", "make_dynamic_operands",
           "make_ffn_operands", "random_mask", "simulate_dynamic_matmul", "simulate_relu_ffn"]
