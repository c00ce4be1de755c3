"""The dense and sparse matmul workloads (`--workload gemm`, `--workload spmm`): seeded random
operands, lowered through the UST frontend, mapped and simulated.

spmm's A is drawn as CSR arrays (`dataflow.matmul_split.random_csr`) and handed to the frontend
as a UST CSR tensor, so a run imports no scipy (start-up, issue 14); `make_operands` gives
callers the same A as a scipy CSR matrix."""

from __future__ import annotations

import time

import numpy as np

from dataflow.arch import ArchSpec, PEKind
from dataflow.errors import UserError
from dataflow.matmul_split import csr_operand, random_csr, split_matmul
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan.compile import compile_program
from dataflow.ust_frontend.named import NamedFormats
from dataflow.ust_frontend.op_base import as_tensor, lower_matmul
from dataflow.ust_frontend.reference import matmul_reference
from dataflow.ust_frontend.tensor import Tensor
from dataflow.workloads import (
    Param,
    Workload,
    check_host_memory,
    dense_bytes,
    finish,
    register,
)

MATMUL_WORKLOADS = ("gemm", "spmm")


def make_operands(workload: str, m: int, k: int, n: int, density: float = 0.1, seed: int = 0):
    """Seeded random operands: dense A (gemm) or a scipy CSR A at `density` (spmm), dense B;
    fp32."""
    a, b = draw_operands(workload, m, k, n, density, seed)
    return (a if workload == "gemm" else csr_operand(*a, shape=(m, k))), b


def draw_operands(workload: str, m: int, k: int, n: int, density: float = 0.1, seed: int = 0):
    """`make_operands`' A and B, with spmm's A as its CSR arrays (indptr, indices, data)."""
    if workload not in MATMUL_WORKLOADS:
        raise UserError(f"unknown workload {workload!r}; choose one of {MATMUL_WORKLOADS}")
    for name, v in (("m", m), ("k", k), ("n", n)):
        if v <= 0:
            raise UserError(f"--{name} must be a positive integer, got {v}")
    if workload == "spmm" and not 0.0 < density <= 1.0:
        raise UserError(f"--density must be in (0, 1], got {density}")
    # A (dense, or CSR at 12 bytes a nonzero: value, column, the generator's int64 draw),
    # B and the dense C, twice over: the program's copies and the float64 reference
    a_bytes = dense_bytes((m, k)) if workload == "gemm" else 12 * density * m * k
    check_host_memory(f"{workload} operands (--m {m} --k {k} --n {n})",
                      2 * (a_bytes + dense_bytes((k, n), (m, n))))
    rng = np.random.default_rng(seed)
    b = rng.standard_normal((k, n), dtype=np.float32)
    if workload == "gemm":
        return rng.standard_normal((m, k), dtype=np.float32), b
    return random_csr(m, k, density, rng), b


def operand_tensor(workload: str, a, m: int, k: int) -> Tensor:
    """`draw_operands`' A as a UST tensor: the dense array, or CSR on the drawn arrays."""
    if workload == "gemm":
        return as_tensor(a)
    indptr, indices, data = a
    return Tensor(NamedFormats.CSR, (m, k), (None, indptr), (None, indices), data)


def _run_matmul(workload: str):
    def run(spec: ArchSpec, *, engine: str = "fast", seed: int = 0, trace: bool = False,
            m: int = 256, k: int = 256, n: int = 64, density: float = 0.05,
            dataflow: str | None = None):
        t0 = time.perf_counter()
        if dataflow is not None and spec.pe_array.kind != PEKind.SYSTOLIC:
            raise UserError(f"--dataflow {dataflow} applies only to systolic arrays "
                            f"(pe_array.kind: systolic); {spec.name} is {spec.pe_array.kind}")
        split = split_matmul(workload, spec, engine=engine, seed=seed, trace=trace, m=m, k=k,
                             n=n, density=density, dataflow=dataflow,
                             make_operands=make_operands, t0=t0)
        if split is not None:  # too large for the SPM or the host: run in blocks that fit
            return split
        a, b = draw_operands(workload, m, k, n, density, seed)
        ta, tb = operand_tensor(workload, a, m, k), as_tensor(b)
        mapping = compile_program(lower_matmul(ta, tb), spec, dataflow=dataflow)
        res = simulate_mapping(mapping, engine=engine, trace=trace, workload=workload)
        return finish(res, matmul_reference(ta, tb), t0, mapping)
    return run


MATMUL_PARAMS = (
    Param("m", int, 256, "rows of A and C"),
    Param("k", int, 256, "columns of A, rows of B"),
    Param("n", int, 64, "columns of B and C (butterfly/fft: transform length)"),
    Param("density", float, 0.05, "density of sparse A (spmm)"),
    Param("dataflow", str, None, "systolic dataflow (systolic architectures only; default os)",
          choices=(None, "os", "ws", "is")),
)
register(Workload("gemm", _run_matmul("gemm"), MATMUL_PARAMS, "dense C = A @ B"))
register(Workload("spmm", _run_matmul("spmm"), MATMUL_PARAMS, "CSR A @ dense B"))
