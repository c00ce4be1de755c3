"""Convolution layers (`LayerKind.CONV2D`): the numpy reference, im2col, and the runner.

Layout: values are **NCHW** (input ``(n, c, h, w)``, or ``(c, h, w)`` for one image), weights
``(k, c, r, s)`` as PyTorch stores them, an optional bias ``(k,)``; the output is
``(n, k, oh, ow)``. Layer sizes: h, w, r, s, c, k, stride and, when it is not 0, padding
(zeros on every side).

Output sizing, chosen by `Layer.op`:

* ``""`` (PyTorch): ``oh = floor((h + 2p - r) / stride) + 1``;
* ``"scalesim"`` (rows of a SCALE-Sim topology file): SCALE-Sim 3.0.0's
  ``topology_utils.topo_calc_hyperparams`` sizes ``oh = ceil((h - r + stride) / stride)``,
  i.e. ``ceil((h - r) / stride) + 1``, one more than PyTorch when ``stride`` does not divide
  ``h - r``. The last window then overhangs the bottom (right) edge; SCALE-Sim's
  ``operand_matrix.calc_ifmap_elem_addr`` gives those elements the address -1 (no data), so
  here they read zeros.

Every preset runs a convolution as an im2col GEMM through the ordinary GEMM path
(`lower_matmul` -> `map_program` -> `simulate_mapping`): ``(n*oh*ow) x (r*s*c)`` patches times
the ``(r*s*c) x k`` filter matrix, the patch columns in SCALE-Sim's order (filter row, filter
column, channel; channel fastest). On the systolic preset that is exactly SCALE-Sim's conv
mapping (ifmap operand = output pixels x window, filter operand = window x filters), so its
compute cycles are SCALE-Sim's; on the reconfigurable arrays the compiler has no direct
convolution loop nest yet, so im2col is what it chooses.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from dataflow.arch import ArchSpec
from dataflow.models.gemm import simulate_gemm
from dataflow.models.layers import Layer, LayerKind, ModelError
from dataflow.models.runners import LayerRun, RunOptions, register_runner
from dataflow.models.topology import SCALESIM_SIZING
from dataflow.pe_array.systolic_memory import scalesim_im2col_addresses
from dataflow.workloads import finish

SIZINGS = ("", SCALESIM_SIZING)


def conv_output_size(n: int, r: int, stride: int, padding: int = 0, sizing: str = "") -> int:
    """Output extent along one axis of length `n` (filter `r`), per the sizing rule above."""
    if sizing not in SIZINGS:
        raise ModelError(f"unknown conv output sizing {sizing!r}; choose one of {SIZINGS}")
    span = n + 2 * padding - r
    if span < 0:
        raise ModelError(f"filter {r} is larger than the padded input {n + 2 * padding}")
    if sizing == SCALESIM_SIZING:
        return math.ceil(span / stride) + 1
    return span // stride + 1


@dataclasses.dataclass(frozen=True)
class ConvShape:
    """A conv layer's sizes (padding in elements on every side; `sizing` as `Layer.op`)."""

    h: int
    w: int
    r: int
    s: int
    c: int
    k: int
    stride: int
    padding: int = 0
    sizing: str = ""

    @property
    def out_hw(self) -> tuple[int, int]:
        return (conv_output_size(self.h, self.r, self.stride, self.padding, self.sizing),
                conv_output_size(self.w, self.s, self.stride, self.padding, self.sizing))


def conv_shape(layer: Layer) -> ConvShape:
    """The `ConvShape` of a CONV2D layer (raises `ModelError` naming the layer's source)."""
    if layer.kind != LayerKind.CONV2D:
        raise ModelError(f"{layer.where}: layer {layer.name!r} is {layer.kind}, not conv2d")
    shape = ConvShape(*(layer.size(key) for key in ("h", "w", "r", "s", "c", "k", "stride")),
                      padding=layer.size("padding", 0), sizing=layer.op)
    try:
        _ = shape.out_hw  # sizes the output now, so a bad layer fails here
    except ModelError as exc:
        raise ModelError(f"{layer.where}: layer {layer.name!r}: {exc}") from None
    return shape


def input_shape(layer: Layer, batch: int = 1) -> tuple[int, int, int, int]:
    """NCHW shape of the input a CONV2D layer reads."""
    cs = conv_shape(layer)
    return batch, cs.c, cs.h, cs.w


def weight_shapes(layer: Layer) -> dict[str, tuple[int, ...]]:
    """Shapes of the layer's parameters: "weight" (k, c, r, s); "bias" (k,) is optional."""
    cs = conv_shape(layer)
    return {"weight": (cs.k, cs.c, cs.r, cs.s)}


def _padded(x: np.ndarray, cs: ConvShape) -> np.ndarray:
    """x (n, c, h, w) with `padding` zeros on every side, plus the zeros an overhanging last
    window reads (SCALE-Sim sizing) at the bottom and right."""
    oh, ow = cs.out_hw
    need_h = (oh - 1) * cs.stride + cs.r
    need_w = (ow - 1) * cs.stride + cs.s
    p = cs.padding
    extra_h = max(0, need_h - (cs.h + 2 * p))
    extra_w = max(0, need_w - (cs.w + 2 * p))
    return np.pad(x, ((0, 0), (0, 0), (p, p + extra_h), (p, p + extra_w)))


