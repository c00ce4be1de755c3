"""The reference stepper and the fast engine give identical results (values bit for bit)."""

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.dfg.lower import lower_gemm, lower_spmm_csr
from dataflow.mapper import map_program
from dataflow.pe_array import fast_policy
from dataflow.pe_array.simulate import run_array, simulate_mapping
from dataflow.testing import assert_close
from tests.archs import small_systolic, variant

ARCHS = {
    "default": {},
    "2x2-1port": {"pe_array.rows": 2, "pe_array.cols": 2, "spm.read_ports_per_line": 1},
    "4x4-2lines": {"pe_array.rows": 4, "pe_array.cols": 4, "spm.lines": 2},
    "blocked": {"spm.address_mapping": "blocked", "spm.capacity_words_per_line": 1024},
    "lanes4-torus": {"pe_array.simd_lanes": 4, "interconnect.topology": "torus"},
    "slow-hops": {"interconnect.hop_latency_cycles": 2, "pe_array.rows": 3, "pe_array.cols": 5},
    "tiny-spm": {"spm.lines": 4, "spm.capacity_words_per_line": 256},
}


def _spmm(m, k, n, density, seed):
    rng = np.random.default_rng(seed)
    a = sp.random(m, k, density=density, format="csr", dtype=np.float32, random_state=rng)
    a.sort_indices()
    b = rng.standard_normal((k, n), dtype=np.float32)
    return lower_spmm_csr(a.shape, a.indptr, a.indices, a.data, b), a.toarray() @ b


