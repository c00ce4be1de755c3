"""Convolution layers: SCALE-Sim's output sizing, the numpy reference, im2col, and the conv and
GEMM runners on the systolic preset (cycles = SCALE-Sim's closed form) and on reconfigurable
arrays (values = numpy)."""

import sys

import numpy as np
import pytest

from dataflow.arch import load_arch
from dataflow.models.conv import (
    ConvShape,
    conv2d_reference,
    conv_output_size,
    filter_matrix,
    im2col,
    input_shape,
    run_conv2d,
    weight_shapes,
)
from dataflow.models.layers import Layer, LayerKind, ModelError
from dataflow.models.ops import run_gemm
from dataflow.models.runners import RunOptions, runner_for
from dataflow.testing import assert_close
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "scalesim"))
from closed_form import scalesim_compute_cycles  # noqa: E402

SYSTOLIC = load_arch(ROOT / "arch_configs" / "systolic_32x32.yaml")
DEFAULT = load_arch(ROOT / "arch_configs" / "default.yaml")


def _conv(h, w, r, s, c, k, stride, padding=0, op=""):
    sizes = [("h", h), ("w", w), ("r", r), ("s", s), ("c", c), ("k", k), ("stride", stride)]
    if padding:
        sizes.append(("padding", padding))
    return Layer(name="conv", kind=LayerKind.CONV2D, sizes=tuple(sizes), op=op, source="t:1")