def _as_nchw(x: np.ndarray, cs: ConvShape, where: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[None]
    if x.ndim != 4 or x.shape[1:] != (cs.c, cs.h, cs.w):
        raise ModelError(f"{where}: conv input must be (n, {cs.c}, {cs.h}, {cs.w}) (NCHW), "
                         f"got {tuple(np.shape(x))}")
    return x


def _check_weight(w: np.ndarray, cs: ConvShape, where: str) -> np.ndarray:
    w = np.asarray(w)
    if w.shape != (cs.k, cs.c, cs.r, cs.s):
        raise ModelError(f"{where}: conv weight must be ({cs.k}, {cs.c}, {cs.r}, {cs.s}) "
                         f"(k, c, r, s), got {tuple(w.shape)}")
    return w


def conv2d_reference(x: np.ndarray, weight: np.ndarray, cs: ConvShape,
                     bias: np.ndarray | None = None) -> np.ndarray:
    """The numpy definition, in float64: a direct sum over the filter taps (no im2col), NCHW in,
    (n, k, oh, ow) out."""
    x = _as_nchw(x, cs, "conv2d_reference").astype(np.float64)
    weight = _check_weight(weight, cs, "conv2d_reference").astype(np.float64)
    xp = _padded(x, cs)
    oh, ow = cs.out_hw
    st = cs.stride
    out = np.zeros((x.shape[0], cs.k, oh, ow))
    for i in range(cs.r):
        for j in range(cs.s):
            window = xp[:, :, i: i + st * (oh - 1) + 1: st, j: j + st * (ow - 1) + 1: st]
            out += np.einsum("nchw,kc->nkhw", window, weight[:, :, i, j])
    if bias is not None:
        out += np.asarray(bias, np.float64).reshape(1, cs.k, 1, 1)
    return out


def im2col(x: np.ndarray, cs: ConvShape) -> np.ndarray:
    """Patches of x (NCHW) as a ``(n*oh*ow) x (r*s*c)`` matrix: rows in (n, oh, ow) order,
    columns (filter row, filter column, channel) with channel fastest, as SCALE-Sim's ifmap
    operand matrix."""
    x = _as_nchw(x, cs, "im2col")
    xp = _padded(x, cs).transpose(0, 2, 3, 1)  # n, h, w, c
    oh, ow = cs.out_hw
    st = cs.stride
    n = x.shape[0]
    cols = np.empty((n, oh, ow, cs.r, cs.s, cs.c), dtype=x.dtype)
    for i in range(cs.r):
        for j in range(cs.s):
            cols[:, :, :, i, j, :] = xp[:, i: i + st * (oh - 1) + 1: st,
                                        j: j + st * (ow - 1) + 1: st, :]
    return cols.reshape(n * oh * ow, cs.r * cs.s * cs.c)


def filter_matrix(weight: np.ndarray, cs: ConvShape) -> np.ndarray:
    """Weights (k, c, r, s) as the ``(r*s*c) x k`` GEMM operand, rows in im2col's order."""
    w = _check_weight(weight, cs, "filter_matrix")
    return w.transpose(2, 3, 1, 0).reshape(cs.r * cs.s * cs.c, cs.k)


def run_conv2d(layer: Layer, inputs: list[np.ndarray], weights: dict[str, np.ndarray],
               arch: ArchSpec, options: RunOptions) -> LayerRun:
    """Run a CONV2D layer as an im2col GEMM on `arch`; output (n, k, oh, ow) in fp32, checked
    against `conv2d_reference`. `options.dataflow` applies on systolic arrays only."""
    t0 = time.perf_counter()
    cs = conv_shape(layer)
    if len(inputs) != 1:
        raise ModelError(f"{layer.where}: conv layer {layer.name!r} reads one input, "
                         f"got {len(inputs)}")
    if "weight" not in weights:
        raise ModelError(f"{layer.where}: conv layer {layer.name!r} needs a 'weight'")
    x = _as_nchw(inputs[0], cs, layer.where)
    w = _check_weight(weights["weight"], cs, layer.where)
    bias = weights.get("bias")
    # as SCALE-Sim maps it, the im2col operand's repeated pixels are one word each in memory
    shared = (scalesim_im2col_addresses(cs.h, cs.w, cs.r, cs.s, cs.c, cs.stride)
              if cs.sizing == SCALESIM_SIZING and cs.padding == 0 and x.shape[0] == 1 else None)
    product, res = simulate_gemm(im2col(x, cs), filter_matrix(w, cs), arch, options, layer.name,
                                 a_addresses=shared)
    oh, ow = cs.out_hw
    out = product.reshape(x.shape[0], oh, ow, cs.k).transpose(0, 3, 1, 2)
    if bias is not None:  # a per-filter add on the output, done on the host
        out = out + np.asarray(bias, np.float32).reshape(1, cs.k, 1, 1)
    out = np.ascontiguousarray(out, np.float32)
    reference = conv2d_reference(x, w, cs, bias)
    res = finish(dataclasses.replace(res, output=out), reference, t0)
    return LayerRun(result=res, output=out, reference=reference)


register_runner(LayerKind.CONV2D, run_conv2d)
