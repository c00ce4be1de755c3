"""The `dynamic-spmm` and `relu-ffn` workloads of the registry (`dataflow.workloads`)."""

from __future__ import annotations

from dataflow.dynamic.api import run_dynamic_spmm
from dataflow.dynamic.ffn import FFN_PARAMS, run_relu_ffn
from dataflow.dynamic.microtile import MASK_GRANULARITIES
from dataflow.dynamic.stats import CHOICES
from dataflow.matmul_workloads import MATMUL_PARAMS
from dataflow.workloads import Param, Workload, register


def register_workloads() -> None:
    mnk = tuple(p for p in MATMUL_PARAMS if p.name in ("m", "k", "n"))
    register(Workload(
        "dynamic-spmm", run_dynamic_spmm,
        (*mnk,
         Param("sparsity", float, 0.9, "fraction of zeros, in [0, 1) (dynamic-spmm: of A; "
               "relu-ffn: of the hidden neurons that are dead)"),
         Param("granularity", str, "32x1", "micro-tile the kernel gathers (32x1, 1x64: PIT; "
               "32x64: block-sparse; dense: GEMM baseline)", choices=CHOICES),
         Param("mask_granularity", str, None, "how A's zeros are laid out (element, or whole "
               "micro-tiles; default: the --granularity, as in PIT's micro-benchmark)",
               choices=(None, *MASK_GRANULARITIES))),
        "C = A @ B, A's sparsity found at run time (PIT micro-tiles vs block-sparse)"))
    register(Workload("relu-ffn", run_relu_ffn, FFN_PARAMS,
                      "Y = ReLU(X W1 + b) W2, the second layer on dynamically sparse activations"))


register_workloads()
