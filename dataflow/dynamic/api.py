"""Dynamic sparse matmul and the ReLU FFN: operands, simulation, and their workloads.

`dataflow simulate --workload dynamic-spmm --sparsity S --granularity {32x1,1x64,32x64,dense}`
runs C = A @ B where A's zeros (a fraction S, laid out element-wise or in micro-tiles of
`--mask-granularity`) are found at run time (docs/references.md#pit); `relu-ffn` runs
Y = ReLU(X @ W1 + b) @ W2 with the second linear layer consuming the dynamically sparse
activations. Every result carries in its `notes` the MACs computed, the MACs wasted on zeros
(both from the engine's operation counts on the real data) and the index build's cycles.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from dataflow.arch import resolve_arch
from dataflow.dynamic.lower import lower_dense_reference, lower_dynamic_spmm
from dataflow.dynamic.microtile import (
    GRANULARITIES,
    MASK_GRANULARITIES,
    build_index,
    check_shape,
    check_sparsity,
    parse_granularity,
    random_mask,
    tile_nonzero_mask,
)
from dataflow.dynamic.panel_gemm import (
    c_from_blocks,
    lower_panel_gemm,
    plan_n_block,
    supported,
)
from dataflow.dynamic.planned import planned_mapping, shape_signature, structure_signature
from dataflow.dynamic.split import (
    check_traceable,
    fits_whole,
    needs_streaming,
    simulable,
    split_dynamic,
    split_dynamic_streamed,
    visited,
)
from dataflow.dynamic.stats import CHOICES, DynamicStats
from dataflow.errors import UserError
from dataflow.pe_array.roofline import floors
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan.gemm_schedule import supports
from dataflow.plan.split import moved_words
from dataflow.workloads import check_host_memory, dense_bytes, finish

#: how 32 x 1 tiles are lowered (`simulate_dynamic_matmul`)
LOWERINGS = ("panel", "sread")


def make_dynamic_operands(m: int, k: int, n: int, sparsity: float, mask_granularity: str,
                          seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A (m x k, fp32, a fraction `sparsity` of zeros laid out per `mask_granularity`) and
    dense B (k x n); seeded."""
    if mask_granularity not in MASK_GRANULARITIES:
        raise UserError(f"--mask-granularity must be one of {MASK_GRANULARITIES}, "
                         f"got {mask_granularity!r}")
    if n <= 0:
        raise UserError(f"--n must be a positive integer, got {n}")
    # A, its mask, B and the dense C, twice over (the reference's copies)
    check_host_memory(f"dynamic-spmm operands (--m {m} --k {k} --n {n})",
                      2 * dense_bytes((m, k), (m, k), (k, n), (m, n)))
    rng = np.random.default_rng(seed)
    keep = random_mask(m, k, check_sparsity(sparsity), mask_granularity, rng)
    a = rng.standard_normal((m, k), dtype=np.float32) * keep
    return a.astype(np.float32), rng.standard_normal((k, n), dtype=np.float32)


def _stats(res, granularity: str, a: np.ndarray, n: int, tile_density: float,
           skip_macs: int) -> DynamicStats:
    index = sum(kr.end_cycle - kr.start_cycle for kr in res.kernels
                if kr.kernel.startswith("index_"))
    return DynamicStats(granularity=granularity, sparsity=1.0 - np.count_nonzero(a) / a.size,
                        tile_density=tile_density, computed_macs=res.macs - skip_macs,
                        useful_macs=int(np.count_nonzero(a)) * n, index_cycles=index,
                        compute_cycles=res.cycles - index, cycles=res.cycles)


