"""YAML → `ArchSpec`: schema (keys and types) → semantic checks → objects.

Every error is one `ArchError` naming the file and the key path (`pe_array.spm.lines`), never a
traceback from deep inside and never print-and-continue.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from dataflow.arch.errors import ArchError
from dataflow.arch.limits import MAX_YAML_NODES, cut, shown
from dataflow.arch.spec import ArchSpec
from dataflow.arch.validate import validate_arch

#: libyaml's parser where PyYAML was built with it (the wheels are): the same documents and
#: values as the pure-Python `SafeLoader`, about 8x faster on an architecture file (start-up,
#: issue 14)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _build(cls: type, data: Any, source: str, path: str) -> Any:
    """Build dataclass `cls` from plain data, checking keys and types recursively."""
    if not isinstance(data, dict):
        raise ArchError(source, path,
                        f"expected a mapping for {cls.__name__}, got {type(data).__name__}")
    hints, fields = _schema(cls)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = unknown[0]
        raise ArchError(
            source, _join(path, cut(key)),
            f"unknown key {shown(key)}; allowed keys here: {', '.join(sorted(fields))}",
        )
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ArchError(source, _join(path, name), "required key is missing")
            continue
        kwargs[name] = _convert(hints[name], data[name], source, _join(path, name))
    return cls(**kwargs)


@functools.cache
def _schema(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    """A spec dataclass's field types and fields (but `source`), resolved once a process:
    `typing.get_type_hints` is most of the cost of building a spec, which a sweep does per
    point (issue 14)."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    return typing.get_type_hints(cls), fields


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _convert(tp: Any, value: Any, source: str, path: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, source, path)
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ArchError(source, path, f"expected a list, got {type(value).__name__}")
        return tuple(_convert(item_tp, v, source, f"{path}[{i}]") for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"unsupported union type at {path}")  # not used in ArchSpec
    if isinstance(tp, type) and issubclass(tp, Enum):
        allowed = tuple(member.value for member in tp)
        if not isinstance(value, str) or value not in allowed:
            raise ArchError(source, path, f"must be one of {allowed}, got {shown(value)}")
        return tp(value)
    return _scalar(tp, value, source, path)


def _scalar(tp: Any, value: Any, source: str, path: str) -> Any:
    """A bool, int, float (finite) or str field's value, checked."""
    if tp is bool:
        if not isinstance(value, bool):
            raise ArchError(source, path, f"expected true/false, got {shown(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArchError(source, path, f"expected an integer, got {shown(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ArchError(source, path, f"expected a number, got {shown(value)}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ArchError(source, path, f"must be a finite number, got {shown(value)}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ArchError(source, path, f"expected a string, got {shown(value)}")
        return value
    raise TypeError(f"unsupported field type {tp!r} at {path}")


def arch_from_dict(data: dict, source: str = "<dict>") -> ArchSpec:
    """Build and validate an `ArchSpec` from plain data (as read from YAML)."""
    spec = _build(ArchSpec, data, source, "")
    spec = dataclasses.replace(spec, source=source)
    validate_arch(spec)
    return spec


def load_arch(path: str | Path) -> ArchSpec:
    """Load an architecture YAML file (the presets: `dataflow/arch/presets/*.yaml`) into a
    validated `ArchSpec`; `resolve_arch` also takes preset names.

    Raises `ArchError` naming the file and the key path for unknown keys, wrong types and
    impossible values.
    """
    path = Path(path)
    return arch_from_dict(read_yaml(path, ArchError, "architecture file"), source=str(path))


def read_yaml(path: Path, error: type, what: str):
    """The data of a YAML file; an unreadable, undecodable, malformed or empty file, a key given
    twice in one mapping, or aliases expanding past `MAX_YAML_NODES` nodes raise
    `error(file, key_path, message)` (ArchError and the sweep and GPU spec errors share this
    form)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(str(path), "", f"cannot read {what}: not UTF-8 text (byte "
                    f"0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    except OSError as exc:
        raise error(str(path), "", f"cannot read {what} ({exc.strerror})") from None
    loader = SAFE_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise error(str(path), "", "file is empty")
        _check_nodes(node, str(path), error)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise error(str(path), "", f"not valid YAML: {cut(str(exc), 300)}") from None
    except RecursionError:
        raise error(str(path), "", "not valid YAML: nested too deeply") from None
    finally:
        loader.dispose()


def _check_nodes(root: yaml.Node, source: str, error: type) -> None:
    """Refuse a key given twice in one mapping (YAML would keep the last silently) and a
    document whose aliases expand to more than `MAX_YAML_NODES` nodes (an alias bomb), without
    expanding anything: each node is visited once, its expanded size memoised."""
    size: dict[int, int] = {}

    def visit(node: yaml.Node, path: str) -> int:
        if id(node) in size:
            return size[id(node)]
        size[id(node)] = 1  # a cycle (an alias inside its own anchor) counts once
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, int] = {}
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                here = _join(path, cut(key) if isinstance(key, str) else "?")
                if key is not None and key != "<<":
                    if key in seen:
                        raise error(source, here, f"key given twice (lines {seen[key]} and "
                                    f"{key_node.start_mark.line + 1}); YAML would keep only "
                                    "the last")
                    seen[key] = key_node.start_mark.line + 1
                total += visit(key_node, here) + visit(value_node, here)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                total += visit(item, f"{path}[{i}]")
        size[id(node)] = total
        if total > MAX_YAML_NODES:
            raise error(source, path, f"aliases expand to more than {MAX_YAML_NODES:,} values; "
                        "this file is refused (an alias bomb?)")
        return total

    visit(root, "")


def arch_to_dict(spec: ArchSpec) -> dict:
    """Plain data for reports and caches (round-trips through `arch_from_dict`)."""
    data = dataclasses.asdict(spec)
    data.pop("source", None)
    return _lists(data)


def _lists(x: Any) -> Any:
    """Tuples as lists and enum members as their YAML words: plain data, as YAML gives it."""
    if isinstance(x, Enum):
        return x.value
    if isinstance(x, dict):
        return {k: _lists(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_lists(v) for v in x]
    return x
