"""Model files (`models/*.yaml`): `load_model(path, **sizes) -> Model`.

The format::

    name: bert_base_layer
    sizes:                 # named integers, in order; later ones may use earlier ones
      seq: 512
      hidden: 768
      ffn: hidden * 4
    layers:
      - {name: q, kind: gemm, inputs: [ln1], m: seq, k: hidden, n: hidden}
      - {name: attn, kind: attention, inputs: [q, k, v], op: dense, seq: seq, heads: heads,
         head_dim: hidden / heads}

A layer has `name`, `kind` (a `LayerKind` word), `inputs` (default `[input]`, the model's
input), optionally `op` (the element-wise function, the attention pattern) and its sizes, each
an integer or an arithmetic expression of the file's size names (+ - * / // % and
parentheses; `/` must divide exactly). Expressions are parsed with `ast` and evaluated by a
small walker: never `eval`. Sizes given to `load_model` replace the file's values before the
later sizes are computed from them. Every error names the file and the key path.
"""

from __future__ import annotations

import ast
import operator
from pathlib import Path

from dataflow.arch.load import read_yaml
from dataflow.models.layers import MODEL_INPUT, Layer, LayerKind, Model, ModelError

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_LAYER_KEYS = ("name", "kind", "inputs", "op")


def _file_error(file: str, key: str, message: str) -> ModelError:
    return ModelError(f"{file}: {key}: {message}" if key else f"{file}: {message}")


def evaluate(expr, names: dict[str, int], where: str) -> int:
    """An integer or an arithmetic expression of `names` (see the module docstring)."""
    if isinstance(expr, bool) or not isinstance(expr, (int, str)):
        raise ModelError(f"{where}: expected an integer or an expression, got {expr!r}")
    if isinstance(expr, int):
        return expr
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise ModelError(f"{where}: cannot parse {expr!r} as arithmetic") from None

    def walk(node) -> int:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ModelError(f"{where}: unknown size {node.id!r} in {expr!r}; known: "
                                 f"{sorted(names)}")
            return names[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = walk(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            a, b = walk(node.left), walk(node.right)
            if b == 0 or a % b:
                raise ModelError(f"{where}: {expr!r}: {a} / {b} is not a whole number")
            return a // b
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = walk(node.left), walk(node.right)
            if b == 0 and isinstance(node.op, (ast.FloorDiv, ast.Mod)):
                raise ModelError(f"{where}: {expr!r} divides by zero")
            return _OPS[type(node.op)](a, b)
        raise ModelError(f"{where}: {expr!r}: only integers, size names, + - * / // % and "
                         "parentheses are allowed")

    return walk(tree)


def model_sizes(data: dict, file: str, given: dict[str, int]) -> dict[str, int]:
    """The file's `sizes` with `given` substituted (unknown names refused)."""
    raw = data.get("sizes", {}) or {}
    if not isinstance(raw, dict):
        raise ModelError(f"{file}: sizes: expected a mapping of names to integers")
    unknown = sorted(set(given) - set(raw))
    if unknown:
        raise ModelError(f"{file}: sizes: the model has no size {unknown[0]!r}; its sizes: "
                         f"{sorted(raw)}")
    names: dict[str, int] = {}
    for key, expr in raw.items():
        where = f"{file}: sizes.{key}"
        value = given[key] if key in given else evaluate(expr, names, where)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelError(f"{where}: must be a positive integer, got {value!r}")
        names[key] = value
    return names


def _layer(entry, i: int, file: str, names: dict[str, int]) -> Layer:
    where = f"{file}: layers[{i}]"
    if not isinstance(entry, dict):
        raise ModelError(f"{where}: expected a mapping with name, kind and sizes")
    for key in ("name", "kind"):
        if not isinstance(entry.get(key), str):
            raise ModelError(f"{where}.{key}: required, a string")
    try:
        kind = LayerKind(entry["kind"])
    except ValueError:
        raise ModelError(f"{where}.kind: {entry['kind']!r} is not one of "
                         f"{[str(k) for k in LayerKind]}") from None
    inputs = entry.get("inputs", [MODEL_INPUT])
    if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
        raise ModelError(f"{where}.inputs: expected a list of layer names")
    sizes = tuple((k, evaluate(v, names, f"{where}.{k}")) for k, v in entry.items()
                  if k not in _LAYER_KEYS)
    return Layer(entry["name"], kind, sizes, tuple(inputs), str(entry.get("op", "")),
                 source=f"{where} ({entry['name']})")


def load_model(path: str | Path, **sizes: int) -> Model:
    """A verified `Model` from a model file; `sizes` (e.g. seq=8) replace the file's."""
    file = str(path)
    data = read_yaml(Path(path), _file_error, "the model file")
    if not isinstance(data, dict):
        raise ModelError(f"{file}: expected a mapping with name, sizes and layers")
    unknown = sorted(set(data) - {"name", "sizes", "layers", "notes"})
    if unknown:
        raise ModelError(f"{file}: {unknown[0]}: unknown key; a model file has name, sizes, "
                         "layers and notes")
    names = model_sizes(data, file, sizes)
    layers = data.get("layers")
    if not isinstance(layers, list) or not layers:
        raise ModelError(f"{file}: layers: required, a non-empty list")
    notes = data.get("notes", []) or []
    model = Model(str(data.get("name", Path(path).stem)),
                  tuple(_layer(e, i, file, names) for i, e in enumerate(layers)),
                  source=file, notes=tuple(str(n) for n in notes)
                  + (f"sizes: {', '.join(f'{k}={v}' for k, v in names.items())}",))
    return model.verify()