def _operands(layer, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(input_shape(layer), dtype=np.float32)
    w = rng.standard_normal(weight_shapes(layer)["weight"], dtype=np.float32)
    return x, w


def _naive_conv(x, w, stride, padding, oh, ow):
    """Six nested loops over an explicitly zero-extended input: the slowest, plainest form."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    out = np.zeros((n, k, oh, ow))
    for b in range(n):
        for f in range(k):
            for i in range(oh):
                for j in range(ow):
                    acc = 0.0
                    for ch in range(c):
                        for di in range(r):
                            for dj in range(s):
                                y = i * stride + di - padding
                                z = j * stride + dj - padding
                                if 0 <= y < h and 0 <= z < wd:
                                    acc += float(x[b, ch, y, z]) * float(w[f, ch, di, dj])
                    out[b, f, i, j] = acc
    return out


@pytest.mark.parametrize("n,r,stride,scalesim,torch", [
    (230, 7, 2, 113, 112),  # ResNet-18 conv1 with its padding in the ifmap
    (58, 3, 2, 29, 28),
    (56, 1, 2, 29, 28),
    (9, 3, 2, 4, 4),  # stride divides n - r: the two rules agree
    (10, 3, 3, 4, 3),
    (8, 8, 1, 1, 1),
])
def test_output_size_scalesim_rounds_up(n, r, stride, scalesim, torch):
    assert conv_output_size(n, r, stride, sizing="scalesim") == scalesim
    assert conv_output_size(n, r, stride) == torch


def test_output_size_rejects_unknown_sizing_and_big_filters():
    with pytest.raises(ModelError, match="sizing"):
        conv_output_size(8, 3, 1, sizing="ceil")
    with pytest.raises(ModelError, match="larger"):
        conv_output_size(4, 5, 1)


@pytest.mark.parametrize("cs", [
    ConvShape(6, 7, 3, 2, 2, 3, 1),
    ConvShape(7, 7, 3, 3, 2, 2, 2, padding=1),
    ConvShape(10, 10, 3, 3, 2, 3, 3, sizing="scalesim"),  # last window overhangs
    ConvShape(8, 6, 2, 3, 3, 4, 2, sizing="scalesim"),
])
def test_reference_and_im2col_equal_the_naive_loops(cs):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, cs.c, cs.h, cs.w))
    w = rng.standard_normal((cs.k, cs.c, cs.r, cs.s))
    oh, ow = cs.out_hw
    want = _naive_conv(x, w, cs.stride, cs.padding, oh, ow)
    assert_close(conv2d_reference(x, w, cs), want, dtype=np.float64)
    gemm = im2col(x, cs) @ filter_matrix(w, cs)  # rows (n, oh, ow), columns filters
    assert_close(gemm.reshape(2, oh, ow, cs.k).transpose(0, 3, 1, 2), want)


def test_scalesim_sizing_adds_only_the_overhanging_windows():
    cs_ss = ConvShape(10, 10, 3, 3, 2, 3, 3, sizing="scalesim")
    cs_pt = ConvShape(10, 10, 3, 3, 2, 3, 3)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 10, 10))
    w = rng.standard_normal((3, 2, 3, 3))
    big, small = conv2d_reference(x, w, cs_ss), conv2d_reference(x, w, cs_pt)
    assert big.shape == (1, 3, 4, 4) and small.shape == (1, 3, 3, 3)
    assert_close(big[:, :, :3, :3], small)
    # the last window starts at row 9 and sees only row 9 (rows 10, 11 are SCALE-Sim's -1)
    edge = np.einsum("cj,kcj->k", x[0, :, 9, 0:3], w[:, :, 0, :])
    assert_close(big[0, :, 3, 0], edge)


def test_runners_are_registered():
    assert runner_for(_conv(8, 8, 3, 3, 2, 2, 1)) is run_conv2d
    gemm = Layer(name="g", kind=LayerKind.GEMM, sizes=(("m", 2), ("k", 3), ("n", 4)))
    assert runner_for(gemm) is run_gemm


@pytest.mark.parametrize("df", ["os", "ws", "is"])
@pytest.mark.parametrize("layer", [
    _conv(8, 8, 3, 3, 4, 8, 1, op="scalesim"),
    _conv(10, 10, 3, 3, 2, 5, 3, op="scalesim"),
    _conv(8, 8, 3, 3, 3, 40, 2, padding=1),
], ids=["s1", "s3-overhang", "pad1-s2"])
def test_conv_on_systolic_is_scalesim_gemm(layer, df):
    x, w = _operands(layer)
    run = run_conv2d(layer, [x], {"weight": w}, SYSTOLIC, RunOptions(dataflow=df))
    cs = ConvShape(*(layer.size(k) for k in ("h", "w", "r", "s", "c", "k", "stride")),
                   padding=layer.size("padding", 0), sizing=layer.op)
    oh, ow = cs.out_hw
    assert run.output.shape == (1, cs.k, oh, ow)
    assert run.result.values_match_reference is True
    assert_close(run.output, _naive_conv(x, w, cs.stride, cs.padding, oh, ow))
    want = scalesim_compute_cycles(oh * ow, cs.k, cs.r * cs.s * cs.c, df, 32, 32)
    assert run.result.compute_cycles == want


@pytest.mark.parametrize("layer", [
    _conv(8, 8, 3, 3, 2, 4, 1, padding=1),
    _conv(8, 8, 3, 3, 3, 2, 2, op="scalesim"),
    _conv(7, 8, 1, 1, 4, 3, 2),
], ids=["pad1", "s2-scalesim", "pointwise-s2"])
def test_conv_on_reconfigurable_array_equals_numpy(layer):
    x, w = _operands(layer, seed=3)
    bias = np.arange(layer.size("k"), dtype=np.float32)
    run = run_conv2d(layer, [x[0]], {"weight": w, "bias": bias}, DEFAULT, RunOptions())
    cs = ConvShape(*(layer.size(k) for k in ("h", "w", "r", "s", "c", "k", "stride")),
                   padding=layer.size("padding", 0), sizing=layer.op)
    oh, ow = cs.out_hw
    want = _naive_conv(x, w, cs.stride, cs.padding, oh, ow) + bias.reshape(1, -1, 1, 1)
    assert_close(run.output, want, dtype=np.float32)
    assert run.result.values_match_reference is True
    assert run.result.macs == oh * ow * cs.k * cs.r * cs.s * cs.c


def test_conv_runner_rejects_wrong_shapes():
    layer = _conv(8, 8, 3, 3, 2, 4, 1)
    x, w = _operands(layer)
    with pytest.raises(ModelError, match=r"t:1: conv weight must be \(4, 2, 3, 3\)"):
        run_conv2d(layer, [x], {"weight": w[:, :1]}, DEFAULT, RunOptions())
    with pytest.raises(ModelError, match="NCHW"):
        run_conv2d(layer, [x.transpose(0, 2, 3, 1)], {"weight": w}, DEFAULT, RunOptions())
    with pytest.raises(ModelError, match="needs a 'weight'"):
        run_conv2d(layer, [x], {}, DEFAULT, RunOptions())


@pytest.mark.parametrize("arch,df", [(SYSTOLIC, "ws"), (DEFAULT, None)], ids=["systolic", "8x8"])
def test_gemm_runner(arch, df):
    layer = Layer(name="g", kind=LayerKind.GEMM, sizes=(("m", 12), ("k", 20), ("n", 9)),
                  source="g:2")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((12, 20), dtype=np.float32)
    w = rng.standard_normal((20, 9), dtype=np.float32)
    run = run_gemm(layer, [x], {"weight": w}, arch, RunOptions(dataflow=df))
    assert_close(run.output, x.astype(np.float64) @ w, dtype=np.float32)
    assert run.result.values_match_reference is True
    if df:
        assert run.result.compute_cycles == scalesim_compute_cycles(12, 9, 20, df, 32, 32)
    with pytest.raises(ModelError, match=r"g:2: .*'weight' must be \(20, 9\)"):
        run_gemm(layer, [x], {"weight": w.T}, arch, RunOptions(dataflow=df))
