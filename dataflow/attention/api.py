"""`sparse_attention(q, k, v, pattern=..., backend=...)` and the `attention` workload."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from dataflow.attention.lower import KERNEL_PHASE
from dataflow.attention.op import SparseAttention
from dataflow.attention.patterns import (
    DEFAULTS,
    PATTERNS,
    AttentionPattern,
    PatternError,
    mask_coords,
    resolve,
)
from dataflow.attention.reference import attention_reference
from dataflow.attention.split import split_attention
from dataflow.errors import UserError
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.ust_frontend.backends import get_executor
from dataflow.ust_frontend.extras import warn_if_grad
from dataflow.ust_frontend.named import NamedFormats
from dataflow.ust_frontend.ops import as_tensor, csr_arrays
from dataflow.ust_frontend.tensor import Tensor
from dataflow.workloads import (
    Param,
    Workload,
    check_host_memory,
    dense_bytes,
    finish,
    register,
)

BACKENDS = ("numpy", "sim", "cuda")  # cuda: dataflow.cuda kernels (GPU or simulator)


def mask_csr(pattern, seq: int, **pattern_params) -> tuple[np.ndarray, np.ndarray, Tensor]:
    """(pos, crd, mask as a CSR Tensor) of a pattern name, an `AttentionPattern`, or a given
    mask (a UST Tensor in any format, scipy.sparse matrix or numpy array whose nonzeros are the
    attended pairs; converted to CSR through the UST levels, stored zeros dropped).

    A named pattern's CSR comes straight from its coordinates, which is what converting its
    UST mask (`pattern_mask`) to CSR gives (tests hold the two equal) without walking a
    seq x seq dense mask level by level."""

    if isinstance(pattern, (str, AttentionPattern)):
        p = pattern if isinstance(pattern, AttentionPattern) else resolve(pattern, seq,
                                                                          **pattern_params)
        i, crd = mask_coords(p)
        pos = np.concatenate(([0], np.cumsum(np.bincount(i, minlength=p.seq))))
        shape = (p.seq, p.seq)
    else:
        if pattern_params:
            raise PatternError(f"pattern parameters {sorted(pattern_params)} apply only to named "
                               "patterns, not to a given mask")
        mask = as_tensor(np.asarray(pattern, dtype=np.float32)
                         if isinstance(pattern, np.ndarray) else pattern)
        if mask.num_dimensions != 2:
            raise PatternError(f"an attention mask must be a matrix, got shape {mask.shape}")
        pos, crd, val = csr_arrays(mask)
        keep = np.asarray(val) != 0  # explicitly stored zeros are not attended
        if not keep.all():
            rows = np.repeat(np.arange(len(pos) - 1), np.diff(pos))[keep]
            crd = np.asarray(crd)[keep]
            pos = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=len(pos) - 1))))
        shape = tuple(mask.shape)
    pos, crd = np.asarray(pos, dtype=np.int64), np.asarray(crd, dtype=np.int64)
    csr = Tensor(NamedFormats.CSR, shape, [None, pos], [None, crd],
                 np.ones(len(crd), dtype=np.float32))
    return pos, crd, csr


def make_inputs(pattern: str, seq: int, dim: int, seed: int = 0, **pattern_params):
    """The `attention` workload's operands: seeded standard-normal q, k, v (seq x dim, fp32),
    the resolved pattern (its random parts seeded by `seed`) and its CSR (pos, crd).
    Parameters given as None take the pattern's defaults."""
    for name, val in (("seq", seq), ("dim", dim)):
        if not isinstance(val, (int, np.integer)) or val < 1:
            raise UserError(f"--{name} must be a positive integer, got {val}")
    # q, k, v and the output, twice over (the program's copies, the float64 reference); the
    # attended pairs (scores, probabilities, coordinates) are at most seq x seq, bounded
    # once the pattern is resolved
    check_host_memory(f"attention operands (--seq {seq} --dim {dim})",
                      2 * dense_bytes(*[(seq, dim)] * 4))
    given = {k: v for k, v in pattern_params.items() if v is not None}
    if pattern in ("bigbird", "nm"):
        given.setdefault("seed", seed)
    p = resolve(pattern, seq, **given)
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((seq, dim), dtype=np.float32) for _ in range(3))
    pos, crd, _ = mask_csr(p, seq)
    return {"q": q, "k": k, "v": v, "pos": pos, "crd": crd, "pattern": p}


