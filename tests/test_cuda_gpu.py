"""On a real GPU only (`DATAFLOW_HAVE_GPU=1 pytest -m gpu`): the kernels at sizes the simulator
cannot reach, CUDA-event timings, and measured-vs-modelled. Skipped cleanly elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from dataflow.testing import assert_close

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(0)


def test_runs_on_the_gpu():
    from dataflow.cuda.device import device_name, execution_mode, have_gpu

    assert have_gpu() and execution_mode() == "gpu"
    assert "simulator" not in device_name()


def test_large_shapes_match_numpy(rng):
    import scipy.sparse as sp

    from dataflow.cuda import ops
    from dataflow.cuda import reference as ref

    a = rng.standard_normal((1000, 700), dtype=np.float32)
    b = rng.standard_normal((700, 300), dtype=np.float32)
    assert_close(ops.gemm(a, b), ref.gemm(a, b))
    s = sp.random(2000, 1500, density=0.01, format="csr", dtype=np.float32, random_state=1)
    d = rng.standard_normal((1500, 64), dtype=np.float32)
    assert_close(ops.spmm(s.indptr, s.indices, s.data, s.shape, d),
                 ref.spmm(s.indptr, s.indices, s.data, s.shape, d))
    x = rng.standard_normal((8, 4096), dtype=np.float32)
    y = ops.fft(x)
    assert_close(y.real, np.fft.fft(x).real)
    assert_close(y.imag, np.fft.fft(x).imag)
    q, k, v = (rng.standard_normal((1024, 64), dtype=np.float32) for _ in range(3))
    pos = np.arange(0, 1025 * 64, 64)  # 64 keys per query: a wrapped window
    crd = (np.arange(1024)[:, None] + np.arange(-32, 32)[None, :]) % 1024
    for fused in (True, False):
        assert_close(ops.sparse_attention(q, k, v, pos, crd.ravel(), fused=fused),
                     ref.sparse_attention(q, k, v, pos, crd.ravel()))
    m = rng.standard_normal((1024, 1024), dtype=np.float32)
    m[:, rng.random(1024) < 0.9] = 0  # 90 % of the columns zero
    w = rng.standard_normal((1024, 256), dtype=np.float32)
    for g in ((32, 1), (1, 64), (32, 64)):
        assert_close(ops.microtile_matmul(m, w, g)[0], ref.gemm(m, w))


def test_event_timing_is_within_the_roofline(rng):
    """A measured time can never beat the spec's roofline of the same launches: achieved
    FLOP/s <= peak FLOP/s (within 5 % for clock reporting)."""
    from dataflow.cuda import ops
    from dataflow.cuda.device import device_name
    from dataflow.cuda.gpu_spec import available_gpus, load_gpu
    from dataflow.cuda.runner import measure

    a = rng.standard_normal((2048, 2048), dtype=np.float32)
    _, t = measure("gemm", ops.gemm, a, a, repeats=3)
    assert t.measured and t.seconds > 0 and t.repeats == 3
    assert t.flops == 2 * 2048 ** 3
    specs = [load_gpu(g) for g in available_gpus() if load_gpu(g).matches_device(device_name())]
    for spec in specs:
        assert t.flops_per_second <= 1.05 * spec.peak("fp32")


def test_compare_measures_on_the_matching_gpu():
    from dataflow.cuda.compare import compare
    from dataflow.cuda.device import device_name
    from dataflow.cuda.gpu_spec import available_gpus, load_gpu

    names = [g for g in available_gpus() if load_gpu(g).matches_device(device_name())]
    if not names:
        pytest.skip(f"no spec in arch_configs/gpus/ matches {device_name()}")
    r = compare("gemm", gpus=[names[0], "jetson_xavier_nx"], m=256, k=256, n=256)
    assert r.gpus[0].time_source == "measured"
    assert r.gpus[1].time_source == "modelled"  # not this machine's GPU