def simulate_dynamic_matmul(a: np.ndarray, b: np.ndarray, granularity: str, arch=None, *,
                            engine: str = "fast", panel_rows: int | None = None,
                            trace: bool = False, scheme: str = "pit", fetch: str = "gather",
                            lowering: str = "panel", cache=None):
    """Simulate C = A @ B with A's pattern found at run time; returns (SimResult, DynamicStats).

    `granularity`: "32x1", "1x64" (PIT micro-tiles), "32x64" (block-sparse tiles) or "dense"
    (GEMM over the zero-filled A, the baseline). The SimResult's values are checked against
    numpy (A @ B in float64). `scheme` picks the 1 x 64 lowering: "pit" (scatter-add per
    k-block, PIT's) or "packed"; `fetch` how gathered operands leave DRAM, "gather" (only the
    rows the index selects) or "whole" (`dataflow.dynamic.lower.compute_kernels`). `lowering`
    for 32 x 1 tiles: "panel" (a gathered-panel GEMM, `dataflow.dynamic.panel_gemm`; not with
    `panel_rows` or fetch="whole") or "sread" (`dataflow.dynamic.lower.tile_rows_kernel`, the
    lowering before it). `cache`: where the plan comes from (`dataflow.dynamic.planned`): a
    `PlanCache`, None for the process default, False to plan afresh."""

    if granularity not in CHOICES:
        raise UserError(f"--granularity must be one of {CHOICES}, got {granularity!r}")
    if lowering not in LOWERINGS:
        raise UserError(f"lowering must be one of {LOWERINGS}, got {lowering!r}")
    t0 = time.perf_counter()
    spec = resolve_arch(arch)
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    # the panel GEMM's gathers always fetch only the selected rows; panel_rows and
    # fetch="whole" ask for the SRead lowering's panels and DMA model
    panel = lowering == "panel" and panel_rows is None and fetch == "gather" \
        and granularity in GRANULARITIES and supported(GRANULARITIES[granularity])
    if panel and a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[0] and 0 not in b.shape:
        check_shape(a.shape[0], a.shape[1], GRANULARITIES[granularity], granularity)
        (m, k), n = a.shape, b.shape[1]
        kept = int(tile_nonzero_mask(a, GRANULARITIES[granularity]).sum(axis=1).max())
        n_block = plan_n_block(k, n, GRANULARITIES[granularity][0], spec.spm.capacity_words,
                               spec.pe_array.simd_lanes, kept)
        if n_block != 0 and simulable(spec, m, k, n, visited(a, granularity)):
            return _simulate_panel(a, b, granularity, spec, n_block, engine, trace, t0, cache)
    if panel_rows is None and _too_large(a, b, granularity, spec):
        # docs/conventions.md#tiling-any-problem-size: run in blocks that fit the SPM
        check_traceable(trace, f"dynamic-spmm {a.shape[0]} x {a.shape[1]} x {b.shape[1]}")
        res, stats = split_dynamic(a, b, granularity, spec, engine=engine, scheme=scheme,
                                   fetch=fetch, t0=t0, lowering=lowering)
        return dataclasses.replace(res, notes=res.notes + stats.notes()), stats
    if granularity == "dense":
        prog, density, skip = lower_dense_reference(a, b), 1.0, 0
    else:
        prog, index = lower_dynamic_spmm(a, b, granularity, panel_rows=panel_rows,
                                         capacity_words=spec.spm.capacity_words, scheme=scheme,
                                         fetch=fetch)
        density, skip = index.tile_density, a.size  # the scan squares every element once
    mapping, source = planned_mapping(
        prog, spec, (structure_signature("A", a), shape_signature("B", b)),
        f"{granularity} panel_rows={panel_rows} scheme={scheme} fetch={fetch}", cache=cache)
    res = simulate_mapping(mapping, engine=engine, trace=trace,
                           workload=f"dynamic-spmm/{granularity}")
    res = finish(res, (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32), t0, mapping)
    stats = _stats(res, granularity, a, b.shape[1], density, skip)
    return dataclasses.replace(res, notes=res.notes + stats.notes() + (f"plan {source}",)), stats