def _gemm(m, k, n, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    return lower_gemm(a, b), a.astype(np.float64) @ b


CASES = [
    ("gemm", (5, 3, 7)), ("gemm", (8, 8, 16)), ("gemm", (1, 1, 1)), ("gemm", (9, 4, 13)),
    ("spmm", (12, 10, 9, 0.3)), ("spmm", (20, 16, 8, 0.1)), ("spmm", (7, 30, 17, 0.5)),
    ("spmm", (16, 16, 3, 0.0)),  # an empty matrix
]


@pytest.mark.parametrize("arch_name", list(ARCHS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}{c[1]}")
def test_reference_and_fast_agree(arch_name, case):
    arch = variant(**ARCHS[arch_name])
    kind, dims = case
    prog, expected = _gemm(*dims, seed=1) if kind == "gemm" else _spmm(*dims, seed=2)
    mapping = map_program(prog, arch)
    (ref,) = run_array(mapping, "reference")
    (fast,) = run_array(mapping, "fast")
    assert ref.same_as(fast) == []
    out = dict(fast.outputs)["C"].reshape(expected.shape)
    assert_close(out, expected)
    # and the whole SimResult (system level included) is identical
    r1, r2 = simulate_mapping(mapping, "reference"), simulate_mapping(mapping, "fast")
    assert r1.to_dict() | {"engine": 0} == r2.to_dict() | {"engine": 0}


@pytest.mark.parametrize("df", ["os", "ws", "is"])
@pytest.mark.parametrize("dims", [(5, 7, 3), (9, 4, 11), (4, 4, 4), (1, 6, 2)])
def test_systolic_reference_and_fast_agree(df, dims):
    m, n, k = dims
    arch = small_systolic(4, 3)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    mapping = map_program(lower_gemm(a, b), arch, dataflow=df)
    (ref,) = run_array(mapping, "reference")
    (fast,) = run_array(mapping, "fast")
    assert ref.same_as(fast) == []
    assert_close(dict(fast.outputs)["C"].reshape(m, n), a.astype(np.float64) @ b)


def test_sparse_engine_sees_the_data():
    """Same shape and nnz, different structure -> different SPM conflicts: the timing comes from
    the real gather addresses. Two copies each run half the rows; the diagonal gathers B rows i
    and i + 16, which share a line (16 mod 8 lines = 0) and its single port; a single column
    gathers B row 0 in both copies, which the line broadcasts."""
    arch = variant(**{"spm.read_ports_per_line": 1, "spm.lines": 8})
    m = k = 32
    n = 8
    rng = np.random.default_rng(0)
    b = rng.standard_normal((k, n), dtype=np.float32)
    diag = sp.identity(m, dtype=np.float32, format="csr")
    col = sp.csr_matrix((np.ones(m, np.float32), (np.arange(m), np.zeros(m, int))), shape=(m, k))
    results = []
    for a in (diag, col):
        prog = lower_spmm_csr(a.shape, a.indptr, a.indices, a.data, b)
        mapping = map_program(prog, arch, copies=2, max_tile_rows=32)
        assert mapping.kernels[0].ii == 1
        results.append(simulate_mapping(mapping))
    assert results[0].macs == results[1].macs
    assert results[0].stall_cycles_spm_conflict >= 16
    assert results[1].stall_cycles_spm_conflict < results[0].stall_cycles_spm_conflict


@pytest.mark.parametrize("shape", ["mixed", "one-length", "long-runs", "few-long-runs",
                                   "many-runs"])
def test_segment_fold_equals_in_order_accumulation(shape):
    """`fast_fold.segment_fold` (accumulator runs folded per run length) gives the bits of
    folding each run left to right with `ufunc.at`, signed zeros, NaNs and maxima included, on
    each of its paths (numpy: gathered groups, one reshaped block, per-position loop,
    accumulate; the compiled loops)."""
    from dataflow.pe_array import fast_fold

    def compiled(ufunc, ident, src, ends, dtype):
        out = np.empty((len(ends), src.shape[1]), dtype=dtype)
        fast_fold._compiled_fold()(src, ends, np.dtype(dtype).type(ident), ufunc is np.maximum,
                                   out)
        return out

    rng = np.random.default_rng(len(shape))
    for _ in range(20):
        lanes = int(rng.integers(1, 9))
        if shape == "mixed":
            n = int(rng.integers(1, 300))
            flush = rng.random(n) < rng.random()
        else:
            length = {"one-length": int(rng.integers(1, 40)), "long-runs": 40,
                      "few-long-runs": 300, "many-runs": 20}[shape]
            runs = {"long-runs": 30, "many-runs": 64}.get(shape, int(rng.integers(1, 3)))
            lanes = 8 if shape == "many-runs" else lanes
            n = runs * length
            flush = (np.arange(n) % length) == length - 1
        flush[-1] = True
        src = (rng.standard_normal((n, lanes))
               * 10.0 ** rng.integers(-3, 6, (n, lanes))).astype(np.float32)
        src[rng.random((n, lanes)) < 0.05] = -0.0
        src[rng.random((n, lanes)) < 0.01] = np.nan
        src[rng.random((n, lanes)) < 0.01] = -np.inf
        ends = np.flatnonzero(flush)
        run = np.concatenate(([0], np.cumsum(flush[:-1])))
        for ufunc, ident in ((np.add, 0.0), (np.maximum, -np.inf)):
            want = np.full((len(ends), lanes), ident, np.float32)
            ufunc.at(want, run, src)
            for fold in (fast_fold._segment_fold_numpy, compiled, fast_fold.segment_fold):
                got = fold(ufunc, ident, src, ends, np.float32)
                assert np.array_equal(want.view(np.int32), got.view(np.int32)), fold


@pytest.mark.parametrize("stride", [1, 2, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_compiled_gather_equals_numpy(stride, dtype, monkeypatch):
    """`fast._gather` through the compiled loop (`_gather_loops`) gives the same values, dead
    lanes zero, as numpy's strided view, for full and partial lanes and any buffer dtype."""
    from dataflow.pe_array import fast

    rng = np.random.default_rng(2)
    buf = (rng.standard_normal(400) * 100).astype(dtype)
    a0 = rng.integers(0, 400 - 7 * stride, 300)
    active = rng.integers(1, 9, 300)
    for mask in (np.ones((300, 8), bool), np.arange(8)[None, :] < active[:, None]):
        at = fast._Lanes(a0, stride, 8, mask, full=bool(mask.all()))
        monkeypatch.setenv(fast_policy.FOLD_JIT_ENV, "always")
        on = fast._gather(buf, at)
        monkeypatch.setenv(fast_policy.FOLD_JIT_ENV, "0")
        off = fast._gather(buf, at)
        want = np.where(mask, buf[a0[:, None] + stride * np.arange(8)], 0)
        assert on.dtype == off.dtype == buf.dtype
        assert np.array_equal(on, want) and np.array_equal(off, want)