def compute_bound_cycles(nnz: int, dim: int, dim_v: int, arch) -> int:
    """Closed-form floor on the array cycles of masked attention: the nnz * (dim + dim_v) useful
    MACs (SDDMM plus SpMM) at the array's peak of rows * cols * simd_lanes MACs per cycle (a PE
    issues one op per cycle, a vector op covers at most simd_lanes lanes)."""
    peak = arch.pe_array.num_pes * arch.pe_array.simd_lanes
    return -(-nnz * (dim + dim_v) // peak)


#: Body nodes of each kernel of the CSR lowering (tests check these against `lower_attention`).
KERNEL_NODES = {"sddmm": 6, "softmax_max": 2, "softmax_exp": 8, "spmm": 7}


def kernel_iterations(nnz: int, dim: int, dim_v: int, lanes: int) -> dict[str, int]:
    """Iterations of each kernel of the CSR lowering in closed form: every kernel walks the
    stored entries, the SDDMM in ceil(dim / lanes) SIMD chunks per entry, the SpMM in
    ceil(dim_v / lanes)."""
    return {"sddmm": nnz * -(-dim // lanes), "softmax_max": nnz, "softmax_exp": nnz,
            "spmm": nnz * -(-dim_v // lanes)}


def issue_bound_cycles(nnz: int, dim: int, dim_v: int, arch) -> dict[str, int]:
    """Per-kernel floor on the CSR lowering's compute cycles: every body node issues once per
    iteration and a PE issues at most `issue_width` ops per cycle
    (docs/architecture.md#issue-width), so a kernel needs >= iterations * nodes / (PEs x
    issue_width) cycles."""
    pes = arch.pe_array.num_pes * arch.pe_array.issue_width
    its = kernel_iterations(nnz, dim, dim_v, arch.pe_array.simd_lanes)
    return {k: -(-its[k] * KERNEL_NODES[k] // pes) for k in its}


def phase_cycles(res) -> dict[str, int]:
    """Compute cycles of a simulated attention by phase: sddmm, softmax (2 kernels), spmm."""
    out = {"sddmm": 0, "softmax": 0, "spmm": 0}
    for kr in res.kernels:  # "softmax_max.level1": a kernel that replaces softmax_max
        phase = KERNEL_PHASE.get(kr.kernel.split(".")[0], kr.kernel)
        out[phase] = out.get(phase, 0) + kr.compute_cycles
    return out


def _as_matrix(name: str, x) -> np.ndarray:
    if hasattr(x, "detach"):  # torch
        x = x.detach().cpu().numpy()
    a = np.asarray(x, dtype=np.float32)
    if a.ndim != 2:
        raise UserError(f"sparse_attention: {name} must be a (seq, dim) matrix, "
                        f"got shape {a.shape}")
    return a


def sparse_attention(q, k, v, pattern="dense", backend: str = "numpy", arch=None, *,
                     engine: str = "fast", return_result: bool = False, cache=None,
                     lowering: str = "csr", reference=None, **pattern_params):
    """Masked attention softmax(mask(Q K^T / sqrt(d))) V with a structured sparsity pattern.

    `pattern` is a name from `PATTERNS` (its parameters, e.g. `window=8`, `dilation=2`,
    `block=16`, `nm="2:4"`, `seed=0`, go in `pattern_params`) or a mask (UST Tensor, scipy or
    numpy; nonzeros are attended). `backend="numpy"` is the reference; `"sim"` lowers to
    SDDMM -> masked softmax -> SpMM kernels, maps them on `arch` (default preset) and runs the
    cycle-level `engine`. Returns the (seq_q, dim_v) float32 output, or `(output, SimResult)`
    when `return_result` (sim only; the result's `kernels` give per-kernel cycles). Plans
    (lower + map) are cached like the other frontend ops' (`cache`: a PlanCache, None for the
    default memory + disk cache, False to always plan afresh). `lowering` (sim): "csr" for
    any mask, "dia" for banded masks (window, dilated: affine, no gathers), "block" for masks of
    whole aligned blocks (bigbird: gathered GEMMs, docs/conventions.md#block-attention) or
    covered by the blocks they touch, the fillers masked (window; #filler-blocks), "auto" to
    pick among them, "default" for block where the mask is whole blocks or its covering's
    useful fraction reaches the measured threshold (`op.FILL_THRESHOLD`), else csr. Over
    rows of one width (butterfly, N:M) csr takes a row-body softmax
    (docs/conventions.md#row-softmax).
    `reference` (sim): `attention_reference(q, k, v, pos, crd)` when the caller has computed it
    already (a model layer keeps it), so the check does not compute it again.
    """
    warn_if_grad("sparse_attention", q, k, v)
    if backend not in BACKENDS:
        raise UserError(f"sparse_attention: backend must be one of {BACKENDS}, got {backend!r}")
    q, k, v = _as_matrix("q", q), _as_matrix("k", k), _as_matrix("v", v)
    if q.shape[1] != k.shape[1] or k.shape[0] != v.shape[0]:
        raise UserError(f"sparse_attention: shapes do not agree: q {q.shape}, k {k.shape}, "
                         f"v {v.shape} (need q.dim == k.dim and k.seq == v.seq)")
    if isinstance(pattern, (str, AttentionPattern)) and q.shape[0] != k.shape[0]:
        raise UserError(f"named patterns are square: q has {q.shape[0]} rows, k {k.shape[0]}")
    pos, crd, mask = mask_csr(pattern, q.shape[0], **pattern_params)
    if mask.shape != (q.shape[0], k.shape[0]):
        raise UserError(f"sparse_attention: mask shape {mask.shape} != (q rows, k rows) "
                         f"{(q.shape[0], k.shape[0])}")
    if backend == "numpy":
        if return_result:
            raise UserError("return_result needs backend='sim'")
        return attention_reference(q, k, v, pos, crd)
    if backend != "sim":
        if return_result:
            raise UserError("return_result needs backend='sim'")
        return get_executor("attention", backend)(q, k, v, pos, crd, pattern, pattern_params)
    res = _simulate(q, k, v, pos, crd, arch, engine, workload="attention", cache=cache,
                    lowering=lowering, reference=reference)
    return (res.output, res) if return_result else res.output


def _simulate(q, k, v, pos, crd, arch, engine, workload, trace=False, t0=None, cache=None,
              lowering="csr", reference=None):
    """Plan (through the plan cache unless `cache` is False), run the engine, check values."""
    t0 = time.perf_counter() if t0 is None else t0
    op = SparseAttention(q, k, v, pos, crd, lowering=lowering)
    plan = op.plan(arch=arch, cache=cache)
    mapping = plan.bind(op._lower())
    res = simulate_mapping(mapping, engine=engine, trace=trace, workload=workload)
    if reference is None:
        reference = attention_reference(q, k, v, pos, crd)
    res = finish(res, reference, t0, mapping)
    ph = phase_cycles(res)
    bound = compute_bound_cycles(len(crd), q.shape[1], v.shape[1], plan.arch)
    extra = (f"attention nnz {len(crd):,} of {q.shape[0] * k.shape[0]:,} "
             f"({100 * len(crd) / (q.shape[0] * k.shape[0]):.1f}%); compute cycles by phase: "
             + ", ".join(f"{k_} {v_:,}" for k_, v_ in ph.items())
             + f"; MAC bound {bound:,} cycles; {op.lowering} lowering; plan {op.plan_source}",)
    return dataclasses.replace(res, notes=tuple(res.notes) + extra)


# --- the `attention` workload -----------------------------------------------------------------

def _run(spec, *, engine: str = "fast", seed: int = 0, trace: bool = False, pattern: str = "window",
         seq: int = 128, dim: int = 32, lowering: str = "default", **pattern_params):
    t0 = time.perf_counter()
    x = make_inputs(pattern, seq, dim, seed, **pattern_params)
    workload = f"attention/{x['pattern']}"
    split = split_attention(x["q"], x["k"], x["v"], x["pos"], x["crd"], spec, engine=engine,
                            workload=workload, trace=trace, lowering=lowering, t0=t0)
    if split is not None:  # K and V do not fit the SPM (or the host): query-row blocks
        return split
    return _simulate(x["q"], x["k"], x["v"], x["pos"], x["crd"], spec, engine,
                     workload=workload, trace=trace, t0=t0, cache=None,
                     lowering=lowering)


_PATTERN_PARAMS = (
    Param("pattern", str, "window", "attention sparsity pattern", choices=PATTERNS),
    Param("seq", int, 128, "sequence length (queries = keys)"),
    Param("dim", int, 32, "head dimension d of q, k and v"),
    Param("window", int, None,
          f"window half-width in keys (window, dilated; default {DEFAULTS['window']})"),
    Param("dilation", int, None,
          f"stride between attended keys (dilated; default {DEFAULTS['dilation']})"),
    Param("block", int, None, f"block edge in tokens (bigbird; default {DEFAULTS['block']})"),
    Param("global_blocks", int, None,
          f"global blocks (bigbird; default {DEFAULTS['global_blocks']})"),
    Param("window_blocks", int, None,
          f"block-band half-width (bigbird; default {DEFAULTS['window_blocks']})"),
    Param("random_blocks", int, None,
          f"random blocks per block row (bigbird; default {DEFAULTS['random_blocks']})"),
    Param("nm", str, None, f"N:M kept keys (nm; default {DEFAULTS['nm']})"),
    Param("lowering", str, "default", "attention lowering: csr (any pattern), dia (window, "
          "dilated: affine, no gathers), block (bigbird: gathered GEMMs over the kept "
          "blocks; window: over the blocks it touches, fillers masked), auto, default (block "
          "where the mask is whole blocks, not all of them, or enough of its touched blocks "
          "is attended, else csr)", choices=("csr", "dia", "block", "auto", "default")),
)
register(Workload("attention", _run, _PATTERN_PARAMS,
                  "masked attention, pattern as a UST mask: SDDMM -> softmax -> SpMM"))
