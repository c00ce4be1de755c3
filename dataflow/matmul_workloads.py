"""The dense and sparse matmul workloads (`--workload gemm`, `--workload spmm`): seeded random
operands, lowered through the UST frontend, mapped and simulated.

spmm's A is drawn as CSR arrays (`dataflow.matmul_split.random_csr`) and handed to the frontend
as a UST CSR tensor, so a run imports no scipy (start-up, issue 14); `make_operands` gives
callers the same A as a scipy CSR matrix."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import numpy as np

from dataflow.arch import ArchSpec, PEKind
from dataflow.errors import UserError
from dataflow.workloads import (
    Param,
    Workload,
    check_host_memory,
    dense_bytes,
    finish,
    register,
)

if TYPE_CHECKING:
    from dataflow.ust_frontend.tensor import Tensor

# The frontend, the compiler and the split (about 0.15 s of imports) are imported where a run
# on a reconfigurable array uses them; a systolic GEMM needs none of them (start-up, issue 14).

MATMUL_WORKLOADS = ("gemm", "spmm")


def make_operands(workload: str, m: int, k: int, n: int, density: float = 0.1, seed: int = 0):
    """Seeded random operands: dense A (gemm) or a scipy CSR A at `density` (spmm), dense B;
    fp32."""
    from dataflow.matmul_split import csr_operand

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
    from dataflow.matmul_split import random_csr

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
    from dataflow.ust_frontend.named import NamedFormats
    from dataflow.ust_frontend.op_base import as_tensor
    from dataflow.ust_frontend.tensor import Tensor

    if workload == "gemm":
        return as_tensor(a)
    indptr, indices, data = a
    return Tensor(NamedFormats.CSR, (m, k), (None, indptr), (None, indices), data)


def _run_matmul(workload: str):
    def run(spec: ArchSpec, *, engine: str = "fast", seed: int = 0, trace: bool = False,
            m: int = 256, k: int = 256, n: int = 64, density: float = 0.05,
            dataflow: str | None = None, timing_only: bool = False):
        t0 = time.perf_counter()
        systolic = spec.pe_array.kind == PEKind.SYSTOLIC
        if dataflow is not None and not systolic:
            raise UserError(f"--dataflow {dataflow} applies only to systolic arrays "
                            f"(pe_array.kind: systolic); {spec.name} is {spec.pe_array.kind}")
        if timing_only:
            return _timing_only(workload, spec, engine, trace, m, k, n, dataflow, t0)
        from dataflow.matmul_split import split_matmul

        split = split_matmul(workload, spec, engine=engine, seed=seed, trace=trace, m=m, k=k,
                             n=n, density=density, dataflow=dataflow,
                             make_operands=make_operands, t0=t0)
        if split is not None:  # too large for the SPM or the host: run in blocks that fit
            return split
        a, b = draw_operands(workload, m, k, n, density, seed)
        if systolic and workload == "gemm":  # no frontend: the array runs the GEMM as given
            return _run_systolic(spec, engine, trace, a, b, dataflow, t0)
        from dataflow.pe_array.simulate import simulate_mapping
        from dataflow.plan.compile import compile_program
        from dataflow.ust_frontend.op_base import as_tensor, lower_matmul
        from dataflow.ust_frontend.reference import matmul_reference

        ta, tb = operand_tensor(workload, a, m, k), as_tensor(b)
        mapping = compile_program(lower_matmul(ta, tb), spec, dataflow=dataflow)
        res = simulate_mapping(mapping, engine=engine, trace=trace, workload=workload)
        return finish(res, matmul_reference(ta, tb), t0, mapping)
    return run


def _systolic_result(spec, engine, trace, a, b, dataflow, values: bool):
    """A dense GEMM on a systolic array: lowered and mapped as it is (no schedule to choose)
    and simulated, its values computed or not; (result, mapping)."""
    from dataflow.dfg.lower import lower_gemm
    from dataflow.mapper.map import map_program
    from dataflow.pe_array.simulate import simulate_mapping

    mapping = map_program(lower_gemm(a, b), spec, dataflow=dataflow)
    res = simulate_mapping(mapping, engine=engine, trace=trace, workload="gemm", values=values)
    return res, mapping


def _run_systolic(spec, engine, trace, a, b, dataflow, t0):
    res, mapping = _systolic_result(spec, engine, trace, a, b, dataflow, values=True)
    # the reference as the frontend's `matmul_reference` computes it: float64 accumulate
    reference = (np.asarray(a, np.float64) @ np.asarray(b, np.float64)).astype(np.float32)
    return finish(res, reference, t0, mapping)


def _timing_only(workload, spec, engine, trace, m, k, n, dataflow, t0):
    """`--timing-only`: cycles, stalls, traffic and energy of a GEMM on a systolic array,
    whose timing does not depend on the values (SCALE-Sim's own mode); the values are neither
    drawn nor computed, and the result says so (`values_computed` False)."""
    if workload != "gemm" or spec.pe_array.kind != PEKind.SYSTOLIC:
        raise UserError("--timing-only applies to --workload gemm on a systolic array "
                        "(pe_array.kind: systolic), whose timing does not depend on the "
                        f"values; {workload} on {spec.name} ({spec.pe_array.kind}) computes them")
    for name, v in (("m", m), ("k", k), ("n", n)):
        if v <= 0:
            raise UserError(f"--{name} must be a positive integer, got {v}")
    # zero pages: the operands' shapes without drawing (or touching) their words
    a, b = np.zeros((m, k), dtype=np.float32), np.zeros((k, n), dtype=np.float32)
    res, mapping = _systolic_result(spec, engine, trace, a, b, dataflow, values=False)
    return dataclasses.replace(res, values_computed=False, output=None,
                               values_match_reference=None,
                               max_abs_error=None, wall_seconds=time.perf_counter() - t0,
                               mapping_summary=mapping.summary())


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
