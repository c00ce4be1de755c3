"""`from_torch(model, example_inputs)`: a PyTorch module as a `Model`, captured with
`torch.export` (docs/architecture.md#models).

The exported graph's aten ops become layers: linear / addmm / mm / bmm / matmul -> GEMM,
conv2d / convolution -> CONV2D, scaled_dot_product_attention -> ATTENTION (what
`nn.MultiheadAttention` exports to), layer_norm, softmax, gelu, relu, silu, add, mul ->
ELEMENTWISE, embedding -> EMBEDDING. Views, reshapes, transposes, selects and dtype casts are
folded: they become `Feed` steps, the numpy re-indexing of a producer's output on its way to a
reader (no cycles: a compiler folds them into the reader's addresses; the result says so).
Any other op is one `ModelError` naming the op and the module path it sits in.

torch is an optional extra: it is imported inside the functions that need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dataflow.models.layers import MODEL_INPUT, Layer, LayerKind, Model, ModelError
from dataflow.ust_frontend.extras import require

# Deferred imports: torch is the `torch` extra, imported in `from_torch` and `_numpy` only.


@dataclass(frozen=True)
class Feed:
    """What a layer reads at one input position: `source`'s output (a layer name or
    `MODEL_INPUT`) re-indexed by `steps` ((op, args...) of `VIEW_STEPS`)."""

    source: str
    steps: tuple[tuple, ...] = ()

    def value(self, env: dict[str, np.ndarray]) -> np.ndarray:
        x = env[self.source]
        for op, *args in self.steps:
            x = VIEW_STEPS[op](x, *args)
        return x

    def then(self, *step) -> Feed:
        return Feed(self.source, self.steps + (tuple(step),))


def _transpose(x, a, b):
    return np.swapaxes(x, a, b)


def _unflatten(x, dim, sizes):
    dim = dim % x.ndim
    return x.reshape(x.shape[:dim] + tuple(sizes) + x.shape[dim + 1:])


def _squeeze(x, *dims):
    dims = [d for d in (dims or range(x.ndim)) if x.shape[d] == 1]
    return np.squeeze(x, axis=tuple(dims)) if dims else x


def _slice(x, dim=0, start=None, end=None, step=1):
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(start, end, step)
    return x[tuple(idx)]


#: numpy definitions of the folded aten view ops (name -> fn(x, *args))
VIEW_STEPS = {
    "view": lambda x, shape: x.reshape(shape),
    "reshape": lambda x, shape: x.reshape(shape),
    "_unsafe_view": lambda x, shape: x.reshape(shape),
    "flatten": lambda x, start=0, end=-1: x.reshape(
        x.shape[:start % x.ndim] + (-1,) + x.shape[end % x.ndim + 1:]),
    "unflatten": _unflatten,
    "transpose": _transpose,
    "t": lambda x: x.T,
    "permute": lambda x, dims: np.transpose(x, dims),
    "unsqueeze": lambda x, dim: np.expand_dims(x, dim if dim >= 0 else x.ndim + 1 + dim),
    "squeeze": _squeeze,
    "select": lambda x, dim, index: np.take(x, index, axis=dim),
    "slice": _slice,
    "expand": lambda x, shape: np.broadcast_to(
        x, tuple(s if s != -1 else x.shape[i - len(shape) + x.ndim]
                 for i, s in enumerate(shape))),
    "contiguous": lambda x: x,
    "clone": lambda x: x,
    "alias": lambda x: x,
    "detach": lambda x: x,
    "dropout": lambda x, p=0.0, train=False: x,  # inference: identity
    "to": lambda x, *a: x,
    "_to_copy": lambda x, *a: x,
    "type_as": lambda x, other=None: x,
}

_ELEMENTWISE = {"relu": "relu", "silu": "silu", "add": "add", "mul": "mul",
                "softmax": "softmax", "_softmax": "softmax", "layer_norm": "layernorm"}
_GEMM = ("linear", "addmm", "mm", "bmm", "matmul")


@dataclass(frozen=True)
class CapturedModel:
    """A `Model` with its values: per-layer weights, the `Feed`s of every layer's inputs (in
    `layer.inputs` order of positions), the output's feed, the example input and PyTorch's
    own output on it (float32 numpy)."""

    model: Model
    weights: dict[str, dict[str, np.ndarray]]
    feeds: dict[str, tuple[Feed, ...]]
    output: Feed
    example_input: np.ndarray
    reference_output: np.ndarray
    notes: tuple[str, ...] = field(default=())


def _numpy(t) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


def _where(node, cls: str) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    path, typ = next(reversed(stack.values())) if stack else ("", cls)
    typ = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    line = f"; {trace[-2].strip()}" if len(trace) >= 2 else ""
    return f"{cls}: module {path or '<root>'} ({typ.rsplit('.', 1)[-1]}){line}"


def _op_name(node) -> str:
    # aten.linear.default -> "linear"
    return str(node.target).split(".")[1] if str(node.target).startswith("aten.") \
        else str(node.target)


class _Capture:
    """One walk over the exported graph: env maps a node name to a Feed (an activation), a
    numpy array (a parameter or constant) or a Python scalar."""

    def __init__(self, cls: str, params: dict[str, np.ndarray]):
        self.cls, self.params = cls, params
        self.env: dict[str, object] = {}
        self.layers: list[Layer] = []
        self.weights: dict[str, dict[str, np.ndarray]] = {}
        self.feeds: dict[str, tuple[Feed, ...]] = {}

    def arg(self, a):
        if hasattr(a, "name") and hasattr(a, "op"):  # an fx Node
            return self.env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(self.arg(x) for x in a)
        return a

    def add(self, node, kind: LayerKind, sizes: dict[str, int], feeds: list[Feed],
            weights: dict | None = None, op: str = "") -> None:
        name = node.name
        self.layers.append(Layer(name, kind, tuple((k, int(v)) for k, v in sizes.items()),
                                 tuple(f.source for f in feeds), op, _where(node, self.cls)))
        self.feeds[name] = tuple(feeds)
        self.weights[name] = {k: np.asarray(v, dtype=np.float32) for k, v in
                              (weights or {}).items() if v is not None}
        self.env[name] = Feed(name)

    def unsupported(self, node, why: str = "") -> ModelError:
        return ModelError(f"{_where(node, self.cls)}: unsupported op {node.target}"
                          + (f" ({why})" if why else "")
                          + "; supported: linear, conv2d, matmul/bmm, "
                          "scaled_dot_product_attention, layer_norm, softmax, gelu, relu, silu, "
                          "add, mul, embedding and views")

    def node(self, node) -> None:
        name = _op_name(node)
        args = [self.arg(a) for a in node.args]
        kwargs = {k: self.arg(v) for k, v in node.kwargs.items()}
        out_shape = tuple(node.meta["val"].shape) if hasattr(node.meta.get("val"), "shape") \
            else ()
        if getattr(node.target, "__name__", "") == "getitem":  # one part of unbind/split
            self.env[node.name] = args[0][args[1]]
            return
        if name == "unbind" and isinstance(args[0], Feed):
            dim = args[1] if len(args) > 1 else 0
            self.env[node.name] = tuple(args[0].then("select", dim, i)
                                        for i in range(node.args[0].meta["val"].shape[dim]))
            return
        if name in VIEW_STEPS:
            x, rest = args[0], [list(a) if isinstance(a, (list, tuple)) else a
                                for a in args[1:] if not _is_dtype(a)]
            if name in ("to", "_to_copy", "type_as", "dropout", "contiguous", "clone"):
                rest = []
            self.env[node.name] = (x.then(name, *rest) if isinstance(x, Feed)
                                   else VIEW_STEPS[name](np.asarray(x), *rest))
            return
        if name in _GEMM:
            return self.gemm(node, name, args, out_shape)
        if name == "scaled_dot_product_attention":
            return self.attention(node, args, kwargs)
        if name in _ELEMENTWISE or name == "gelu":
            return self.elementwise(node, name, args, kwargs, out_shape)
        if name == "embedding":
            table, ids = args[0], args[1]
            if not isinstance(ids, Feed) or isinstance(table, Feed):
                raise self.unsupported(node, "the table must be a parameter")
            return self.add(node, LayerKind.EMBEDDING,
                            {"vocab": table.shape[0], "dim": table.shape[1],
                             "tokens": int(np.prod(out_shape[:-1]))}, [ids], {"weight": table})
        if name in ("conv2d", "convolution"):
            return self.conv(node, args, out_shape)
        raise self.unsupported(node)

    def gemm(self, node, name, args, out_shape) -> None:
        if name == "addmm":
            bias, a, b = args[0], args[1], args[2]
        elif name == "linear":
            a, w = args[0], args[1]
            b, bias = (w.T if not isinstance(w, Feed) else w.then("t")), \
                (args[2] if len(args) > 2 else None)
        else:
            a, b, bias = args[0], args[1], None
        if not isinstance(a, Feed):
            raise self.unsupported(node, "the left operand must be an activation")
        feeds, weights = [a], {"bias": bias}
        if isinstance(b, Feed):
            feeds.append(b)
        else:
            weights["weight"] = b
        in_shape = tuple(node.args[0].meta["val"].shape)
        self.add(node, LayerKind.GEMM, {"m": int(np.prod(out_shape[:-1])), "k": in_shape[-1],
                                        "n": out_shape[-1]}, feeds, weights)

    def attention(self, node, args, kwargs) -> None:
        q, k, v = args[:3]
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        dropout = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
        causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
        scale = kwargs.get("scale")
        qv = node.args[0].meta["val"]
        if mask is not None or dropout or scale not in (None, qv.shape[-1] ** -0.5) \
                or not all(isinstance(x, Feed) for x in (q, k, v)):
            raise self.unsupported(node, "attn_mask, dropout and a custom scale are not; "
                                   "is_causal is")
        heads = int(np.prod(qv.shape[:-2])) if len(qv.shape) > 2 else 1
        self.add(node, LayerKind.ATTENTION, {"seq": qv.shape[-2], "heads": heads,
                                             "head_dim": qv.shape[-1]}, [q, k, v],
                 op="causal" if causal else "dense")

    def elementwise(self, node, name, args, kwargs, out_shape) -> None:
        x = args[0]
        op = _ELEMENTWISE.get(name, "gelu")
        weights: dict = {}
        if name == "gelu":
            op = "gelu_tanh" if kwargs.get("approximate", "none") == "tanh" else "gelu"
        if op in ("add", "mul"):
            other = args[1]
            if not isinstance(x, Feed):
                x, other = other, x
            if kwargs.get("alpha", 1) != 1:
                raise self.unsupported(node, "add with alpha")
            feeds = [x] + ([other] if isinstance(other, Feed) else [])
            if not isinstance(other, Feed):
                weights["other"] = np.asarray(other, dtype=np.float32)
        elif op == "softmax":
            if args[1] not in (-1, len(out_shape) - 1):
                raise self.unsupported(node, "softmax over a dimension other than the last")
            feeds = [x]
        elif op == "layernorm":
            if len(args[1]) != 1:
                raise self.unsupported(node, "layer_norm over more than the last dimension")
            feeds = [x]
            weights = {"weight": args[2] if len(args) > 2 else None,
                       "bias": args[3] if len(args) > 3 else None,
                       "eps": np.array(args[4] if len(args) > 4 else 1e-5)}
        else:
            feeds = [x]
        if not isinstance(x, Feed):
            raise self.unsupported(node, "an operation on parameters only")
        cols = out_shape[-1] if out_shape else 1
        self.add(node, LayerKind.ELEMENTWISE,
                 {"rows": max(1, int(np.prod(out_shape[:-1]))), "cols": cols}, feeds,
                 {k: v for k, v in weights.items() if v is not None}, op=op)

    def conv(self, node, args, out_shape) -> None:
        x, w = args[0], args[1]
        bias = args[2] if len(args) > 2 else None
        stride = args[3] if len(args) > 3 else [1, 1]
        padding = args[4] if len(args) > 4 else [0, 0]
        groups = args[-1] if len(args) > 6 else 1
        if not isinstance(x, Feed) or isinstance(w, Feed) or groups != 1 \
                or len(set(stride)) != 1 or len(set(padding)) != 1:
            raise self.unsupported(node, "only square stride/padding, groups 1, weights "
                                   "as parameters")
        in_shape = tuple(node.args[0].meta["val"].shape)
        sizes = {"h": in_shape[-2], "w": in_shape[-1], "r": w.shape[2], "s": w.shape[3],
                 "c": w.shape[1], "k": w.shape[0], "stride": stride[0]}
        if padding[0]:  # sizes are positive: no padding is the key left out
            sizes["padding"] = padding[0]
        self.add(node, LayerKind.CONV2D, sizes, [x], {"weight": w, "bias": bias})


def _is_dtype(a) -> bool:
    return type(a).__name__ in ("dtype", "memory_format", "device", "layout")


def from_torch(model, example_inputs) -> CapturedModel:
    """Capture `model` (an `nn.Module`) on `example_inputs` (one tensor, or a tuple holding
    one) with `torch.export.export`; returns the layers, weights and PyTorch's own output."""
    torch = require("torch", "torch", needed_for="dataflow.models.from_torch")
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    cls = type(model).__name__
    if len(inputs) != 1 or not isinstance(inputs[0], torch.Tensor):
        raise ModelError(f"{cls}: from_torch takes one example input tensor, got "
                         f"{len(inputs)} input(s)")
    model = model.eval()
    with torch.no_grad():
        exported = torch.export.export(model, inputs)
        reference = model(*inputs)
    if not isinstance(reference, torch.Tensor):
        raise ModelError(f"{cls}: the model must return one tensor, got "
                         f"{type(reference).__name__}")
    sig = exported.graph_signature
    state = {**exported.state_dict, **getattr(exported, "constants", {})}
    lifted = {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
              **getattr(sig, "inputs_to_lifted_tensor_constants", {})}
    cap = _Capture(cls, {})
    output = None
    for node in exported.graph_module.graph.nodes:
        if node.op == "placeholder":
            cap.env[node.name] = (_numpy(state[lifted[node.name]]) if node.name in lifted
                                  else Feed(MODEL_INPUT))
        elif node.op == "call_function":
            cap.node(node)
        elif node.op == "output":
            out = cap.arg(node.args[0])
            out = out[0] if isinstance(out, (list, tuple)) and len(out) == 1 else out
            if not isinstance(out, Feed):
                raise ModelError(f"{cls}: the model's output is not computed from its input")
            output = out
    layers = Model(cls, tuple(cap.layers), source=f"torch:{cls}").verify()
    return CapturedModel(layers, cap.weights, cap.feeds, output, _numpy(inputs[0]),
                         _numpy(reference).astype(np.float32),
                         notes=("views, reshapes and transposes of the exported graph are "
                                "folded into their readers' addressing: no cycles charged",))
