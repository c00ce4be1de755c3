"""ReLU activation sparsity in an FFN: Y = ReLU(X W1 + b) W2, the second layer sparse at run time.

PIT's end-to-end case (docs/references.md#pit: OPT with ReLU activation sparsity up to 99%): the
hidden activations H = ReLU(X W1 + b) are zero wherever a neuron is inactive for a token, which
is known only once H exists. The program runs, all on the array and chained through the SPM:
`ffn_up` (dense GEMM X W1), `relu` (add the bias, max with 0), the run-time index build over H
(`index_scan`, `index_compact`), and the micro-tile kernels of H @ W2 (`dataflow.dynamic.lower`).

The operands make a fraction `sparsity` of the hidden neurons dead (a bias of -100 on
pre-activations of about unit size: their whole column of H is zero, so 32 x 1 micro-tiles of
32 tokens x 1 neuron vanish), and about half of the live neurons' activations are zero
element-wise, as ReLU gives. The measured sparsity of H is in the result's notes.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from dataflow.arch import resolve_arch
from dataflow.dfg.graph import Addr, Buffer, Kernel, Loop, Node, Program
from dataflow.dfg.lower import gemm_kernel, run_passes
from dataflow.dfg.ops import Op
from dataflow.dynamic.ffn_split import split_relu_ffn
from dataflow.dynamic.lower import (
    ROW_PAD,
    compute_kernels,
    index_kernels,
    padded_gemm_kernel,
    renamed,
    zero_output_kernel,
)
from dataflow.dynamic.microtile import build_index, check_shape, check_sparsity, parse_granularity
from dataflow.dynamic.stats import CHOICES, DynamicStats
from dataflow.errors import UserError
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan.compile import compile_program
from dataflow.workloads import Param, check_host_memory, dense_bytes, finish

DEAD_BIAS = -100.0

FFN_PARAMS = (
    Param("tokens", int, 64, "tokens (rows of X)"),
    Param("dim", int, 64, "model width (columns of X and Y)"),
    Param("hidden", int, 256, "hidden width (relu-ffn: of the FFN; moe: of each expert's output)"),
    Param("sparsity", float, 0.9, "fraction of zeros, in [0, 1)"),
    Param("granularity", str, "32x1", "micro-tile of the second layer's gathers",
          choices=("32x1", "1x64", "32x64", "dense")),
)


def make_ffn_operands(tokens: int, dim: int, hidden: int, sparsity: float, seed: int = 0):
    """X (tokens x dim), W1 (dim x hidden, scaled so pre-activations are ~N(0, 1)), b (hidden:
    DEAD_BIAS on a `sparsity` fraction of neurons, else 0), W2 (hidden x dim); fp32, seeded."""
    for name, v in (("tokens", tokens), ("dim", dim), ("hidden", hidden)):
        if v <= 0:
            raise UserError(f"--{name} must be a positive integer, got {v}")
    check_sparsity(sparsity)
    # X, W1, W2, the hidden activations and Y, twice over (the reference's copies)
    check_host_memory(f"relu-ffn operands (--tokens {tokens} --dim {dim} --hidden {hidden})",
                      2 * dense_bytes((tokens, dim), (dim, hidden), (hidden, dim),
                                      (tokens, hidden), (tokens, dim)))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, dim), dtype=np.float32)
    w1 = (rng.standard_normal((dim, hidden)) / np.sqrt(dim)).astype(np.float32)
    b = np.zeros(hidden, dtype=np.float32)
    b[rng.permutation(hidden)[: round(sparsity * hidden)]] = DEAD_BIAS
    w2 = (rng.standard_normal((hidden, dim)) / np.sqrt(hidden)).astype(np.float32)
    return x, w1, b, w2


def ffn_reference(x, w1, b, w2) -> np.ndarray:
    """Y = ReLU(X W1 + b) W2 in float64, as float32."""
    h = np.maximum(x.astype(np.float64) @ w1 + b, 0.0)
    return (h @ w2.astype(np.float64)).astype(np.float32)


def relu_kernel(t: int, h: int, ld: int) -> Kernel:
    """Hact[i, j] = max(H0[i, j] + b[j], 0), Hact stored with leading dimension `ld` (the
    padded layout the sparse kernels read, `dataflow.dynamic.lower.ROW_PAD`)."""
    nodes = (
        Node(0, Op.LOAD, buffer="H0", addr=Addr((("i", h), ("j", 1))), name="h"),
        Node(1, Op.LOAD, buffer="bias", addr=Addr((("j", 1),)), name="b"),
        Node(2, Op.ADD, (0, 1), name="h+b"),
        Node(3, Op.CONST, value=0.0, name="0"),
        Node(4, Op.MAX, (2, 3), name="relu"),
        Node(5, Op.STORE, (4,), buffer="Hact", addr=Addr((("i", ld), ("j", 1))), name="Hact="),
    )
    return Kernel(name="relu", loops=(Loop("i", t), Loop("j", h)), nodes=nodes,
                  buffers=(Buffer("H0", t * h), Buffer("bias", h),
                           Buffer("Hact", t * ld, "output")),
                  vector_var="j")


def lower_relu_ffn(x, w1, b, w2, granularity: str, dtype=np.float32):
    """(Program, hidden activations as the host computes them, index or None for dense)."""
    (t, d), h = x.shape, w1.shape[1]
    hact = np.maximum(x @ w1 + b, np.float32(0)).astype(dtype)
    ld = h + ROW_PAD
    up = renamed(gemm_kernel(t, d, h), {"A": "X", "B": "W1", "C": "H0"}, "ffn_up")
    kernels = [up, relu_kernel(t, h, ld)]
    inputs = [("X", x), ("W1", w1), ("bias", b), ("W2", w2)]
    index = None
    if granularity == "dense":
        kernels.append(padded_gemm_kernel(t, h, d, ld, "Hact", "W2", "Y", "ffn_down"))
    else:
        tile = parse_granularity(granularity)

        check_shape(t, h, tile, granularity)
        index = build_index(hact, tile)
        ik, iin = index_kernels(t, h, index, "Hact", with_tile_id=tile[0] == 1, ld=ld)
        ck, cin = compute_kernels("Hact", hact, d, index, panel_rows=t, dtype=dtype, ld=ld)
        names = {"B": "W2", "C": "Y"}
        kernels += list(ik) + [renamed(k, names) for k in ck]
        inputs += iin + cin
        if not ck:
            kernels.append(renamed(zero_output_kernel(t, d), names))
    prog = Program(
        name=f"relu_ffn_{granularity}_{t}x{d}x{h}", kernels=tuple(kernels),
        inputs=tuple((nm, np.ascontiguousarray(v, dtype=np.int64 if v.dtype.kind == "i" else dtype)
                      .ravel())
                     for nm, v in inputs),
        outputs=(("Y", (t, d)),), dtype=np.dtype(dtype).name,
        macs=t * d * h + int(np.count_nonzero(hact)) * d)
    return run_passes(prog), hact, index


def simulate_relu_ffn(x, w1, b, w2, granularity: str = "32x1", arch=None, *, engine="fast",
                      trace=False):
    """Simulate the FFN; returns (SimResult, DynamicStats of its second layer)."""

    if granularity not in CHOICES:
        raise UserError(f"--granularity must be one of {CHOICES}, got {granularity!r}")
    t0 = time.perf_counter()
    spec = resolve_arch(arch)
    prog, hact, index = lower_relu_ffn(x, w1, b, w2, granularity)
    mapping = compile_program(prog, spec)
    res = simulate_mapping(mapping, engine=engine, trace=trace, workload=f"relu-ffn/{granularity}")
    res = finish(res, ffn_reference(x, w1, b, w2), t0, mapping)
    t, d = x.shape
    h = w1.shape[1]
    # MACs of the second layer: all MULs minus the first GEMM's and (sparse) the scan's squares
    skip = t * d * h + (hact.size if index is not None else 0)
    idx = sum(kr.end_cycle - kr.start_cycle for kr in res.kernels
              if kr.kernel.startswith("index_"))
    stats = DynamicStats(granularity=granularity, sparsity=1.0 - np.count_nonzero(hact) / hact.size,
                         tile_density=index.tile_density if index is not None else 1.0,
                         computed_macs=res.macs - skip, useful_macs=int(np.count_nonzero(hact)) * d,
                         index_cycles=idx, compute_cycles=res.cycles - idx, cycles=res.cycles)
    return dataclasses.replace(res, notes=res.notes + stats.notes()), stats


def run_relu_ffn(spec, *, engine="fast", seed=0, trace=False, tokens=64, dim=64, hidden=256,
                 sparsity=0.9, granularity="32x1"):
    split = split_relu_ffn(spec, engine=engine, seed=seed, trace=trace, tokens=tokens, dim=dim,
                           hidden=hidden, sparsity=sparsity, granularity=granularity,
                           make_operands=make_ffn_operands, simulate=simulate_relu_ffn,
                           reference=ffn_reference)
    if split is not None:  # too many tokens for the SPM or the host: token blocks
        return split
    x, w1, b, w2 = make_ffn_operands(tokens, dim, hidden, sparsity, seed)
    res, _ = simulate_relu_ffn(x, w1, b, w2, granularity, spec, engine=engine, trace=trace)
    return res
