"""Workloads `butterfly`, `fft` and `fnet-attention` for `dataflow simulate --workload NAME`.

Each generates seeded fp32 operands, runs the chosen orchestration on the engine and checks the
values against the numpy reference (`finish`). Complex outputs are compared as (..., 2) arrays
of (real, imaginary) parts, so the one fp32 comparison of `dataflow.testing` applies.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from dataflow.butterfly import reference as ref
from dataflow.butterfly.ops import run_butterfly_matmul, run_fft, run_fnet_attention
from dataflow.butterfly.stream import block_rows, stream_batch
from dataflow.errors import UserError
from dataflow.plan.orchestrate import ORCHESTRATIONS
from dataflow.workloads import (
    Param,
    Workload,
    check_host_memory,
    dense_bytes,
    finish,
    register,
)

ORCH = Param("orchestration", str, "multilayer",
             "butterfly stages: layer (DRAM round trip per stage), fused (several stages per "
             "kernel), multilayer (stage kernels co-resident)", choices=ORCHESTRATIONS)
N = Param("n", int, 64, "columns of B and C (butterfly/fft: transform length)")
BATCH = Param("batch", int, 32, "butterfly/fft: vectors transformed at once")


def _ri(z) -> np.ndarray:
    z = np.asarray(z)
    return np.stack([z.real, z.imag], -1) if np.iscomplexobj(z) else z


def _finish(res, y, expected, t0):
    done = finish(dataclasses.replace(res, output=_ri(y)), _ri(expected), t0)
    return dataclasses.replace(done, output=y)


def _sim(out):
    """(values, SimResult) of a `run_butterfly_matmul` / `run_fft` answer."""
    y, run = out
    return y, run.result


def _positive(**kw):
    for k, v in kw.items():
        if v < 1:
            raise UserError(f"--{k} must be a positive integer, got {v}")


def _check_memory(what: str, rows: int, cols: int) -> None:
    """X and Y (complex: 16 bytes a value, with the float64 reference), four times over: the
    stage buffers between kernels and the (real, imaginary) copies the value check makes."""
    check_host_memory(what, 4 * dense_bytes((rows, cols), itemsize=16))


def _run_butterfly(spec, *, engine="fast", seed=0, trace=False, n=64, batch=32,
                   orchestration="multilayer", complex=False):
    _positive(batch=batch)
    ref.log2_exact(n, "--n")
    if block_rows(batch, n) is not None:  # more vectors than the host holds: streamed blocks
        fs = ref.random_factors(n, np.random.default_rng(seed), complex_=bool(complex))
        return stream_batch(
            "butterfly", batch, n, seed,
            lambda rng, rows: rng.standard_normal((rows, n)).astype(np.float32),
            lambda x: _sim(run_butterfly_matmul(x, fs, spec, orchestration, engine)),
            lambda x: ref.butterfly_apply(x, fs))
    _check_memory(f"butterfly operands (--batch {batch} --n {n})", batch, n)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, n)).astype(np.float32)
    fs = ref.random_factors(n, rng, complex_=bool(complex))
    y, run = run_butterfly_matmul(x, fs, spec, orchestration, engine)
    return _finish(dataclasses.replace(run.result, workload="butterfly"), y,
                   ref.butterfly_apply(x, fs), t0)


def _run_fft(spec, *, engine="fast", seed=0, trace=False, n=64, batch=32,
             orchestration="multilayer"):
    _positive(batch=batch)
    ref.log2_exact(n, "--n")
    streamed = stream_batch(
        "fft", batch, n, seed,
        lambda rng, rows: rng.standard_normal((rows, n)).astype(np.float32),
        lambda x: _sim(run_fft(x, spec, orchestration, engine)), np.fft.fft)
    if streamed is not None:  # more vectors than the host holds: streamed blocks
        return streamed
    _check_memory(f"fft operands (--batch {batch} --n {n})", batch, n)
    t0 = time.perf_counter()
    x = np.random.default_rng(seed).standard_normal((batch, n)).astype(np.float32)
    y, run = run_fft(x, spec, orchestration, engine)
    return _finish(dataclasses.replace(run.result, workload="fft"), y, np.fft.fft(x), t0)


def _run_fnet(spec, *, engine="fast", seed=0, trace=False, seq=128, dim=64,
              orchestration="multilayer"):
    ref.log2_exact(seq, "--seq")
    ref.log2_exact(dim, "--dim")
    _check_memory(f"fnet-attention operands (--seq {seq} --dim {dim})", seq, dim)
    t0 = time.perf_counter()
    x = np.random.default_rng(seed).standard_normal((seq, dim)).astype(np.float32)
    y, res, _ = run_fnet_attention(x, spec, orchestration, engine)
    return _finish(res, y, ref.fnet_attention(x), t0)


register(Workload("butterfly", _run_butterfly, (
    N, BATCH, ORCH,
    Param("complex", int, 0, "butterfly: 1 for complex factors (0: real)", choices=(0, 1)),
), "butterfly matrix (log2 n stages of 2x2 factors) times a batch of vectors"))
register(Workload("fft", _run_fft, (N, BATCH, ORCH),
                  "FFT along the last axis as butterfly stages (bit-reversed addressing)"))
register(Workload("fnet-attention", _run_fnet, (
    Param("seq", int, 128, "sequence length (queries = keys)"),
    Param("dim", int, 64, "model width (columns of X)"),
    ORCH,
), "FNet/FABNet token mixing Re(FFT2) over (seq, dim)"))
