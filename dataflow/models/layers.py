"""A whole network as the models stage sees it: a `Model` is a list of `Layer`s in execution
order, each one op of the frontend or a workload (GEMM, convolution, attention, an
element-wise op, an embedding lookup, a mixture-of-experts FFN), joined by the names of the
layers whose outputs they read (docs/architecture.md#models).

Layers carry sizes only, never values: a model file, a SCALE-Sim topology row or a captured
PyTorch graph all become the same objects; values (weights, activations) are supplied when the
model is simulated (`dataflow.models.simulate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from dataflow.errors import UserError

#: the name a layer uses in `inputs` for the model's own input
MODEL_INPUT = "input"


class LayerKind(str, Enum):
    """What a layer computes. A str enum: model files spell the word."""

    GEMM = "gemm"  # sizes m, k, n: (m x k) @ (k x n); a Linear layer, a projection
    CONV2D = "conv2d"  # sizes h, w, r, s, c, k, stride (and padding): NCHW / SCALE-Sim rows
    ATTENTION = "attention"  # sizes seq, heads, head_dim; op = the sparsity pattern
    # op = relu | gelu | silu | add | mul | layernorm | softmax | maxpool | global_avgpool
    ELEMENTWISE = "elementwise"
    EMBEDDING = "embedding"  # sizes vocab, dim, tokens: a table lookup
    MOE = "moe"  # sizes tokens, dim, hidden, experts, top_k

    def __str__(self) -> str:
        return self.value


class ModelError(UserError):
    """A malformed model: names the file (or module path) and the layer."""


@dataclass(frozen=True)
class Layer:
    """One layer: `sizes` are named integers (see `LayerKind`), `op` a sub-kind (the
    element-wise function, the attention pattern), `inputs` the layers it reads, `source`
    where it came from (a file and line, a module path in a PyTorch model)."""

    name: str
    kind: LayerKind
    sizes: tuple[tuple[str, int], ...]
    inputs: tuple[str, ...] = (MODEL_INPUT,)
    op: str = ""
    source: str = ""

    def size(self, key: str, default: int | None = None) -> int:
        for k, v in self.sizes:
            if k == key:
                return v
        if default is None:
            raise ModelError(f"{self.where}: layer {self.name!r} has no size {key!r}")
        return default

    @property
    def where(self) -> str:
        return self.source or "<model>"


@dataclass(frozen=True)
class Model:
    """Layers in execution order; `source` is the file or the PyTorch class it came from."""

    name: str
    layers: tuple[Layer, ...]
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    def verify(self) -> Model:
        """Raise `ModelError` unless names are unique and every layer reads earlier ones."""
        seen = {MODEL_INPUT}
        for layer in self.layers:
            if layer.name in seen:
                raise ModelError(f"{layer.where}: layer name {layer.name!r} is used twice")
            missing = [i for i in layer.inputs if i not in seen]
            if missing:
                raise ModelError(f"{layer.where}: layer {layer.name!r} reads {missing[0]!r}, "
                                 "which no earlier layer produces")
            for key, value in layer.sizes:
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise ModelError(f"{layer.where}: layer {layer.name!r}: {key} must be a "
                                     f"positive integer, got {value!r}")
            seen.add(layer.name)
        if not self.layers:
            raise ModelError(f"{self.source or '<model>'}: the model has no layers")
        return self
