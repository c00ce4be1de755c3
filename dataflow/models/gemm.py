"""GEMM layers (`LayerKind.GEMM`, sizes m, k, n): input ``m x k`` times the "weight" ``k x n``
(plus an optional "bias" ``(n,)``), through the ordinary GEMM path on every preset. A SCALE-Sim
GEMM row ``M, N, K`` is this layer with ifmap ``M x K`` and filter ``K x N``."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from dataflow.arch import ArchSpec, PEKind
from dataflow.mapper import map_program
from dataflow.models.layers import Layer, LayerKind, ModelError
from dataflow.models.runners import LayerRun, RunOptions, register_runner
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.ust_frontend.ops import as_tensor, lower_matmul
from dataflow.workloads import finish


def gemm_dims(layer: Layer) -> tuple[int, int, int]:
    """(m, k, n) of a GEMM layer."""
    if layer.kind != LayerKind.GEMM:
        raise ModelError(f"{layer.where}: layer {layer.name!r} is {layer.kind}, not gemm")
    return layer.size("m"), layer.size("k"), layer.size("n")


def input_shape(layer: Layer) -> tuple[int, int]:
    m, k, _ = gemm_dims(layer)
    return m, k


def weight_shapes(layer: Layer) -> dict[str, tuple[int, ...]]:
    """"weight" (k, n); "bias" (n,) is optional."""
    _, k, n = gemm_dims(layer)
    return {"weight": (k, n)}


def run_gemm(layer: Layer, inputs: list[np.ndarray], weights: dict[str, np.ndarray],
             arch: ArchSpec, options: RunOptions) -> LayerRun:
    """Run a GEMM layer on `arch`; output (m, n) fp32, checked against numpy in float64.
    `options.dataflow` applies on systolic arrays only."""
    t0 = time.perf_counter()
    m, k, n = gemm_dims(layer)
    if len(inputs) != 1:
        raise ModelError(f"{layer.where}: gemm layer {layer.name!r} reads one input, "
                         f"got {len(inputs)}")
    x = np.asarray(inputs[0])
    if x.shape != (m, k):
        raise ModelError(f"{layer.where}: gemm layer {layer.name!r}: input must be "
                         f"({m}, {k}), got {tuple(x.shape)}")
    w = np.asarray(weights.get("weight")) if "weight" in weights else None
    if w is None or w.shape != (k, n):
        got = None if w is None else tuple(w.shape)
        raise ModelError(f"{layer.where}: gemm layer {layer.name!r}: 'weight' must be "
                         f"({k}, {n}), got {got}")
    bias = weights.get("bias")
    a = np.ascontiguousarray(x, np.float32)
    b = np.ascontiguousarray(w, np.float32)
    systolic = arch.pe_array.kind == PEKind.SYSTOLIC
    mapping = map_program(lower_matmul(as_tensor(a), as_tensor(b)), arch,
                          dataflow=options.dataflow if systolic else None)
    res = simulate_mapping(mapping, engine=options.engine, workload=layer.name)
    out = res.output.reshape(m, n)
    reference = a.astype(np.float64) @ b.astype(np.float64)
    if bias is not None:  # a per-column add on the output, done on the host
        out = out + np.asarray(bias, np.float32).reshape(1, n)
        reference = reference + np.asarray(bias, np.float64).reshape(1, n)
    out = np.ascontiguousarray(out, np.float32)
    res = finish(dataclasses.replace(res, output=out), reference, t0, mapping)
    return LayerRun(result=res, output=out, reference=reference)


register_runner(LayerKind.GEMM, run_gemm)