def _simulate_panel(a, b, granularity: str, spec, n_block: int | None, engine: str, trace: bool,
                    t0: float, cache=None):
    """A 32 x 1 run as one gathered-panel GEMM program (`dataflow.dynamic.panel_gemm`), its N
    blocks (when B does not fit whole) kernels of that program."""
    (m, _), n = a.shape, b.shape[1]
    index = build_index(a, GRANULARITIES[granularity])
    lane_sum = supports(spec, "vsum")
    prog = lower_panel_gemm(a, b, index, capacity_words=spec.spm.capacity_words,
                            n_block=n_block, lane_sum=lane_sum)
    mapping, source = planned_mapping(
        prog, spec, (structure_signature("A", a), shape_signature("B", b)),
        f"{granularity} panel n_block={n_block} lane_sum={lane_sum}", cache=cache)
    res = simulate_mapping(mapping, engine=engine, trace=trace,
                           workload=f"dynamic-spmm/{granularity}")
    # the floors of the problem: A read once, the rows of B the kept strips need (what the
    # gathers moved, each block once) and C written once (docs/conventions.md#dynamic-panel-gemm)
    b_moved = sum(moved_words(res, name, spec.word_bytes) for name, _ in prog.inputs
                  if name == "B" or name.startswith("B_"))
    res = dataclasses.replace(res, output=c_from_blocks(res.output, m, n, n_block),
                              roofline=floors(spec, prog.macs, a.size + min(b.size, b_moved),
                                              m * n))
    res = finish(res, (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32), t0, mapping)
    # the scan squares every element once: MACs that are not the matmul's
    stats = _stats(res, granularity, a, n, index.tile_density, a.size)
    return dataclasses.replace(res, notes=res.notes + stats.notes() + (f"plan {source}",)), stats


def _too_large(a: np.ndarray, b: np.ndarray, granularity: str, spec) -> bool:
    """Whether A @ B (shapes valid for the granularity) does not fit the SPM whole."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0] or 0 in b.shape:
        return False  # the lowering says what is wrong
    if granularity != "dense":
        check_shape(a.shape[0], a.shape[1], parse_granularity(granularity), granularity)
    (m, k), n = a.shape, b.shape[1]
    return not fits_whole(spec, granularity, m, k, n) \
        or not simulable(spec, m, k, n, visited(a, granularity))


def _streamed(spec, *, engine, seed, trace, m, k, n, sparsity, granularity, mask_granularity):
    """The result of a dynamic-spmm whose operands exceed the host's memory, generated and
    run tile by tile (docs/conventions.md#tiling-any-problem-size), or None when they fit."""
    if mask_granularity not in MASK_GRANULARITIES or min(m, k, n) <= 0 \
            or not needs_streaming(m, k, n):
        return None  # make_dynamic_operands checks the parameters and allocates
    check_sparsity(sparsity)
    for g in {granularity, mask_granularity} - {"dense", "element"}:
        check_shape(m, k, parse_granularity(g), g)
    check_traceable(trace, f"dynamic-spmm (--m {m} --k {k} --n {n})")
    res, stats = split_dynamic_streamed(
        spec, m=m, k=k, n=n, sparsity=sparsity, mask_granularity=mask_granularity,
        granularity=granularity, seed=seed, engine=engine, t0=time.perf_counter())
    return dataclasses.replace(res, notes=res.notes + stats.notes())


def run_dynamic_spmm(spec, *, engine="fast", seed=0, trace=False, m=256, k=256, n=64,
                      sparsity=0.9, granularity="32x1", mask_granularity=None):
    if granularity not in CHOICES:
        raise UserError(f"--granularity must be one of {CHOICES}, got {granularity!r}")
    mg = mask_granularity or (granularity if granularity != "dense" else "element")
    res = _streamed(spec, engine=engine, seed=seed, trace=trace, m=m, k=k, n=n,
                    sparsity=sparsity, granularity=granularity, mask_granularity=mg)
    if res is not None:
        return res
    a, b = make_dynamic_operands(m, k, n, sparsity, mg, seed)
    res, _ = simulate_dynamic_matmul(a, b, granularity, spec, engine=engine, trace=trace)
    return res


__all__ = ["DynamicStats", "make_dynamic_operands", "parse_granularity", "simulate_dynamic_matmul"]
