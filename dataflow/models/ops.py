"""The runners of every layer kind but convolution (that one is `dataflow.models.conv`), and the
seeded weights of a model that comes without any (a model file).

What runs where:
- GEMM: on the array (`dataflow.models.gemm.simulate_gemm`: lowered, mapped, simulated); a
  batched product runs one matrix after another. A bias is added by the host cost model below.
- ATTENTION: per (batch, head) through `dataflow.sparse_attention(..., backend="sim")` with the
  layer's pattern ("causal" is the lower-triangular mask).
- ELEMENTWISE add and mul: on the array (the frontend's `Elementwise`); a broadcast operand is
  expanded to the full shape first (and read in full, which the DRAM bytes show). relu, gelu,
  silu, layernorm, softmax and the pools: computed on the host in numpy and charged by the
  host cost model.
- EMBEDDING: a gather on the host; the DRAM bytes of the rows read are counted.
- MOE: `dataflow.moe.simulate_moe`.

The host cost model (`modelled_result`), stated once: each pass over a tensor of n words
costs max(ceil(n / (PEs * SIMD lanes)), ceil(rows / (SPM lines * read ports))) cycles, the
array's peak element rate or its SPM row bandwidth, whichever binds (rows = ceil(n / words
per row)); the cycles are counted as compute cycles. The layer reads its inputs from and writes
its output to DRAM, like an engine run, and DRAM time beyond the compute time is a DRAM stall.
The result carries a note saying the layer was modelled.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
from scipy.special import erf

from dataflow.arch import ArchSpec, PEKind
from dataflow.attention.api import mask_csr, sparse_attention
from dataflow.attention.reference import attention_reference
from dataflow.models.gemm import check_weight, simulate_gemm
from dataflow.models.layers import Layer, LayerKind, ModelError
from dataflow.models.runners import LayerRun, RunOptions, register_runner
from dataflow.models.topology import SCALESIM_SIZING
from dataflow.moe.api import simulate_moe
from dataflow.moe.gating import moe_reference
from dataflow.pe_array.result import Roofline, SimResult
from dataflow.pe_array.simulate import assemble_result, sequence_results
from dataflow.ust_frontend.ops import Elementwise
from dataflow.workloads import finish

#: passes over the tensor each host-modelled function takes (the cost model above)
HOST_PASSES = {"relu": 1, "gelu": 1, "gelu_tanh": 1, "silu": 1, "softmax": 3, "layernorm": 3,
               "maxpool": 1, "global_avgpool": 1, "bias": 1}
ARRAY_ELEMENTWISE = ("add", "mul")
ELEMENTWISE_OPS = ARRAY_ELEMENTWISE + tuple(HOST_PASSES)


def host_function(op: str, x: np.ndarray, weights: dict[str, np.ndarray]) -> np.ndarray:
    """The numpy definition of a host-computed element-wise op, in float64 then fp32."""
    x64 = np.asarray(x, dtype=np.float64)
    if op == "relu":
        out = np.maximum(x64, 0.0)
    elif op == "gelu":
        out = 0.5 * x64 * (1.0 + erf(x64 / math.sqrt(2.0)))
    elif op == "gelu_tanh":
        out = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    elif op == "silu":
        out = x64 / (1.0 + np.exp(-x64))
    elif op == "softmax":
        e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
        out = e / e.sum(axis=-1, keepdims=True)
    elif op == "layernorm":
        eps = float(weights.get("eps", np.array(1e-5)))
        mu = x64.mean(axis=-1, keepdims=True)
        var = x64.var(axis=-1, keepdims=True)
        out = (x64 - mu) / np.sqrt(var + eps)
        if "weight" in weights:
            out = out * weights["weight"] + weights.get("bias", 0.0)
    elif op == "global_avgpool":  # NCHW -> NC
        out = x64.mean(axis=(-2, -1))
    else:
        raise ModelError(f"no host definition of element-wise op {op!r}")
    return out.astype(np.float32)


def _maxpool(x: np.ndarray, kernel: int, stride: int, padding: int) -> np.ndarray:
    """NCHW max pooling with -inf padding."""
    xp = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(padding, padding)] * 2, constant_values=-np.inf)
    h = (xp.shape[-2] - kernel) // stride + 1
    w = (xp.shape[-1] - kernel) // stride + 1
    out = np.full(x.shape[:-2] + (h, w), -np.inf, dtype=np.float32)
    for i in range(kernel):
        for j in range(kernel):
            out = np.maximum(out, xp[..., i:i + stride * h:stride, j:j + stride * w:stride])
    return out


def modelled_result(arch: ArchSpec, name: str, *, words_passed: int, passes: int,
                    bytes_read: int, bytes_written: int, output: np.ndarray, why: str,
                    macs: int = 0) -> SimResult:
    """A `SimResult` for work computed on the host, charged by the host cost model (module
    docstring): cycles at the array clock, bytes of DRAM traffic, energy in pJ."""
    pe, spm = arch.pe_array, arch.spm
    rows = math.ceil(words_passed / spm.words_per_row)
    per_pass = max(math.ceil(words_passed / (pe.num_pes * pe.simd_lanes)),
                   math.ceil(rows / (spm.lines * spm.read_ports_per_line)))
    compute = passes * per_pass
    dram_cycles = math.ceil((bytes_read + bytes_written) / arch.dram.bytes_per_cycle)
    stall = max(0, dram_cycles - compute)
    zeros_lines = np.zeros(spm.lines, dtype=np.int64)
    energy = {"compute": passes * words_passed * arch.energy.alu_pj,
              "spm": 2 * passes * rows * arch.energy.spm_access_pj
              * spm.words_per_row * arch.word_bytes * 8 / 64.0,
              "dram": (bytes_read + bytes_written) * arch.energy.dram_byte_pj}
    counts = {"pe_busy_cycles": np.zeros((pe.rows, pe.cols), dtype=np.int64),
              "spm_reads_per_line": zeros_lines, "spm_writes_per_line": zeros_lines.copy(),
              "spm_conflicts_per_line": zeros_lines.copy()}
    return assemble_result(
        arch, workload=name, engine="modelled", counts=counts, energy_pj=energy,
        cycles=compute + stall, compute_cycles=compute, stall_cycles_spm_conflict=0,
        stall_cycles_dram=stall, stall_cycles_reconfiguration=0, stall_cycles_dependency=0,
        macs=macs, dram_bytes_read=bytes_read, dram_bytes_written=bytes_written, kernels=(),
        output=output,
        roofline=Roofline(float(compute), (bytes_read + bytes_written)
                          / arch.dram.bytes_per_cycle, 0.0),
        notes=(f"{name}: modelled, not simulated ({why}): {passes} pass(es) over "
               f"{words_passed:,} words at the array's peak, {compute:,} compute cycles",))


def chain(results: list[SimResult], name: str, notes: tuple[str, ...] = ()) -> SimResult:
    """Runs one after another on the whole array as one result
    (`pe_array.simulate.sequence_results`), each note once."""
    if len(results) == 1 and not notes:
        return results[0]
    seen: list[str] = []
    for r in results:
        seen += [n for n in r.notes if n not in seen]
    return sequence_results(results, name, results[-1].output, notes=tuple(seen) + notes,
                            mapping_summary=results[0].mapping_summary)


def _bytes(arch: ArchSpec, *arrays: np.ndarray) -> int:
    return sum(int(np.asarray(a).size) for a in arrays) * arch.word_bytes


# --- GEMM -------------------------------------------------------------------------------------

def run_gemm(layer: Layer, inputs, weights, arch: ArchSpec, options: RunOptions) -> LayerRun:
    """(..., m, k) @ (k, n) [+ bias]: B is the layer's `weight` (k x n) or its second input
    (a batched activation product, one matrix after another)."""
    t0 = time.perf_counter()
    check_weight(layer, weights)
    a = np.asarray(inputs[0], dtype=np.float32)
    b = np.asarray(weights["weight"] if "weight" in weights else inputs[1], dtype=np.float32)
    batch = a.shape[:-2] if b.ndim > 2 else ()
    a3 = a.reshape(-1, a.shape[-2], a.shape[-1]) if b.ndim > 2 else a.reshape(1, -1, a.shape[-1])
    b3 = np.broadcast_to(b, batch + b.shape[-2:]).reshape(-1, *b.shape[-2:]) if b.ndim > 2 \
        else b[None]
    if a3.shape[-1] != b3.shape[-2]:
        raise ModelError(f"{layer.where}: layer {layer.name!r}: inner sizes differ, A {a.shape} "
                         f"@ B {b.shape}")
    results, outs = [], []
    for i in range(a3.shape[0]):
        bi = np.ascontiguousarray(b3[min(i, len(b3) - 1)])
        out, res = simulate_gemm(a3[i], bi, arch, options, layer.name)
        results.append(res)
        outs.append(np.asarray(out, dtype=np.float32))
    out = np.stack(outs)
    ref = np.einsum("bmk,bkn->bmn", a3.astype(np.float64), b3.astype(np.float64))
    if "bias" in weights:
        bias = np.asarray(weights["bias"], dtype=np.float32)
        out = (out + bias).astype(np.float32)
        ref = ref + bias
        results.append(modelled_result(
            arch, f"{layer.name}/bias", words_passed=out.size, passes=HOST_PASSES["bias"],
            bytes_read=_bytes(arch, bias), bytes_written=0, output=out,
            why="the bias add runs on the host; its words are the product's, already in the SPM"))
    lead = a.shape[:-2] if b.ndim > 2 else a.shape[:-1]
    shape = lead + ((a.shape[-2],) if b.ndim > 2 else ()) + (b.shape[-1],)
    res = finish(dataclasses.replace(chain(results, layer.name), output=out.reshape(shape)),
                 ref.reshape(shape), t0)
    return LayerRun(res, out.reshape(shape), ref.reshape(shape).astype(np.float32))


# --- attention --------------------------------------------------------------------------------

def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(..., seq, dim) per head: a 2-D (seq, heads * head_dim) is split by columns."""
    if x.ndim == 2:
        seq, width = x.shape
        return x.reshape(seq, heads, width // heads).transpose(1, 0, 2)
    return x.reshape(-1, *x.shape[-2:])


def run_attention(layer: Layer, inputs, weights, arch: ArchSpec, options: RunOptions) -> LayerRun:
    """softmax(mask(Q K^T / sqrt(d))) V per head on the array; `layer.op` the pattern."""
    q, k, v = (np.asarray(x, dtype=np.float32) for x in inputs[:3])
    heads = layer.size("heads", 1)
    qh, kh, vh = (_heads(x, heads) for x in (q, k, v))
    seq = qh.shape[1]
    pattern = layer.op or "dense"
    mask = np.tril(np.ones((seq, seq), dtype=np.float32)) if pattern == "causal" else pattern
    results, outs, refs = [], [], []
    pos, crd, _ = mask_csr(mask, seq)
    for h in range(qh.shape[0]):
        # the reference once per head: the layer keeps it, the run checks against it
        refs.append(attention_reference(qh[h], kh[h], vh[h], pos, crd))
        out, res = sparse_attention(qh[h], kh[h], vh[h], pattern=mask, backend="sim", arch=arch,
                                    engine=options.engine, return_result=True,
                                    reference=refs[-1])
        results.append(res)
        outs.append(out)
    out, ref = np.stack(outs), np.stack(refs)
    if q.ndim == 2:
        out, ref = (x.transpose(1, 0, 2).reshape(seq, -1) for x in (out, ref))
    else:
        out, ref = (x.reshape(q.shape[:-1] + (v.shape[-1],)) for x in (out, ref))
    res = chain(results, layer.name, (f"{layer.name}: {qh.shape[0]} head(s) one after "
                                            f"another, pattern {pattern}",))
    return LayerRun(dataclasses.replace(res, output=out), out.astype(np.float32),
                    ref.astype(np.float32))


# --- element-wise -----------------------------------------------------------------------------

def run_elementwise(layer: Layer, inputs, weights, arch: ArchSpec,
                    options: RunOptions) -> LayerRun:
    """add / mul on the array; the other functions on the host (module docstring), and add / mul
    too on a systolic array, which runs only dense GEMM."""
    op = layer.op
    x = np.asarray(inputs[0], dtype=np.float32)
    if op in ARRAY_ELEMENTWISE:
        other = inputs[1] if len(inputs) > 1 else weights["other"]
        shape = np.broadcast_shapes(x.shape, np.shape(other))
        a = np.ascontiguousarray(np.broadcast_to(x, shape), dtype=np.float32)
        b = np.ascontiguousarray(np.broadcast_to(np.asarray(other, np.float32), shape))
        if arch.pe_array.kind == PEKind.SYSTOLIC:
            out = (a + b if op == "add" else a * b).astype(np.float32)
            res = modelled_result(arch, layer.name, words_passed=out.size, passes=1,
                                  bytes_read=_bytes(arch, a, b), bytes_written=_bytes(arch, out),
                                  output=out, why=f"{op} on a systolic array runs on the host")
            return LayerRun(res, out, out)
        ew = Elementwise("add" if op == "add" else "multiply", a, b)
        ew.plan(arch=arch, backend="sim", dataflow=options.dataflow)
        out = np.asarray(ew.execute("sim"), dtype=np.float32)
        ref = a.astype(np.float64) + b if op == "add" else a.astype(np.float64) * b
        res = dataclasses.replace(ew.last_result, workload=layer.name)
        return LayerRun(res, out, ref.astype(np.float32))
    if op not in HOST_PASSES:
        raise ModelError(f"{layer.where}: layer {layer.name!r}: unknown element-wise op "
                         f"{op!r}; known: {list(ELEMENTWISE_OPS)}")
    if op == "maxpool":
        out = _maxpool(x, layer.size("kernel"), layer.size("stride"), layer.size("padding", 0))
    else:
        out = host_function(op, x, weights)
    params = [w for k, w in weights.items() if k != "eps"]
    res = modelled_result(arch, layer.name, words_passed=x.size, passes=HOST_PASSES[op],
                          bytes_read=_bytes(arch, x, *params), bytes_written=_bytes(arch, out),
                          output=out, why=f"{op} has no array lowering in the frontend")
    return LayerRun(res, out, out)


# --- embedding --------------------------------------------------------------------------------

def run_embedding(layer: Layer, inputs, weights, arch: ArchSpec, options: RunOptions) -> LayerRun:
    """A table lookup: the rows read from DRAM, gathered on the host."""
    ids = np.asarray(inputs[0])
    if not np.issubdtype(ids.dtype, np.integer):
        ids = ids.astype(np.int64)
    table = np.asarray(weights["weight"], dtype=np.float32)
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise ModelError(f"{layer.where}: layer {layer.name!r}: token ids outside "
                         f"[0, {table.shape[0]})")
    out = table[ids]
    res = modelled_result(arch, layer.name, words_passed=out.size, passes=1,
                          bytes_read=_bytes(arch, out) + ids.size * arch.word_bytes,
                          bytes_written=_bytes(arch, out), output=out,
                          why="a gather of the rows on the host; DRAM bytes are the rows read")
    return LayerRun(res, out, out)


# --- mixture of experts -----------------------------------------------------------------------

def run_moe(layer: Layer, inputs, weights, arch: ArchSpec, options: RunOptions) -> LayerRun:
    x = np.asarray(inputs[0], dtype=np.float32)
    x2 = x.reshape(-1, x.shape[-1])
    top_k = layer.size("top_k")
    wg, bias, w = weights["gate"], weights["gate_bias"], weights["experts"]
    res, _ = simulate_moe(x2, wg, bias, w, top_k, arch, engine=options.engine)
    out = np.asarray(res.output, dtype=np.float32)
    ref = moe_reference(x2, wg, bias, w, top_k)
    shape = x.shape[:-1] + (out.shape[-1],)
    return LayerRun(dataclasses.replace(res, workload=layer.name), out.reshape(shape),
                    np.asarray(ref, dtype=np.float32).reshape(shape))


# --- seeded weights of a model file -----------------------------------------------------------

def make_weights(layer: Layer, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Seeded fp32 weights of a layer that comes without them, scaled so activations stay
    about unit size: weight ~ N(0, 1/fan_in), biases ~ N(0, 0.02^2), layernorm gamma 1."""

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    kind = layer.kind
    if kind == LayerKind.GEMM and len(layer.inputs) == 1:
        k, n = layer.size("k"), layer.size("n")
        weight = {"weight": normal(k, n, scale=1 / math.sqrt(k))}
        if layer.op == SCALESIM_SIZING:  # a SCALE-Sim GEMM row is the product alone
            return weight
        return {**weight, "bias": normal(n, scale=0.02)}
    if kind == LayerKind.CONV2D:  # torch's (out, in, r, s) layout
        c, k = layer.size("c"), layer.size("k")
        r, s = layer.size("r"), layer.size("s")
        return {"weight": normal(k, c, r, s, scale=1 / math.sqrt(c * r * s))}
    if kind == LayerKind.ELEMENTWISE and layer.op == "layernorm":
        cols = layer.size("cols")
        return {"weight": np.ones(cols, np.float32), "bias": np.zeros(cols, np.float32),
                "eps": np.array(1e-5)}
    if kind == LayerKind.EMBEDDING:
        return {"weight": normal(layer.size("vocab"), layer.size("dim"))}
    if kind == LayerKind.MOE:
        dim, hidden, e = layer.size("dim"), layer.size("hidden"), layer.size("experts")
        return {"gate": normal(dim, e, scale=1 / math.sqrt(dim)),
                "gate_bias": np.zeros(e, np.float32),
                "experts": normal(e, dim, hidden, scale=1 / math.sqrt(dim))}
    return {}


register_runner(LayerKind.GEMM, run_gemm)
register_runner(LayerKind.ATTENTION, run_attention)
register_runner(LayerKind.ELEMENTWISE, run_elementwise)
register_runner(LayerKind.EMBEDDING, run_embedding)
register_runner(LayerKind.MOE, run_moe)
