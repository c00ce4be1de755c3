"""Butterfly ops on the `numpy` (reference) and `sim` (the engine) backends.

Every `sim` call lowers (`dfg.lower_butterfly`), plans and maps the orchestration
(`plan.orchestrate`) and simulates (`butterfly.simulate`); the values come from the engine.
The `run_*` functions return the `OrchestratedRun` (SimResult, spans, bounds) as well.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dataflow.arch import resolve_arch
from dataflow.butterfly import reference as ref
from dataflow.butterfly.reference import ButterflyError
from dataflow.butterfly.simulate import (
    OrchestratedRun,
    chain_runs,
    merge_results,
    simulate_orchestrated,
)
from dataflow.dfg.lower_butterfly import ButterflyKind, ButterflySpec, lower_butterfly, unpack_data
from dataflow.plan.orchestrate import (
    MAX_STAGES_PER_KERNEL,
    ORCHESTRATIONS,
    SPMCapacityError,
    map_butterfly,
    plan_orchestration,
    round_trips,
)
from dataflow.ust_frontend.backends import get_executor

BACKENDS = ("numpy", "sim", "cuda")  # cuda: dataflow.cuda kernels (GPU or simulator)
#: run here; any other backend is looked up in the frontend's backend registry
BUILTIN_BACKENDS = ("numpy", "sim")


def _check(backend: str, orchestration: str) -> None:
    if backend not in BACKENDS:
        raise ButterflyError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if orchestration not in ORCHESTRATIONS:
        raise ButterflyError(f"orchestration must be one of {ORCHESTRATIONS}, "
                             f"got {orchestration!r}")


def run_spec(spec: ButterflySpec, x2d: np.ndarray, arch, orchestration: str = "multilayer",
             engine: str = "fast", factors=None, bias=None,
             max_stages_per_kernel: int | None = MAX_STAGES_PER_KERNEL,
             workload: str | None = None) -> OrchestratedRun:
    """Plan, lower, map and simulate one butterfly product on a (batch, n) operand."""
    plan = plan_orchestration(spec, arch, orchestration, max_stages_per_kernel)
    return _run_planned(spec, plan, x2d, arch, engine, factors, bias, workload)


def _run_planned(spec, plan, x2d, arch, engine, factors=None, bias=None, workload=None):
    choice = plan.choice
    spec = dataclasses.replace(spec, skew_lines=choice.skew_lines, skew_perm=choice.skew_perm,
                               skew_flip=choice.skew_flip)
    prog = lower_butterfly(spec, plan.groups, x2d, factors, bias)
    om = map_butterfly(prog, spec, arch, plan)
    return simulate_orchestrated(om, engine, workload)


def run_fft_spec(spec: ButterflySpec, x2d: np.ndarray, arch, orchestration: str = "multilayer",
                 engine: str = "fast", max_stages_per_kernel: int | None = MAX_STAGES_PER_KERNEL,
                 workload: str | None = None, split: int | None = None) -> OrchestratedRun:
    """An FFT spec (`kind="fft"`, bit-reversed input) on the engine, split four-step when one
    tile of the full length does not fit the SPM (or when `split` = a asks for it).

    Four-step (Bailey's FFT; the FFT form of MLX's hierarchical butterflies, see
    docs/references.md#mlx): N = n1 n2 with n1 = 2^a. The N-point DIT's stages 0 .. a-1 only mix
    points within blocks of n1 (bit-reversed index space), which are the n1-point FFTs of the
    columns x[b, q n2 + m] over q; stages a .. S-1 only mix points with equal low a bits. So
    pass A is an n1-point FFT of the batch * n2 rows (b, m), and pass B the column pass
    (`ButterflySpec.col_bits` = a) over the batch * n1 rows (b, k1): the remaining stages with
    their twiddles W^((P mod 2^j) 2^a + k1), no separate twiddle multiply. The DMA turns the
    corners (strided reads and writes of whole rows); both passes count their DRAM bytes, so
    the split costs at least one extra DRAM round trip. The split with the fewest round trips
    (`orchestrate.round_trips`, closed form) is used, the largest n1 among equals."""
    if split is None:
        try:
            plan = plan_orchestration(spec, arch, orchestration, max_stages_per_kernel)
            return _run_planned(spec, plan, x2d, arch, engine, workload=workload)
        except SPMCapacityError as exc:
            whole = exc
        candidates = range(spec.stages - 1, 0, -1)
    else:
        whole, candidates = None, [split]
    batch, n = x2d.shape

    def passes(a):
        n1, n2 = 1 << a, n >> a
        return (dataclasses.replace(spec, n=n1, batch=batch * n2, real_output=False,
                                    prefix=spec.prefix + "a"),
                dataclasses.replace(spec, n=n2, batch=batch * n1, real_input=False, col_bits=a,
                                    prefix=spec.prefix + "b"))

    trips = {}
    for a in candidates:
        if (1 << a) % spec.lanes:
            continue
        try:
            trips[a] = sum(round_trips(s, arch, orchestration, max_stages_per_kernel)
                           for s in passes(a))
        except SPMCapacityError:
            continue
    if trips:
        # fewest DRAM round trips (closed form), then the largest n1 (fewest stages left over)
        a = min(trips, key=lambda a: (trips[a], -a))
        n1, n2 = 1 << a, n >> a
        sa, sb = passes(a)
        plans = [plan_orchestration(s, arch, orchestration, max_stages_per_kernel)
                 for s in (sa, sb)]
        xa = x2d.reshape(batch, n1, n2).transpose(0, 2, 1).reshape(batch * n2, n1)
        ra = _run_planned(sa, plans[0], xa, arch, engine, workload=f"{workload or 'fft'}-rows")
        xb = _unblock(ra, sa).reshape(batch, n2, n1).transpose(0, 2, 1).reshape(batch * n1, n2)
        rb = _run_planned(sb, plans[1], xb, arch, engine, workload=f"{workload or 'fft'}-cols")
        y = _unblock(rb, sb).reshape(batch, n1, n2).transpose(0, 2, 1).reshape(batch, n)
        note = (f"four-step FFT: N = {n} = {n1} x {n2} (a {n}-point tile does not fit the SPM; "
                f"split with the fewest DRAM round trips, {trips[a]}); pass A: {n1}-point FFTs of "
                f"{batch * n2} rows, pass B: the last {sb.stages} stages on {batch * n1} rows, "
                f"corner turns by the DMA through DRAM")
        return chain_runs([ra, rb], workload or "fft", {"y": y}, spec=spec, notes=(note,),
                          arch=arch)
    if whole is not None:
        raise whole
    raise SPMCapacityError(f"four-step split a={split} of n={n} does not fit the SPM "
                           f"of {arch.name!r}")


def _unblock(run: OrchestratedRun, spec: ButterflySpec) -> np.ndarray:
    if "y" in run.outputs:  # a chained (four-step) run carries its (batch, n) result
        return run.outputs["y"]
    spec = run.spec
    groups = len(run.result.kernels)
    return unpack_data(spec, run.outputs, groups, groups)


def _flatten(x) -> tuple[np.ndarray, tuple]:
    x = np.asarray(x)
    if x.ndim < 1 or x.shape[-1] < 2:
        raise ButterflyError(f"x must have a last axis of length >= 2, got shape {x.shape}")
    return x.reshape(-1, x.shape[-1]), x.shape


# --- FFT ---------------------------------------------------------------------------------------

def run_fft(x, arch=None, orchestration: str = "multilayer", engine: str = "fast",
            **options) -> tuple[np.ndarray, OrchestratedRun]:
    """`fft` on the engine: (complex64 result shaped like x, the run)."""
    arch = resolve_arch(arch)
    x2, shape = _flatten(x)
    ref.log2_exact(x2.shape[1], "the last axis of x")
    spec = ButterflySpec(n=x2.shape[1], batch=x2.shape[0], lanes=arch.pe_array.simd_lanes,
                         kind=ButterflyKind.FFT, bitrev_input=True,
                         real_input=not np.iscomplexobj(x2))
    run = run_fft_spec(spec, x2, arch, orchestration, engine, **options)
    return _unblock(run, spec).astype(np.complex64).reshape(shape), run


def fft(x, backend: str = "numpy", arch=None, orchestration: str = "multilayer",
        engine: str = "fast") -> np.ndarray:
    """The DFT along the last axis (power-of-two length), as butterfly stages on the
    bit-reversed input. Equals `np.fft.fft(x)` within fp32 tolerance (`dataflow.testing`).
    `numpy`: the butterfly reference in float64; `sim`: computed by the simulated array."""
    _check(backend, orchestration)
    if backend == "numpy":
        return ref.fft_reference(x)
    if backend not in BUILTIN_BACKENDS:
        return get_executor("fft", backend)(x)
    return run_fft(x, arch, orchestration, engine)[0]


# --- general butterfly products ---------------------------------------------------------------

def _matrix_spec(x2, factors, arch, bias=None, relu=False, prefix="") -> ButterflySpec:
    cplx = np.iscomplexobj(x2) or any(np.iscomplexobj(np.asarray(f)) for f in factors)
    if cplx and (bias is not None or relu):
        raise ButterflyError("bias/relu epilogues take real x and real factors")
    return ButterflySpec(n=x2.shape[1], batch=x2.shape[0], lanes=arch.pe_array.simd_lanes,
                         kind=ButterflyKind.COMPLEX if cplx else ButterflyKind.REAL,
                         real_input=cplx and not np.iscomplexobj(x2),
                         bias=bias is not None, relu=relu, prefix=prefix)


def run_butterfly_matmul(x, factors, arch=None, orchestration: str = "multilayer",
                         engine: str = "fast", bias=None, relu: bool = False,
                         **options) -> tuple[np.ndarray, OrchestratedRun]:
    """`butterfly_matmul` on the engine: (result shaped like x, the run)."""
    arch = resolve_arch(arch)
    x2, shape = _flatten(x)
    factors = ref.check_factors(factors, x2.shape[1])
    spec = _matrix_spec(x2, factors, arch, bias, relu)
    run = run_spec(spec, x2, arch, orchestration, engine, factors=factors, bias=bias, **options)
    y = _unblock(run, spec)
    return y.astype(np.complex64 if spec.complex_data else np.float32).reshape(shape), run


def butterfly_matmul(x, factors, backend: str = "numpy", arch=None,
                     orchestration: str = "multilayer", engine: str = "fast") -> np.ndarray:
    """B x along the last axis for the butterfly B = F_(S-1) ... F_0 given by `factors`
    (log2(n) arrays of shape (n/2, 2, 2), real or complex; see `butterfly.reference`)."""
    _check(backend, orchestration)
    if backend == "numpy":
        return ref.butterfly_apply(x, factors)
    if backend not in BUILTIN_BACKENDS:
        return get_executor("butterfly", backend)(
            x, ref.check_factors(factors, np.asarray(x).shape[-1]))
    return run_butterfly_matmul(x, factors, arch, orchestration, engine)[0]


def butterfly_linear(x, factors, bias=None, backend: str = "numpy", arch=None,
                     orchestration: str = "multilayer", engine: str = "fast") -> np.ndarray:
    """y = B x + bias (real): the bias add is the last stage kernel's epilogue on `sim`."""
    _check(backend, orchestration)
    if backend == "numpy":
        return ref.butterfly_linear(x, factors, bias)
    if backend not in BUILTIN_BACKENDS:
        return get_executor("butterfly_linear", backend)(
            x, ref.check_factors(factors, np.asarray(x).shape[-1]), bias)
    return run_butterfly_matmul(x, factors, arch, orchestration, engine, bias=bias)[0]


def butterfly_ffn(x, factors1, factors2, bias1=None, bias2=None, backend: str = "numpy",
                  arch=None, orchestration: str = "multilayer", engine: str = "fast") -> np.ndarray:
    """FABNet's butterfly FFN B2 relu(B1 x + b1) + b2 (real); on `sim` two butterfly programs,
    the ReLU and biases fused into their last stages."""
    _check(backend, orchestration)
    if backend == "numpy":
        return ref.butterfly_ffn(x, factors1, factors2, bias1, bias2)
    if backend not in BUILTIN_BACKENDS:
        n = np.asarray(x).shape[-1]
        return get_executor("butterfly_ffn", backend)(
            x, ref.check_factors(factors1, n), ref.check_factors(factors2, n), bias1, bias2)
    h, _ = run_butterfly_matmul(x, factors1, arch, orchestration, engine, bias=bias1, relu=True)
    return run_butterfly_matmul(h, factors2, arch, orchestration, engine, bias=bias2)[0]


# --- FNet / FABNet attention replacement -------------------------------------------------------

def run_fnet_attention(x, arch=None, orchestration: str = "multilayer", engine: str = "fast",
                       **options):
    """Re(FFT_seq(FFT_hidden(x))) for x of shape (seq, dim) on the engine: two butterfly
    programs (FFT over hidden for every token, then over the sequence for every feature,
    real part only). Between them the intermediate goes to DRAM and comes back transposed by
    the DMA (a corner turn: a 2-D FFT of seq x dim complex words does not fit the SPM in
    general); both programs count that traffic. Returns (float32 (seq, dim), the merged
    SimResult, (pass-1 run, pass-2 run))."""
    arch = resolve_arch(arch)
    x = np.asarray(x)
    if x.ndim != 2:
        raise ButterflyError(f"fnet attention takes x of shape (seq, dim), got {x.shape}")
    seq, dim = x.shape
    ref.log2_exact(seq, "seq")
    ref.log2_exact(dim, "dim")
    lanes = arch.pe_array.simd_lanes
    s1 = ButterflySpec(n=dim, batch=seq, lanes=lanes, kind=ButterflyKind.FFT, bitrev_input=True,
                       real_input=not np.iscomplexobj(x), prefix="h")
    r1 = run_fft_spec(s1, x, arch, orchestration, engine, workload="fnet-hidden", **options)
    h = _unblock(r1, s1)                                   # (seq, dim) complex
    s2 = ButterflySpec(n=seq, batch=dim, lanes=lanes, kind=ButterflyKind.FFT, bitrev_input=True,
                       real_output=True, prefix="s")
    r2 = run_fft_spec(s2, np.ascontiguousarray(h.T), arch, orchestration, engine,
                  workload="fnet-seq", **options)
    y = _unblock(r2, s2).T.astype(np.float32)              # (seq, dim) real part
    res = merge_results([r1.result, r2.result], "fnet-attention", y,
                        notes=(("2-D FFT: pass 1 over hidden, DMA corner turn through DRAM, "
                                "pass 2 over the sequence (real part kept); pass 2's "
                                "configuration overlaps pass 1's last write-backs"),),
                        runs=[r1, r2], arch=arch)
    return y, dataclasses.replace(res, output=y), (r1, r2)


def fnet_attention(x, backend: str = "numpy", arch=None, orchestration: str = "multilayer",
                   engine: str = "fast") -> np.ndarray:
    """FNet token mixing Re(FFT2(x)) over (seq, dim)."""
    _check(backend, orchestration)
    if backend == "numpy":
        return ref.fnet_attention(x)
    if backend not in BUILTIN_BACKENDS:
        return get_executor("fnet_attention", backend)(x)
    return run_fnet_attention(x, arch, orchestration, engine)[0]
