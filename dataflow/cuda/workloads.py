"""Registered workloads on the CUDA path: the same operands on numpy, sim and cuda.

A `GpuWorkload` builds the operands a dataflow workload (`dataflow.workloads`) builds for the same
parameters and seed, and runs them three ways: the numpy reference, the sim backend (lower ->
map -> cycle-level engine, returning the `SimResult`) and the CUDA kernels. `dataflow crosscheck`
and `dataflow compare` are built on this table; a workload missing here is one the CUDA path
does not cover yet, and those commands say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dataflow.attention import attention_reference, sparse_attention
from dataflow.attention.api import make_inputs
from dataflow.butterfly import reference as bref
from dataflow.butterfly import run_butterfly_matmul, run_fft, run_fnet_attention
from dataflow.cuda import ops as cu
from dataflow.cuda.frontend import attention_executor
from dataflow.dynamic import (
    make_dynamic_operands,
    make_ffn_operands,
    simulate_dynamic_matmul,
    simulate_relu_ffn,
)
from dataflow.dynamic.ffn import ffn_reference
from dataflow.errors import UserError
from dataflow.matmul_workloads import make_operands
from dataflow.moe.api import simulate_moe
from dataflow.moe.gating import check_moe_params, make_moe_operands, moe_reference
from dataflow.ust_frontend.ops import as_tensor, matmul, matmul_reference
from dataflow.workloads import get as get_workload
from dataflow.workloads import workloads


@dataclass(frozen=True)
class GpuWorkload:
    name: str
    inputs: Callable[..., dict]  # inputs(seed=..., **params) -> operands
    numpy: Callable[[dict], Any]
    sim: Callable[[dict, Any], tuple[Any, Any]]  # (operands, ArchSpec) -> (values, SimResult)
    cuda: Callable[..., Any]  # cuda(operands, runner=...) -> values
    describe: Callable[[dict], str] = lambda ops: ""


# --- gemm / spmm ----------------------------------------------------------------------------

def _matmul_inputs(kind: str):
    def inputs(*, seed: int = 0, m: int, k: int, n: int, density: float, dataflow=None) -> dict:
        a, b = make_operands(kind, m, k, n, density, seed)
        return {"a": a, "b": b, "dataflow": dataflow}
    return inputs


def _matmul_numpy(ops: dict):
    return matmul_reference(as_tensor(ops["a"]), as_tensor(ops["b"]))


def _matmul_sim(ops: dict, arch):
    return matmul(ops["a"], ops["b"], backend="sim", arch=arch, dataflow=ops["dataflow"],
                  return_result=True)


def _gemm_cuda(ops: dict, runner=None):
    return cu.gemm(ops["a"], ops["b"], runner=runner)


def _spmm_cuda(ops: dict, runner=None):
    a = ops["a"]
    return cu.spmm(a.indptr, a.indices, a.data, a.shape, ops["b"], runner=runner)


def _matmul_describe(ops: dict) -> str:
    a, b = ops["a"], ops["b"]
    nnz = getattr(a, "nnz", None)
    return f"A {a.shape[0]}x{a.shape[1]}" + (f" ({nnz:,} stored)" if nnz is not None else "") \
        + f" @ B {b.shape[0]}x{b.shape[1]}"


# --- attention ------------------------------------------------------------------------------

def _attention_inputs(*, seed: int = 0, pattern: str, seq: int, dim: int, lowering: str = "csr",
                      **pattern_params):

    # the `attention` workload's own operand builder: the same q, k, v and pattern
    ops = make_inputs(pattern, seq, dim, seed, **pattern_params)
    return dict(ops, lowering=lowering)


def _attention_numpy(ops: dict):
    return attention_reference(ops["q"], ops["k"], ops["v"], ops["pos"], ops["crd"])


def _attention_sim(ops: dict, arch):
    return sparse_attention(ops["q"], ops["k"], ops["v"], pattern=ops["pattern"], backend="sim",
                            arch=arch, return_result=True, lowering=ops["lowering"])


def _attention_cuda(ops: dict, runner=None):

    # window / dilated patterns: the fused kernel's affine mode, as backend="cuda" runs them
    return attention_executor(ops["q"], ops["k"], ops["v"], ops["pos"], ops["crd"],
                              ops["pattern"], runner=runner)


def _attention_describe(ops: dict) -> str:
    seq = ops["q"].shape[0]
    return (f"{ops['pattern']}, seq {seq}, dim {ops['q'].shape[1]}, "
            f"{len(ops['crd']):,} of {seq * seq:,} scores")


# --- dynamic sparsity (PIT micro-tiles) -------------------------------------------------------

def _dynamic_inputs(*, seed: int = 0, m: int, k: int, n: int, sparsity: float, granularity: str,
                    mask_granularity=None) -> dict:

    # the operands the `dynamic-spmm` workload builds (dataflow.dynamic.api._run_dynamic_spmm)
    mg = mask_granularity or (granularity if granularity != "dense" else "element")
    a, b = make_dynamic_operands(m, k, n, sparsity, mg, seed)
    return {"a": a, "b": b, "granularity": granularity, "mask_granularity": mg}


def _dynamic_numpy(ops: dict):
    return (ops["a"].astype(np.float64) @ ops["b"].astype(np.float64)).astype(np.float32)


def _dynamic_sim(ops: dict, arch):
    res, _ = simulate_dynamic_matmul(ops["a"], ops["b"], ops["granularity"], arch)
    return res.output, res


def _dynamic_cuda(ops: dict, runner=None):
    if ops["granularity"] == "dense":
        return cu.gemm(ops["a"], ops["b"], runner=runner)
    gm, gk = (int(x) for x in ops["granularity"].split("x"))
    return cu.microtile_matmul(ops["a"], ops["b"], (gm, gk), runner=runner)[0]


def _dynamic_describe(ops: dict) -> str:
    a, b = ops["a"], ops["b"]
    return (f"A {a.shape[0]}x{a.shape[1]} at {100 * (1 - np.count_nonzero(a) / a.size):.0f}% "
            f"zeros ({ops['mask_granularity']} layout) @ B {b.shape[0]}x{b.shape[1]}, "
            f"{ops['granularity']} micro-tiles")


# --- butterfly, fft, fnet-attention ------------------------------------------------------------
# the operands of dataflow.butterfly.workloads (same seeds, same draws)

def _butterfly_inputs(*, seed: int = 0, n: int, batch: int, orchestration: str,
                      complex: int = 0) -> dict:
    bref.log2_exact(n, "--n")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, n)).astype(np.float32)
    return {"x": x, "factors": bref.random_factors(n, rng, complex_=bool(complex)),
            "orchestration": orchestration}


def _fft_inputs(*, seed: int = 0, n: int, batch: int, orchestration: str) -> dict:
    bref.log2_exact(n, "--n")
    x = np.random.default_rng(seed).standard_normal((batch, n)).astype(np.float32)
    return {"x": x, "orchestration": orchestration}


def _fnet_inputs(*, seed: int = 0, seq: int, dim: int, orchestration: str) -> dict:
    x = np.random.default_rng(seed).standard_normal((seq, dim)).astype(np.float32)
    return {"x": x, "orchestration": orchestration}


def _ri(z):
    """Complex values as (..., 2) real arrays: the fp32 comparison is of real numbers."""
    z = np.asarray(z)
    return np.stack([z.real, z.imag], -1) if np.iscomplexobj(z) else z


def _bfly_numpy(ops):
    return _ri(bref.butterfly_apply(ops["x"], ops["factors"]))


def _bfly_sim(ops, arch):
    y, run = run_butterfly_matmul(ops["x"], ops["factors"], arch, ops["orchestration"])
    return _ri(y), run.result


def _bfly_cuda(ops, runner=None):
    return _ri(cu.butterfly(ops["x"], ops["factors"], runner=runner))


def _fft_numpy(ops):
    return _ri(np.fft.fft(ops["x"].astype(np.float64)))


def _fft_sim(ops, arch):
    y, run = run_fft(ops["x"], arch, ops["orchestration"])
    return _ri(y), run.result


def _fft_cuda(ops, runner=None):
    return _ri(cu.fft(ops["x"], runner=runner))


def _fnet_numpy(ops):
    return bref.fnet_attention(ops["x"])


def _fnet_sim(ops, arch):
    y, res, _ = run_fnet_attention(ops["x"], arch, ops["orchestration"])
    return y, res


def _fnet_cuda(ops, runner=None):
    return cu.fnet_attention(ops["x"], runner=runner)


def _bfly_describe(ops) -> str:
    x = ops["x"]
    kind = "complex" if any(np.iscomplexobj(f) for f in ops.get("factors", ())) else "real"
    what = f"{kind} factors, " if "factors" in ops else ""
    return f"{x.shape[0]} x {x.shape[1]}, {what}dataflow orchestration {ops['orchestration']}"


def _ffn_inputs(*, seed: int = 0, tokens: int, dim: int, hidden: int, sparsity: float,
                granularity: str) -> dict:
    x, w1, b, w2 = make_ffn_operands(tokens, dim, hidden, sparsity, seed)
    return {"x": x, "w1": w1, "b": b, "w2": w2, "granularity": granularity}


def _ffn_numpy(ops: dict):
    return ffn_reference(ops["x"], ops["w1"], ops["b"], ops["w2"])


def _ffn_sim(ops: dict, arch):
    res, _ = simulate_relu_ffn(ops["x"], ops["w1"], ops["b"], ops["w2"], ops["granularity"],
                               arch)
    return res.output, res


def _ffn_cuda(ops: dict, runner=None):
    return cu.relu_ffn(ops["x"], ops["w1"], ops["b"], ops["w2"], ops["granularity"],
                       runner=runner)


def _ffn_describe(ops: dict) -> str:
    (t, d), h = ops["x"].shape, ops["w1"].shape[1]
    dead = float(np.mean(ops["b"] < 0))
    return (f"{t} tokens, dim {d}, hidden {h} ({100 * dead:.0f}% dead neurons), second layer "
            f"over {ops['granularity']} micro-tiles")


# --- mixture of experts --------------------------------------------------------------------------

def _moe_inputs(*, seed: int = 0, experts: int, top_k: int, tokens: int, dim: int, hidden: int,
                skew: float, placement: str) -> dict:

    # the operands the `moe` workload builds (dataflow.moe.api._run_moe)
    check_moe_params(experts, top_k, tokens, dim, hidden)
    x, wg, bias, w = make_moe_operands(experts, tokens, dim, hidden, skew, seed)
    return {"x": x, "wg": wg, "bias": bias, "w": w, "top_k": top_k, "placement": placement}


def _moe_numpy(ops: dict):
    return moe_reference(ops["x"], ops["wg"], ops["bias"], ops["w"], ops["top_k"])


def _moe_sim(ops: dict, arch):
    res, _ = simulate_moe(ops["x"], ops["wg"], ops["bias"], ops["w"], ops["top_k"], arch,
                          placement=ops["placement"])
    return res.output, res


def _moe_cuda(ops: dict, runner=None):
    return cu.moe(ops["x"], ops["wg"], ops["bias"], ops["w"], ops["top_k"], runner=runner)[0]


def _moe_describe(ops: dict) -> str:
    (t, d), (e, _, h) = ops["x"].shape, ops["w"].shape
    return (f"{t} tokens, {e} experts, top-{ops['top_k']}, dim {d} -> hidden {h}; dataflow "
            f"placement {ops['placement']}")


_TABLE: dict[str, GpuWorkload] = {
    "gemm": GpuWorkload("gemm", _matmul_inputs("gemm"), _matmul_numpy, _matmul_sim, _gemm_cuda,
                        _matmul_describe),
    "spmm": GpuWorkload("spmm", _matmul_inputs("spmm"), _matmul_numpy, _matmul_sim, _spmm_cuda,
                        _matmul_describe),
    "attention": GpuWorkload("attention", _attention_inputs, _attention_numpy, _attention_sim,
                             _attention_cuda, _attention_describe),
    "dynamic-spmm": GpuWorkload("dynamic-spmm", _dynamic_inputs, _dynamic_numpy, _dynamic_sim,
                                _dynamic_cuda, _dynamic_describe),
    "relu-ffn": GpuWorkload("relu-ffn", _ffn_inputs, _ffn_numpy, _ffn_sim, _ffn_cuda,
                            _ffn_describe),
    "moe": GpuWorkload("moe", _moe_inputs, _moe_numpy, _moe_sim, _moe_cuda, _moe_describe),
    "butterfly": GpuWorkload("butterfly", _butterfly_inputs, _bfly_numpy, _bfly_sim, _bfly_cuda,
                             _bfly_describe),
    "fft": GpuWorkload("fft", _fft_inputs, _fft_numpy, _fft_sim, _fft_cuda, _bfly_describe),
    "fnet-attention": GpuWorkload("fnet-attention", _fnet_inputs, _fnet_numpy, _fnet_sim,
                                  _fnet_cuda, _bfly_describe),
}


def register(w: GpuWorkload) -> None:
    """Add (or replace) the CUDA mapping of a dataflow workload."""
    _TABLE[w.name] = w


def gpu_workloads() -> dict[str, GpuWorkload]:
    """The covered workloads that this checkout's dataflow registry has."""

    have = workloads()
    return {k: w for k, w in _TABLE.items() if k in have}


def get(name: str) -> GpuWorkload:
    table = gpu_workloads()
    if name not in table:
        raise UserError(f"workload {name!r} has no CUDA mapping yet; the CUDA path covers "
                         f"{', '.join(sorted(table))}")
    return table[name]


def resolve_params(name: str, given: dict) -> dict:
    """The dataflow workload's parameters with its defaults (an unknown flag is an error)."""

    return get_workload(name).resolve(given)
