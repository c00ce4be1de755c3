"""Every CUDA kernel against its numpy definition, on small shapes.

Without a GPU these run in the CUDA simulator (NUMBA_ENABLE_CUDASIM=1, set by
`dataflow.cuda.device.cuda_module` before numba.cuda is imported); on a GPU machine the same
tests run on the GPU. Shapes are chosen to cross tile edges (partial tiles, empty rows, rows
longer than one chunk) while keeping simulated thread counts small.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.cuda import ops
from dataflow.cuda import reference as ref
from dataflow.testing import assert_close


def assert_close_complex(actual, expected):
    """assert_close on the real and the imaginary parts (it compares real values only)."""
    a, e = np.asarray(actual), np.asarray(expected)
    assert np.iscomplexobj(a), f"expected a complex result, got {a.dtype}"
    assert_close(a.real, e.real)
    assert_close(a.imag, e.imag)


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(7)


def _csr(m, k, density, seed, empty_row=None):
    a = sp.random(m, k, density=density, format="csr", dtype=np.float32, random_state=seed)
    if empty_row is not None:
        a = a.tolil()
        a[empty_row, :] = 0
        a = a.tocsr()
    a.sort_indices()
    return a


# --- dense / sparse matmul -----------------------------------------------------------------

@pytest.mark.parametrize("tile, shape", [(8, (20, 24, 18)), (16, (16, 19, 16))])
def test_gemm_tiled(rng, tile, shape):
    """Tile 16 is the GPU kernel itself; tile 8 the same code with a smaller compile-time tile
    (partial tiles along m, k and n)."""
    from dataflow.ust_frontend.ops import as_tensor, matmul_reference

    m, k, n = shape
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = ops.gemm(a, b, tile=tile)
    assert_close(c, ref.gemm(a, b), dtype=np.float32)
    assert_close(c, matmul_reference(as_tensor(a), as_tensor(b)))


def test_spmm_csr_with_empty_row(rng):
    a = _csr(13, 10, 0.3, 1, empty_row=4)
    b = rng.standard_normal((10, 9), dtype=np.float32)
    c = ops.spmm(a.indptr, a.indices, a.data, a.shape, b)
    assert_close(c, ref.spmm(a.indptr, a.indices, a.data, a.shape, b), dtype=np.float32)
    assert_close(c, (a.toarray().astype(np.float64) @ b).astype(np.float32))
    assert np.all(c[4] == 0)


def test_sddmm_csr(rng):
    from dataflow.ust_frontend.ops import sddmm as frontend_sddmm

    a = rng.standard_normal((12, 5), dtype=np.float32)
    b = rng.standard_normal((5, 10), dtype=np.float32)
    mask = _csr(12, 10, 0.3, 2, empty_row=0)
    out = ops.sddmm(a, b, mask.indptr, mask.indices, mask.data)
    assert_close(out, ref.sddmm(a, b, mask.indptr, mask.indices, mask.data), dtype=np.float32)
    assert_close(out, frontend_sddmm(a, b, mask).val)  # the frontend's numpy definition


# --- butterfly and FFT ---------------------------------------------------------------------

def _factors(rng, n, stages, complex_=False):
    f = rng.standard_normal((stages, n // 2, 2, 2)) / np.sqrt(2)
    if complex_:
        f = f + 1j * rng.standard_normal(f.shape) / np.sqrt(2)
    return f.astype(np.complex64 if complex_ else np.float32)


@pytest.mark.parametrize("fused, tile", [(True, None), (False, None), (True, 4)])
def test_butterfly_real(rng, fused, tile):
    """fused (all 4 stages in shared memory), one launch per stage, and a 4-element tile that
    fuses strides 1 and 2 and runs strides 4 and 8 as single stages."""
    x = rng.standard_normal((3, 16), dtype=np.float32)
    f = _factors(rng, 16, 4)
    y = ops.butterfly(x, f, fused=fused, tile=tile)
    assert_close(y, ref.butterfly(x, f), dtype=np.float32)
    # the definition by matrices: B = F3 F2 F1 F0, each factor a sparse n x n matrix
    dense = np.eye(16)
    for s in range(4):
        fm = ref.butterfly(np.eye(16), f[s:s + 1], [1 << s]).T.astype(np.float64)
        dense = fm @ dense
    assert_close(y, (x.astype(np.float64) @ dense.T).astype(np.float32))


def test_butterfly_complex_any_stride_order(rng):
    x = rng.standard_normal((2, 16), dtype=np.float32)
    f = _factors(rng, 16, 5, complex_=True)
    strides = [8, 1, 4, 2, 1]  # any power-of-two strides, any order, repeats allowed
    y = ops.butterfly(x, f, strides, tile=4)
    assert y.dtype == np.complex64
    assert_close_complex(y, ref.butterfly(x, f, strides))


@pytest.mark.parametrize("shape, tile", [((3, 16), None), ((8,), None), ((2, 32), 8), ((2,), None)])
def test_fft_equals_numpy(rng, shape, tile):
    x = rng.standard_normal(shape).astype(np.float32)
    y = ops.fft(x, tile=tile)
    assert y.shape == x.shape and y.dtype == np.complex64
    assert_close_complex(y, np.fft.fft(x.astype(np.float64), axis=-1))


def test_butterfly_layers_and_fnet_match_the_butterfly_package(rng):
    """backend="cuda" of dataflow.butterfly against its numpy definitions: butterfly_matmul
    (factors as a list, leading batch axes), linear with bias, FABNet FFN, FNet 2-D FFT."""
    from dataflow import butterfly as bf

    fs1, fs2 = bf.reference.random_factors(16, 1), bf.reference.random_factors(16, 2)
    x = rng.standard_normal((2, 3, 16)).astype(np.float32)
    b1, b2 = (rng.standard_normal(16).astype(np.float32) for _ in range(2))
    assert_close(bf.butterfly_matmul(x, fs1, backend="cuda"), bf.butterfly_matmul(x, fs1))
    assert_close(bf.butterfly_linear(x, fs1, b1, backend="cuda"), bf.butterfly_linear(x, fs1, b1))
    assert_close(bf.butterfly_ffn(x, fs1, fs2, b1, b2, backend="cuda"),
                 bf.butterfly_ffn(x, fs1, fs2, b1, b2))
    tokens = rng.standard_normal((64, 8)).astype(np.float32)  # seq 64 > one transpose tile
    y = bf.fnet_attention(tokens, backend="cuda")
    assert y.dtype == np.float32
    assert_close(y, bf.fnet_attention(tokens))
    assert_close_complex(bf.fft(x, backend="cuda"), bf.fft(x))


# --- sparse attention ----------------------------------------------------------------------

def _pattern(m, s, keep):
    rows = [[j for j in range(s) if keep(i, j)] for i in range(m)]
    pos = np.cumsum([0] + [len(r) for r in rows])
    crd = np.array([j for r in rows for j in r], dtype=np.int64)
    return pos, crd


@pytest.mark.parametrize("fused", [True, False])
def test_attention_window_with_empty_row(rng, fused):
    from dataflow.attention import attention_reference

    m, d, dv = 8, 6, 5
    q = rng.standard_normal((m, d), dtype=np.float32)
    k = rng.standard_normal((m, d), dtype=np.float32)
    v = rng.standard_normal((m, dv), dtype=np.float32)
    pos, crd = _pattern(m, m, lambda i, j: abs(i - j) <= 2 and i != 3)  # row 3 attends nothing
    out = ops.sparse_attention(q, k, v, pos, crd, fused=fused)
    assert_close(out, ref.sparse_attention(q, k, v, pos, crd), dtype=np.float32)
    assert_close(out, attention_reference(q, k, v, pos, crd))
    assert np.all(out[3] == 0)


def test_attention_fused_rows_longer_than_a_chunk(rng):
    """150 keys per row: three chunks of the online softmax, large logits (no overflow)."""
    from dataflow.cuda.kernels.attention import ATT_CHUNK

    s = 2 * ATT_CHUNK + 22
    q = 4 * rng.standard_normal((2, 4), dtype=np.float32)
    k = 4 * rng.standard_normal((s, 4), dtype=np.float32)
    v = rng.standard_normal((s, 4), dtype=np.float32)
    pos, crd = _pattern(2, s, lambda i, j: True)
    out = ops.sparse_attention(q, k, v, pos, crd, fused=True)
    assert_close(out, ref.sparse_attention(q, k, v, pos, crd))


@pytest.mark.parametrize("window, dilation", [(2, 1), (3, 2)])
def test_attention_window_keys_computed_not_read(rng, window, dilation):
    """The fused kernel's affine mode (keys i + t * dilation) equals the CSR of the same
    window, which equals the attention package's window / dilated masks; its launch moves no
    index bytes."""
    from dataflow.attention.api import mask_csr
    from dataflow.attention.patterns import resolve
    from dataflow.cuda.runner import Runner

    s = 12
    name, kw = ("window", {"window": window}) if dilation == 1 else \
        ("dilated", {"window": window, "dilation": dilation})
    pos, crd, _ = mask_csr(resolve(name, s, **kw), s)
    wpos, wcrd = ops.window_csr(s, s, window, dilation)
    np.testing.assert_array_equal(wpos, pos)
    np.testing.assert_array_equal(wcrd, crd)
    q, k, v = (rng.standard_normal((s, 4), dtype=np.float32) for _ in range(3))
    r = Runner()
    out = ops.sparse_attention(q, k, v, window=window, dilation=dilation, runner=r)
    assert_close(out, ref.sparse_attention(q, k, v, pos, crd))
    (launch,) = r.launches()
    assert launch.bytes == 4 * (4 * s * 4)  # q, k, v read and out written; no pos / crd


def test_attention_backend_cuda_on_a_named_pattern(rng):
    from dataflow.attention import sparse_attention

    q, k, v = (rng.standard_normal((8, 4), dtype=np.float32) for _ in range(3))
    assert_close(sparse_attention(q, k, v, pattern="butterfly", backend="cuda"),
                 sparse_attention(q, k, v, pattern="butterfly", backend="numpy"))


# --- PIT micro-tiles -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def dyn(rng):
    a = rng.standard_normal((40, 70), dtype=np.float32)
    a[np.abs(a) < 1.0] = 0
    a[:, 5:20] = 0  # whole zero columns: 32x1 tiles to skip
    a[8:30] = 0  # whole zero rows: 1x64 tiles to skip
    a[:32, 64:] = 0  # one whole 32x64 block
    return a, rng.standard_normal((70, 20), dtype=np.float32)


@pytest.mark.parametrize("granularity", [(32, 1), (1, 64), (32, 64), (8, 4)])
def test_microtile_matmul(dyn, granularity):
    a, b = dyn
    c, stats = ops.microtile_matmul(a, b, granularity)
    assert_close(c, ref.gemm(a, b), dtype=np.float32)
    flags = ref.microtile_flags(a, granularity)
    assert stats["tiles"] == flags.size
    assert stats["nonzero_tiles"] == int(flags.sum()) < flags.size
    gm, gk = granularity
    assert stats["computed_macs"] == int(flags.sum()) * gm * gk * b.shape[1]
    assert stats["useful_macs"] == np.count_nonzero(a) * b.shape[1] <= stats["computed_macs"]


@pytest.mark.parametrize("granularity", [(32, 1), (1, 64)])
def test_microtile_index_built_on_gpu_equals_numpy(dyn, granularity):
    a, _ = dyn
    idx, count = ops.microtile_index(a, granularity)
    flags = ref.microtile_flags(a, granularity)
    flags = flags.T if granularity[0] == 1 else flags  # 1 x gk: one list of rows per k-block
    np.testing.assert_array_equal(count, flags.sum(axis=1))
    for r in range(len(count)):
        np.testing.assert_array_equal(idx[r, :count[r]], np.flatnonzero(flags[r]))


def test_relu_ffn_on_the_gpu():
    """Y = ReLU(X W1 + b) W2 with dead neurons: GEMM, bias+ReLU, a 32x1 micro-tile second
    layer; a dry run of the same call counts the same tiles from the numpy definition of H."""
    from dataflow.cuda.runner import Runner
    from dataflow.dynamic import make_ffn_operands
    from dataflow.dynamic.ffn import ffn_reference

    x, w1, b, w2 = make_ffn_operands(32, 8, 32, 0.75, seed=3)  # 24 of 32 neurons dead
    run = Runner()
    assert_close(ops.relu_ffn(x, w1, b, w2, "32x1", runner=run), ffn_reference(x, w1, b, w2))
    dry = Runner(execute=False)
    ops.relu_ffn(x, w1, b, w2, "32x1", runner=dry)
    assert run.launches() == dry.launches()  # same kernels, grids, FLOPs and bytes
    kept = run.launches()[-1].flops // (2 * 32 * 8)  # 2 * (tiles * 32 rows * 1) * n
    assert kept == 8  # the dead neurons' 32 x 1 tiles are skipped


@pytest.mark.parametrize("experts, top_k, skew", [(4, 2, 0.0), (6, 1, 2.0)])
def test_moe_layer_on_the_gpu(experts, top_k, skew):
    """Gating, dispatch, grouped expert GEMMs and combine against the MoE package's definition;
    the GPU's routing (tokens per expert) equals numpy's, idle experts included (skew 2 leaves
    the high experts without tokens), and a dry run makes the same launches."""
    from dataflow.cuda.runner import Runner
    from dataflow.moe.gating import gate_logits, make_moe_operands, moe_reference, route

    x, wg, bias, w = make_moe_operands(experts, 20, 8, 12, skew, seed=1)
    run = Runner()
    y, stats = ops.moe(x, wg, bias, w, top_k, runner=run)
    assert_close(y, moe_reference(x, wg, bias, w, top_k))
    want = route(gate_logits(x, wg, bias), top_k).tokens_per_expert.tolist()
    assert stats["tokens_per_expert"] == want and sum(want) == 20 * top_k
    if skew:
        assert 0 in want  # an expert with no tokens: its blocks exit at once
    dry = Runner(execute=False)
    ops.moe(x, wg, bias, w, top_k, runner=dry)
    assert run.launches() == dry.launches()


# --- frontend backend="cuda" ---------------------------------------------------------------

def test_frontend_matmul_and_sddmm_on_cuda(rng):
    import dataflow
    from dataflow.ust_frontend.ops import sddmm

    a = _csr(10, 12, 0.3, 3)
    b = rng.standard_normal((12, 5), dtype=np.float32)
    assert_close(dataflow.matmul(a, b, backend="cuda"), dataflow.matmul(a, b))
    assert_close(dataflow.matmul(a.toarray(), b, backend="cuda", epilog=np.tanh),
                 dataflow.matmul(a.toarray(), b, epilog=np.tanh))
    vec = dataflow.matmul(a, b[:, 0], backend="cuda")
    assert vec.shape == (10,)
    assert_close(vec, dataflow.matmul(a, b[:, 0]))
    x = rng.standard_normal((10, 4), dtype=np.float32)
    y = rng.standard_normal((4, 12), dtype=np.float32)
    out = sddmm(x, y, a, backend="cuda")
    assert_close(out.val, sddmm(x, y, a).val)
    with pytest.raises(NotImplementedError, match="semiring"):
        dataflow.matmul(a, b, backend="cuda", semiring="max_plus")
    with pytest.raises(NotImplementedError, match="semiring"):
        sddmm(x, y, a, backend="cuda", semiring="max_plus")


# --- runner, dry runs, errors ---------------------------------------------------------------

def test_measure_and_dry_run_report_closed_form_counts(rng):
    from dataflow.cuda.runner import Runner, dry_run, measure

    a = rng.standard_normal((8, 8), dtype=np.float32)
    out, t = measure("gemm", ops.gemm, a, a, tile=8, repeats=3)
    assert_close(out, ref.gemm(a, a))
    assert t.flops == 2 * 8 * 8 * 8 and t.bytes == 4 * 3 * 64
    assert [x.kernel for x in t.launches] == ["gemm_tiled"]
    if t.mode == "cudasim":  # the simulator gives no GPU time, and says so
        assert t.seconds is None and not t.measured and t.flops_per_second is None
        assert "no GPU time" in t.summary()
    else:
        assert t.measured and t.seconds > 0
    launches = dry_run(ops.butterfly, np.zeros((4, 2048), np.float32),
                       np.zeros((11, 1024, 2, 2), np.float32))
    # strides 1..512 fuse in one 1024-element tile; 1024 runs as its own stage
    assert [x.kernel for x in launches] == ["butterfly_fused x10", "butterfly_stage"]
    assert launches[0].grid == (2, 4) and launches[0].block == (512,)
    assert sum(x.flops for x in launches) == 6 * 4 * 1024 * 11
    with pytest.raises(ValueError, match="dry run"):
        Runner(timed=True, execute=False)


@pytest.mark.parametrize("call, match", [
    (lambda: ops.gemm(np.ones((2, 3)), np.ones((4, 2))), "shapes do not agree"),
    (lambda: ops.gemm(np.ones(3), np.ones((3, 2))), "a must be a 2-D array"),
    (lambda: ops.butterfly(np.ones(12), np.ones((2, 6, 2, 2))), "power of two"),
    (lambda: ops.fnet_attention(np.ones((8, 6))), "dim must be a power of two"),
    (lambda: ops.butterfly_linear(np.ones(4), np.ones((2, 2, 2, 2)), np.ones(3)), "bias must"),
    (lambda: ops.butterfly(np.ones(8), np.ones((3, 3, 2, 2))), r"shape \(stages, 4, 2, 2\)"),
    (lambda: ops.butterfly(np.ones(8), np.ones((1, 4, 2, 2)), [3]), "strides must be powers"),
    (lambda: ops.fft(np.ones(6)), "power of two"),
    (lambda: ops.spmm([0, 1], [5], [1.0], (1, 3), np.ones((3, 2))), "column index out of range"),
    (lambda: ops.spmm([0, 1, 1], [0], [1.0], (1, 3), np.ones((3, 2))), "pos must have 2"),
    (lambda: ops.microtile_matmul(np.ones((4, 4)), np.ones((4, 4)), (64, 1)), "granularity"),
    (lambda: ops.microtile_matmul(np.ones((4, 4)), np.ones((4, 4)), "32x1"), "granularity"),
    (lambda: ops.sparse_attention(np.ones((2, 4)), np.ones((2, 3)), np.ones((2, 4)), [0, 1, 2],
                                  [0, 1]), r"q \(m, d\), k \(s, d\)"),
    (lambda: ops.sparse_attention(np.ones((1, 2)), np.ones((1, 2)), np.ones((1, 300)), [0, 1],
                                  [0], fused=True), "fused=False"),
    (lambda: ops.sparse_attention(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), [0, 1, 2],
                                  [0, 1], window=1), "not both"),
    (lambda: ops.window_csr(4, 4, 1, 0), "dilation >= 1"),
    (lambda: ops.moe(np.ones((4, 3)), np.ones((3, 2)), np.zeros(2), np.ones((2, 3, 5)), 3),
     "top_k"),
    (lambda: ops.moe(np.ones((4, 3)), np.ones((3, 2)), np.zeros(2), np.ones((2, 4, 5)), 1),
     "moe operands disagree"),
])
def test_bad_input_names_the_problem(call, match):
    with pytest.raises(ValueError, match=match):
        call()
