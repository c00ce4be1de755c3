"""32 x 1 dynamic sparsity as a gathered-panel GEMM (dataflow/dynamic/panel_gemm.py,
docs/conventions.md#dynamic-panel-gemm): values equal numpy, cycles never below the roofline,
the body is the GEMM's outer product over the kept strips, faster than the SRead lowering it
replaced, and a split run builds the index once per block of A."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dataflow import api
from dataflow.arch import resolve_arch
from dataflow.dfg.ops import Op
from dataflow.dynamic import build_index, make_dynamic_operands, simulate_dynamic_matmul
from dataflow.dynamic.panel_gemm import BODY_ROWS, compaction_rows, lower_panel_gemm, pack_strips
from dataflow.testing import assert_close
from tests.archs import variant
from tests.conftest import ARCH_DIR

#: 16 lines x 1024 words: a 1024-column B no longer fits, the run splits into N blocks
SMALL = variant(**{"spm.capacity_words_per_line": 1024})


def _reference(a, b):
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


def _floors_hold(res) -> None:
    assert res.roofline is not None and res.cycles >= res.roofline_cycles > 0
    for kr in res.kernels:
        assert kr.roofline is None or kr.span_cycles >= kr.roofline.cycles - 1e-9


def test_pack_strips_puts_each_strip_in_consecutive_words():
    a = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
    packed = pack_strips(a, 32).reshape(2, 3, 32)
    assert np.array_equal(packed[1, 2], a[32:64, 2])


@pytest.mark.parametrize("m, k, n, sparsity, seed", [
    (64, 96, 16, 0.9, 0), (96, 64, 40, 0.5, 1), (32, 32, 8, 0.0, 2)])
def test_values_equal_numpy_and_floors_hold(default_arch, m, k, n, sparsity, seed):
    a, b = make_dynamic_operands(m, k, n, sparsity, "32x1", seed)
    res, st = simulate_dynamic_matmul(a, b, "32x1", default_arch)
    assert res.values_match_reference
    assert_close(res.output, _reference(a, b), dtype=np.float32)
    assert st.computed_macs == st.useful_macs  # kept strips only, every element nonzero
    _floors_hold(res)


def test_all_zero_a_writes_zeros(default_arch):
    a, b = np.zeros((64, 32), np.float32), np.ones((32, 8), np.float32)
    res, _ = simulate_dynamic_matmul(a, b, "32x1", default_arch)
    assert res.values_match_reference and not np.any(res.output)


def test_body_is_the_outer_product_over_kept_strips(default_arch):
    """One A_c row load (a strip's 8 rows), one gather of B's row, 8 products of a lane by B's
    vector; iterations = kept strips x row blocks x vectors of C (over the vector blocks the
    compiler chose)."""
    a, b = make_dynamic_operands(64, 128, 32, 0.9, "32x1", seed=3)
    index = build_index(a, (32, 1))
    prog = lower_panel_gemm(a, b, index)
    (kern,) = [k for k in prog.kernels if k.name == "panel_gemm"]
    ops = [n.op for n in kern.nodes]
    assert ops.count(Op.GATHER) == 1 and ops.count(Op.MUL) == BODY_ROWS
    (row,) = [n for n in kern.nodes if n.buffer == "A_c"]
    assert row.addr.span == BODY_ROWS
    assert sorted(n.lane for n in kern.nodes if n.op is Op.MUL) == list(range(BODY_ROWS))
    res, _ = simulate_dynamic_matmul(a, b, "32x1", default_arch)
    (kr,) = [kr for kr in res.kernels if kr.kernel == "panel_gemm"]
    iters = sum(t.iterations for t in kr.tiles)
    closed = index.nnz_tiles * (32 // BODY_ROWS) * (32 // default_arch.pe_array.simd_lanes)
    assert closed % iters == 0 and closed // iters in (1, 2, 4)


def test_compaction_is_paneled_to_fit_half_the_spm(default_arch):
    """The kept strips are gathered from copies of A's rows that fit half the SPM, one
    compaction kernel per group; values unchanged."""
    a, b = make_dynamic_operands(128, 64, 8, 0.8, "32x1", seed=4)
    assert compaction_rows(128, 64, 32, 2 * 32 * 64) == 32
    prog = lower_panel_gemm(a, b, build_index(a, (32, 1)), capacity_words=2 * 32 * 64)
    assert sum(k.name.startswith("panel_compact") for k in prog.kernels) == 4


@pytest.mark.parametrize("arch", ["default", "mlx_4x4"])
def test_faster_than_the_sread_lowering(arch):
    """The panel GEMM beats the SRead lowering (tile_rows_kernel) it replaced: same values,
    fewer cycles, a larger fraction of the roofline (measured at these sizes: default 17,272
    -> 12,362 cycles, 0.41 -> 0.57; mlx_4x4 73,196 -> 20,310, 0.09 -> 0.34)."""
    spec = resolve_arch(str(ARCH_DIR / f"{arch}.yaml"))
    a, b = make_dynamic_operands(128, 128, 256, 0.9, "32x1", seed=5)
    new, _ = simulate_dynamic_matmul(a, b, "32x1", spec)
    old, _ = simulate_dynamic_matmul(a, b, "32x1", spec, lowering="sread")
    assert new.values_match_reference and old.values_match_reference
    assert_close(new.output, old.output)
    assert new.cycles < old.cycles
    assert new.fraction_of_roofline > old.fraction_of_roofline
    _floors_hold(new)


def test_n_blocks_are_kernels_of_one_program():
    """B too large for half the SPM: one GEMM kernel per N block in one program (each block
    of B its own input, prefetched while the previous kernel computes), one scan of A, C
    given back row-major; values equal numpy."""
    m, k, n = 64, 128, 160
    r = api.simulate("dynamic-spmm", SMALL, m=m, k=k, n=n, sparsity=0.9, granularity="32x1")
    a, b = make_dynamic_operands(m, k, n, 0.9, "32x1", 0)
    assert r.values_match_reference
    assert_close(r.output, _reference(a, b), dtype=np.float32)
    names = [kr.kernel for kr in r.kernels]
    assert not any(nt.startswith("split") for nt in r.notes)
    assert names.count("index_scan") == 1
    # B's 128 x 48 block in half of the 16 K words: 160 columns in 48, 48, 48, 16
    assert sum(nm.startswith("panel_gemm_") for nm in names) == 4
    _floors_hold(r)


def test_split_builds_the_index_once_per_block_of_a():
    """K too long for a panel beside B's block: the run splits (dataflow.dynamic.split); N
    blocks after the first read the index and the compacted strips the first left in DRAM, so
    A is scanned once per K panel, not once per block; values equal numpy."""
    m, k, n = 64, 512, 96
    r = api.simulate("dynamic-spmm", SMALL, m=m, k=k, n=n, sparsity=0.9, granularity="32x1")
    a, b = make_dynamic_operands(m, k, n, 0.9, "32x1", 0)
    assert r.values_match_reference
    assert_close(r.output, _reference(a, b), dtype=np.float32)
    split = next(nt for nt in r.notes if nt.startswith("split"))
    panels = int(re.search(r"(\d+) K panel", split).group(1))
    blocks = int(re.search(r"(\d+) N block", split).group(1))
    assert panels > 1 and blocks > 1
    names = [kr.kernel for kr in r.kernels]
    assert names.count("index_scan") == panels  # not panels x blocks
    assert names.count("panel_gemm") == panels * blocks
    _floors_hold(r)


def test_reference_stepper_equals_the_fast_engine(default_arch):
    """The panel program's kernels (span loads, lane products, gathers of B's rows) run the
    same on the cycle-level reference stepper as on the fast engine: cycles and values."""
    a, b = make_dynamic_operands(64, 64, 16, 0.8, "32x1", seed=1)
    fast, _ = simulate_dynamic_matmul(a, b, "32x1", default_arch)
    ref, _ = simulate_dynamic_matmul(a, b, "32x1", default_arch, engine="reference")
    assert ref.values_match_reference and fast.values_match_reference
    assert ref.cycles == fast.cycles
    assert [(k.kernel, k.span_cycles) for k in ref.kernels] == \
        [(k.kernel, k.span_cycles) for k in fast.kernels]
    assert np.array_equal(ref.output, fast.output)


@pytest.mark.parametrize("lane_sum", [False, True])
def test_scan_norms_equal_the_hosts(default_arch, lane_sum):
    """The scan over the tile-major A gives each strip's sum of squares (in PARTS lane
    partials, or one word with the lane-sum unit), nonzero exactly on the host index's kept
    strips; the compaction's crd and A_c are the host's."""
    from dataflow.pe_array.simulate import run_array
    from dataflow.plan.compile import compile_program

    a, b = make_dynamic_operands(64, 64, 16, 0.7, "32x1", seed=6)
    index = build_index(a, (32, 1))
    prog = lower_panel_gemm(a, b, index, lane_sum=lane_sum)
    arrays = run_array(compile_program(prog, default_arch))
    out = {name: v for arr in arrays for name, v in arr.outputs}
    strips = pack_strips(a, 32).reshape(-1, 32).astype(np.float64)
    norm = out["norm"].reshape(strips.shape[0], -1).sum(axis=1)
    assert out["norm"].size == strips.shape[0] * (1 if lane_sum else 8)
    assert_close(norm, (strips ** 2).sum(axis=1), dtype=np.float32)
    assert np.array_equal(norm > 0, index.tile_nonzero.ravel())
    assert np.array_equal(out["crd"][:index.nnz_tiles], index.crd)
    assert np.array_equal(out["A_c"].reshape(-1, 32), strips[index.tile_id].astype(np.float32))


@pytest.mark.parametrize("granularity", ["32x1", "1x64", "dense"])
def test_plans_come_from_the_plan_cache_keyed_on_the_zero_mask(default_arch, tmp_path,
                                                               granularity):
    """Issue 14: a second run on A's zero mask reuses the plan (same cycles and values as
    planning afresh); new values on the same mask reuse it too; another mask is planned anew
    (a key blind to the mask would bind it to a stale plan)."""
    from dataflow.ust_frontend.cache import PlanCache

    cache = PlanCache(tmp_path)
    mg = "element" if granularity == "dense" else granularity
    a, b = make_dynamic_operands(64, 128, 32, 0.8, mg, seed=3)
    fresh, _ = simulate_dynamic_matmul(a, b, granularity, default_arch, cache=False)
    first, _ = simulate_dynamic_matmul(a, b, granularity, default_arch, cache=cache)
    again, _ = simulate_dynamic_matmul(a, b, granularity, default_arch, cache=cache)
    assert (first.notes[-1], again.notes[-1]) == ("plan built", "plan memory")
    assert fresh.cycles == first.cycles == again.cycles
    assert np.array_equal(fresh.output, again.output) and again.values_match_reference
    # the same mask, other values: the same plan, this run's values
    other, _ = simulate_dynamic_matmul(2 * a, b + 1, granularity, default_arch, cache=cache)
    assert other.notes[-1] == "plan memory" and other.values_match_reference
    assert_close(other.output, _reference(2 * a, b + 1))
    # another mask: built anew, and from disk in a new process's cache
    a2, _ = make_dynamic_operands(64, 128, 32, 0.8, mg, seed=4)
    assert not np.array_equal(a2 != 0, a != 0)
    new, _ = simulate_dynamic_matmul(a2, b, granularity, default_arch, cache=cache)
    assert new.notes[-1] == "plan built" and new.values_match_reference
    disk, _ = simulate_dynamic_matmul(a2, b, granularity, default_arch, cache=PlanCache(tmp_path))
    assert disk.notes[-1] == "plan disk" and disk.cycles == new.cycles


def test_the_dynamic_spmm_workload_plans_through_the_plan_cache(default_arch, tmp_path,
                                                                monkeypatch):
    monkeypatch.setenv("DATAFLOW_CACHE_DIR", str(tmp_path))
    from dataflow.ust_frontend.cache import default_cache

    default_cache().clear_memory()
    first = api.simulate("dynamic-spmm", arch=default_arch, m=64, k=128, n=32)
    again = api.simulate("dynamic-spmm", arch=default_arch, m=64, k=128, n=32)
    assert "plan built" in first.notes and "plan memory" in again.notes
    assert first.cycles == again.cycles and again.values_match_reference
