"""Sweep files (YAML) → a validated `Sweep`: architecture overrides × workloads × mapping options.

A sweep file::

    name: tiny                       # optional; defaults to the file's stem
    arch:
      base: default                  # a preset (default, mlx_4x4) or a path relative to this file
      sweep:                         # ArchSpec key path -> values; the cartesian product is swept
        pe_array.rows: [4, 8]
        spm.lines: {start: 4, stop: 16, scale: log2}      # 4, 8, 16
        dram.bytes_per_cycle: {start: 12.8, stop: 51.2, step: 12.8}
      zip:                           # groups of keys that move together (lists of equal length)
        - {pe_array.rows: [4, 8], pe_array.cols: [4, 8]}
      set: {dram.latency_cycles: 50}  # one value for every point
      skip_impossible: false         # true: drop combinations validate_arch rejects
    workloads:                       # any registered workload (dataflow.workloads), its own params
      - {name: gemm, params: {m: 32, k: [32, 64], n: 32}}
      # a whole model: a model file (its sizes as params) or a SCALE-Sim topology file, both
      # relative to this file; params also take attention_pattern and dataflow
      - {model: ../models/bert_base_layer.yaml, params: {seq: [64, 128]}}
      - {topology: resnet18.csv}
    mapping:                         # engine, seed, and workload params that choose a mapping
      engine: fast                   # (e.g. `dataflow: [os, ws]`), passed to workloads taking them
      seed: 0
    search: {objectives: [cycles, energy_pj, area_mm2], population: 8, seed: 0}

Values: a scalar, a list, or a range `{start, stop, step}` (stop included when reached) or
`{start, stop, scale: log2}` (start, 2·start, 4·start, ... up to stop). Key paths follow
`arch_to_dict`: `pe_array.functional_units[2].latency_cycles`. Every error is one `SweepError`
naming the sweep file and the key path in it.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataflow.arch import (
    ArchError,
    arch_from_dict,
    arch_to_dict,
    load_arch,
    preset_names,
    resolve_arch,
)
from dataflow.arch.load import read_yaml
from dataflow.dse.evaluate import (
    METRICS,
    MODEL_SOURCES,
    file_sizes,
    metric_name,
    model_workload,
)
from dataflow.errors import KeyPathError, UserError
from dataflow.pe_array.simulate import ENGINES
from dataflow.workloads import Workload, get

MAX_GRID_POINTS = 2_000_000


class SweepError(KeyPathError):
    """A bad sweep file: `source` is the file, `key_path` the place in it."""


@dataclass(frozen=True)
class Dimension:
    """One swept axis. `keys` has one ArchSpec key path, or several for a zip group;
    `values[i]` is a tuple with one value per key. `where` is its key path in the sweep file."""

    where: str
    keys: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class WorkloadGrid:
    """A workload and its parameter values. A model workload has `source` "model" or
    "topology" and `file` (the resolved path); its name is "model:<path as written>"."""

    name: str
    where: str
    params: tuple[tuple[str, tuple[Any, ...]], ...]  # param -> values (given ones only)
    source: str = ""
    file: str = ""

    def workload(self) -> Workload:
        """The registered workload, or the model workload the grid names."""
        if self.source:
            return model_workload(self.name, self.source, self.file)
        return get(self.name)

    def instances(self) -> Iterator[dict[str, Any]]:
        names = [k for k, _ in self.params]
        for combo in itertools.product(*(v for _, v in self.params)):
            yield dict(zip(names, combo))


@dataclass(frozen=True)
class SearchOptions:
    objectives: tuple[str, ...] = ("cycles", "energy_pj", "area_mm2")
    population: int = 16
    seed: int = 0


@dataclass(frozen=True)
class Sweep:
    """A validated sweep. `base_arch` is `arch_to_dict` of the base architecture."""

    name: str
    source: str
    base_arch: dict
    set_overrides: tuple[tuple[str, Any], ...]
    dimensions: tuple[Dimension, ...]
    skip_impossible: bool
    workloads: tuple[WorkloadGrid, ...]
    engines: tuple[str, ...]
    seeds: tuple[int, ...]
    mapping_options: tuple[tuple[str, tuple[Any, ...]], ...]
    search: SearchOptions

    @property
    def grid_size(self) -> int:
        """Points in the full grid before impossible architectures and duplicates are dropped."""
        n = math.prod(len(d.values) for d in self.dimensions)
        n *= sum(math.prod(len(v) for _, v in w.params) for w in self.workloads)
        n *= len(self.engines) * len(self.seeds)
        return n * math.prod(len(v) for _, v in self.mapping_options)

    def workload(self, name: str) -> Workload:
        """The workload named `name` in this sweep (a model workload by its grid)."""
        grid = next((g for g in self.workloads if g.name == name), None)
        return grid.workload() if grid is not None else get(name)

    def grid(self, name: str) -> WorkloadGrid | None:
        return next((g for g in self.workloads if g.name == name), None)

    def arch_for(self, overrides: dict[str, Any]) -> dict:
        """Plain data of the architecture with `set` and `overrides` applied (unvalidated)."""
        data = copy.deepcopy(self.base_arch)
        for key, value in (*self.set_overrides, *overrides.items()):
            set_path(data, key, value)
        return data


# ---------------------------------------------------------------- key paths over ArchSpec data

_SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$")


def _segments(key: str) -> list[str | int]:
    out: list[str | int] = []
    for part in key.split("."):
        m = _SEGMENT.match(part)
        if not m:
            raise KeyError(f"malformed key path segment {part!r}")
        out.append(m.group(1))
        out.extend(int(i) for i in re.findall(r"\[(\d+)\]", m.group(2)))
    return out


def get_path(data: Any, key: str) -> Any:
    """The value at dotted key path `key` in plain data; KeyError says where the path breaks."""
    node, done = data, ""
    for seg in _segments(key):
        if isinstance(seg, int):
            if not isinstance(node, list) or seg >= len(node):
                size = len(node) if isinstance(node, list) else 0
                raise KeyError(f"{done or '<top>'} has no element [{seg}] (it has {size})")
            node, done = node[seg], f"{done}[{seg}]"
        else:
            if not isinstance(node, dict) or seg not in node:
                allowed = ", ".join(sorted(node)) if isinstance(node, dict) else "none (a value)"
                raise KeyError(f"unknown ArchSpec key {seg!r} at {done or '<top>'}; "
                               f"allowed keys there: {allowed}")
            node, done = node[seg], f"{done}.{seg}" if done else seg
    return node


def set_path(data: Any, key: str, value: Any) -> None:
    segs = _segments(key)
    parent = data
    for seg in segs[:-1]:
        parent = parent[seg]
    parent[segs[-1]] = value


# ---------------------------------------------------------------- values and ranges

def expand_values(spec: Any, source: str, where: str, *, list_valued: bool = False) -> tuple:
    """A scalar, list or range spec → the tuple of values (non-empty, without repeats)."""
    if isinstance(spec, dict):
        values = _expand_range(spec, source, where)
    elif isinstance(spec, list):
        if list_valued and spec and not all(isinstance(v, list) for v in spec):
            raise SweepError(source, where, "this ArchSpec field is a list: give a list of lists "
                             f"(one list per value), e.g. [[], [2, 4]]; got {spec!r}")
        values = [tuple(v) if isinstance(v, list) else v for v in spec]
    else:
        if list_valued:
            raise SweepError(source, where, f"this ArchSpec field is a list: give a list of lists, "
                             f"got {spec!r}")
        values = [spec]
    if not values:
        raise SweepError(source, where, "no values (an empty list sweeps nothing)")
    seen = set()
    for v in values:
        if isinstance(v, (dict, set)):
            raise SweepError(source, where, f"a value must be a scalar or a list, got {v!r}")
        hv = (type(v) is float, v)
        if hv in seen:
            raise SweepError(source, where, f"value {v!r} is listed twice")
        seen.add(hv)
    return tuple(list(v) if isinstance(v, tuple) else v for v in values)


def _number(x: Any, source: str, where: str) -> float | int:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise SweepError(source, where, f"expected a number, got {x!r}")
    return x


def _expand_range(spec: dict, source: str, where: str) -> list:
    allowed = {"start", "stop", "step", "scale"}
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise SweepError(source, f"{where}.{unknown[0]}",
                         f"unknown range key; a range has {', '.join(sorted(allowed))}")
    for k in ("start", "stop"):
        if k not in spec:
            raise SweepError(source, f"{where}.{k}", "a range needs start and stop")
    start = _number(spec["start"], source, f"{where}.start")
    stop = _number(spec["stop"], source, f"{where}.stop")
    scale = spec.get("scale", "linear")
    if scale == "log2":
        if "step" in spec:
            raise SweepError(source, f"{where}.step", "a log2 range doubles; it takes no step")
        if start <= 0 or stop < start:
            raise SweepError(source, where, f"a log2 range needs 0 < start <= stop, got "
                             f"start={start}, stop={stop}")
        out, v = [], start
        while v <= stop * (1 + 1e-12):
            out.append(v)
            v = v * 2
        return out
    if scale != "linear":
        raise SweepError(source, f"{where}.scale", f"must be linear or log2, got {scale!r}")
    step = _number(spec.get("step", 1), source, f"{where}.step")
    if step == 0:
        raise SweepError(source, f"{where}.step", "step must not be 0")
    if (stop - start) * step < 0:
        raise SweepError(source, f"{where}.step", f"step {step} never gets from {start} to {stop}")
    count = math.floor((stop - start) / step * (1 + 1e-12)) + 1
    if count > MAX_GRID_POINTS:
        raise SweepError(source, where, f"{count} values; at most {MAX_GRID_POINTS}")
    if all(isinstance(x, int) for x in (start, stop, step)):
        return [start + i * step for i in range(count)]
    # floats: start + i*step, rounded so 0.1 steps give 0.3 and not 0.30000000000000004
    return [float(f"{start + i * step:.12g}") for i in range(count)]


# ---------------------------------------------------------------- loading

def _mapping(data: Any, source: str, where: str) -> dict:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SweepError(source, where, f"expected a mapping, got {type(data).__name__}")
    return data


def _check_keys(data: dict, allowed: set[str], source: str, where: str) -> None:
    unknown = sorted(set(data) - allowed, key=str)
    if unknown:
        key = unknown[0]
        raise SweepError(source, f"{where}.{key}" if where else str(key),
                         f"unknown key; allowed keys here: {', '.join(sorted(allowed))}")


def _resolve_base(base: Any, sweep_path: Path | None, source: str) -> dict:
    if base is None:
        return arch_to_dict(resolve_arch(None))
    if isinstance(base, dict):
        try:
            return arch_to_dict(arch_from_dict(base, source=f"{source}: arch.base"))
        except ArchError as exc:
            raise SweepError(source, f"arch.base.{exc.key_path}", _tail(exc)) from None
    if not isinstance(base, str):
        raise SweepError(source, "arch.base", f"expected a file name or a mapping, got {base!r}")
    candidates = []
    if sweep_path is not None:
        candidates.append(sweep_path.parent / base)
    candidates.append(Path(base))
    try:
        for c in candidates:
            if c.is_file():
                return arch_to_dict(load_arch(c))
        if base.removesuffix(".yaml") in preset_names():
            return arch_to_dict(resolve_arch(base))
    except ArchError as exc:
        raise SweepError(source, "arch.base", f"the base architecture is bad: {exc}") from None
    raise SweepError(source, "arch.base", f"no architecture file {base!r} (looked in "
                     + ", ".join(str(c) for c in candidates) + ") and no preset of that name "
                     "(presets: " + ", ".join(preset_names()) + ")")


def _arch_dimension(key: str, spec: Any, base: dict, source: str, where: str) -> tuple:
    try:
        current = get_path(base, key)
    except KeyError as exc:
        raise SweepError(source, where, exc.args[0]) from None
    if isinstance(current, dict):
        raise SweepError(source, where, f"{key} is a section ({', '.join(sorted(current))}); "
                         "sweep its keys one by one")
    values = expand_values(spec, source, where, list_valued=isinstance(current, list))
    for v in values:  # each value on its own must be acceptable (types, ranges)
        trial = copy.deepcopy(base)
        set_path(trial, key, v)
        try:
            arch_from_dict(trial, source=source)
        except ArchError as exc:
            if exc.key_path.split("[")[0] == key.split("[")[0] or exc.key_path.startswith(key):
                raise SweepError(source, where, f"value {v!r}: {_tail(exc)}") from None
            # only impossible together with the base: judged per combination later
    return values


def _tail(exc: ArchError) -> str:
    """An ArchError's message without its file and key path prefix."""
    text = str(exc)
    prefix = "".join(f"{p}: " for p in (exc.source, exc.key_path) if p)
    return text.removeprefix(prefix)


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep file; raises `SweepError` naming the file and key path."""

    path = Path(path)
    return sweep_from_dict(read_yaml(path, SweepError, "sweep file"), source=str(path), path=path)


def sweep_from_dict(data: Any, source: str = "<dict>", path: Path | None = None) -> Sweep:
    if not isinstance(data, dict):
        raise SweepError(source, "", f"expected a mapping at the top, got {type(data).__name__}")
    _check_keys(data, {"name", "arch", "workloads", "mapping", "search"}, source, "")
    name = data.get("name", path.stem if path else "sweep")
    if not isinstance(name, str) or not name:
        raise SweepError(source, "name", f"expected a non-empty string, got {name!r}")

    arch = _mapping(data.get("arch"), source, "arch")
    _check_keys(arch, {"base", "sweep", "zip", "set", "skip_impossible"}, source, "arch")
    base = _resolve_base(arch.get("base"), path, source)
    set_overrides = _set_overrides(arch, base, source)
    dims = _arch_dimensions(arch, base, set_overrides, source)
    skip = arch.get("skip_impossible", False)
    if not isinstance(skip, bool):
        raise SweepError(source, "arch.skip_impossible", f"expected true/false, got {skip!r}")

    grids = _workload_grids(data.get("workloads"), source, path)
    mapping = _mapping(data.get("mapping"), source, "mapping")
    engines, seeds = _engines_and_seeds(mapping, source)
    options = _mapping_options(mapping, grids, source)

    search = _mapping(data.get("search"), source, "search")
    _check_keys(search, {"objectives", "population", "seed"}, source, "search")
    objectives = search.get("objectives", list(SearchOptions.objectives))
    if not isinstance(objectives, list) or len(objectives) < 2:
        raise SweepError(source, "search.objectives", "give at least two metrics to minimise")
    try:
        objectives = tuple(metric_name(o) for o in objectives)
    except ValueError as exc:
        raise SweepError(source, "search.objectives", f"{exc}; metrics: {', '.join(METRICS)}") \
            from None
    population = search.get("population", SearchOptions.population)
    if isinstance(population, bool) or not isinstance(population, int) or population < 2:
        raise SweepError(source, "search.population",
                         f"expected an integer >= 2, got {population!r}")
    sseed = search.get("seed", 0)
    if isinstance(sseed, bool) or not isinstance(sseed, int):
        raise SweepError(source, "search.seed", f"expected an integer, got {sseed!r}")

    sweep = Sweep(name=name, source=source, base_arch=base, set_overrides=tuple(set_overrides),
                  dimensions=tuple(dims), skip_impossible=skip, workloads=tuple(grids),
                  engines=engines, seeds=seeds, mapping_options=tuple(options),
                  search=SearchOptions(objectives, population, sseed))
    return sweep


def _set_overrides(arch: dict, base: dict, source: str) -> list[tuple[str, Any]]:
    """`arch.set`: (key path, value) pairs, each value checked against the base."""
    set_overrides = []
    for key, value in _mapping(arch.get("set"), source, "arch.set").items():
        where = f"arch.set.{key}"
        current = _safe_get(base, str(key))
        if isinstance(value, dict) or (isinstance(value, list) and not isinstance(current, list)):
            raise SweepError(source, where, f"set takes one value, got {value!r} (sweep lists "
                             "and ranges under arch.sweep)")
        spec = [value] if isinstance(current, list) else value
        (v,) = _arch_dimension(str(key), spec, base, source, where)
        set_overrides.append((str(key), v))
    return set_overrides


def _arch_dimensions(arch: dict, base: dict, set_overrides: list, source: str) -> list[Dimension]:
    """`arch.sweep` (one dimension per key) then `arch.zip` (one per group), each value checked
    against the base with `arch.set` applied; no key swept twice or both set and swept."""
    base_with_set = copy.deepcopy(base)
    for key, value in set_overrides:
        set_path(base_with_set, key, value)
    dims: list[Dimension] = []
    seen_keys: dict[str, str] = {}  # key path -> where in the file it is swept
    for key, spec in _mapping(arch.get("sweep"), source, "arch.sweep").items():
        where = f"arch.sweep.{key}"
        _claim(seen_keys, str(key), where, source)
        values = _arch_dimension(str(key), spec, base_with_set, source, where)
        dims.append(Dimension(where, (str(key),), tuple((v,) for v in values)))
    zips = arch.get("zip") or []
    if not isinstance(zips, list):
        raise SweepError(source, "arch.zip", "expected a list of groups")
    for gi, group in enumerate(zips):
        dims.append(_zip_dimension(group, f"arch.zip[{gi}]", base_with_set, seen_keys, source))
    for key, _ in set_overrides:
        if key in seen_keys:
            raise SweepError(source, f"arch.set.{key}", f"{key} is also swept at {seen_keys[key]}")
    return dims


def _claim(seen_keys: dict[str, str], key: str, where: str, source: str) -> None:
    if key in seen_keys:
        raise SweepError(source, where, f"{key} is already swept at {seen_keys[key]}")
    seen_keys[key] = where


def _zip_dimension(group: Any, gwhere: str, base_with_set: dict, seen_keys: dict[str, str],
                   source: str) -> Dimension:
    group = _mapping(group, source, gwhere)
    if len(group) < 2:
        raise SweepError(source, gwhere, "a zip group needs at least two keys")
    cols = []
    for key, spec in group.items():
        where = f"{gwhere}.{key}"
        _claim(seen_keys, str(key), where, source)
        cols.append(_arch_dimension(str(key), spec, base_with_set, source, where))
    lengths = {len(c) for c in cols}
    if len(lengths) != 1:
        raise SweepError(source, gwhere, "keys of a zip group need the same number of values, "
                         f"got {dict(zip(group, map(len, cols)))}")
    return Dimension(gwhere, tuple(map(str, group)), tuple(zip(*cols)))


def _model_file(w: dict, source: str, where: str, path: Path | None) -> tuple[str, str, str]:
    """(source kind, written path, resolved path) of a model workload entry."""
    kinds = [k for k in MODEL_SOURCES if k in w]
    if len(kinds) + ("name" in w) != 1:
        raise SweepError(source, where, "a workload has exactly one of name, "
                         + ", ".join(MODEL_SOURCES))
    kind = kinds[0]
    at = f"{where}.{kind}"
    written = w[kind]
    if not isinstance(written, str) or not written:
        raise SweepError(source, at, f"expected a file path, got {written!r}")
    candidates = ([path.parent / written] if path is not None else []) + [Path(written)]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise SweepError(source, at, f"no {kind} file {written!r} (looked in "
                         + ", ".join(str(c) for c in candidates) + ")")
    try:
        file_sizes(kind, found)
    except UserError as exc:
        raise SweepError(source, at, str(exc)) from None
    return kind, written, str(found.resolve())


def _workload_grids(wls: Any, source: str, path: Path | None = None) -> list[WorkloadGrid]:
    """`workloads`: each a registered workload (looked up with the registry's `get`) or a model
    (`model:` or `topology:` a file), and its parameter values."""
    if not isinstance(wls, list) or not wls:
        raise SweepError(source, "workloads", "expected a non-empty list of {name, params}")
    grids = []
    for i, w in enumerate(wls):
        where = f"workloads[{i}]"
        w = {"name": w} if isinstance(w, str) else _mapping(w, source, where)
        _check_keys(w, {"name", "params", *MODEL_SOURCES}, source, where)
        kind = file = ""
        if "name" in w and not any(k in w for k in MODEL_SOURCES):
            try:
                workload = get(w.get("name"))
            except ValueError as exc:
                raise SweepError(source, f"{where}.name", str(exc)) from None
        else:
            kind, written, file = _model_file(w, source, where, path)
            workload = model_workload(f"{kind}:{written}", kind, file)
        declared = {p.name: p for p in workload.params}
        params = []
        for pname, spec in _mapping(w.get("params"), source, f"{where}.params").items():
            pwhere = f"{where}.params.{pname}"
            if pname not in declared:
                raise SweepError(source, pwhere, f"workload {workload.name!r} has no parameter "
                                 f"{pname!r}; it takes: " + (", ".join(declared) or "none"))
            values = expand_values(spec, source, pwhere)
            params.append((pname, tuple(_param_value(declared[pname], v, source, pwhere)
                                        for v in values)))
        grids.append(WorkloadGrid(workload.name, where, tuple(params), kind, file))
    return grids


def _engines_and_seeds(mapping: dict, source: str) -> tuple[tuple, tuple]:
    engines = expand_values(mapping.get("engine", "fast"), source, "mapping.engine")
    for e in engines:
        if e not in ENGINES:
            raise SweepError(source, "mapping.engine", f"must be one of {ENGINES}, got {e!r}")
    seeds = expand_values(mapping.get("seed", 0), source, "mapping.seed")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int):
            raise SweepError(source, "mapping.seed", f"expected an integer, got {s!r}")
    return engines, seeds


def _mapping_options(mapping: dict, grids: list[WorkloadGrid], source: str) -> list:
    """`mapping` keys other than engine and seed: parameters of the swept workloads (looked up
    with the registry's `get`), given here for every workload that takes them."""
    options = []
    for key, spec in mapping.items():
        if key in ("engine", "seed"):
            continue
        where = f"mapping.{key}"
        takers = [g.workload() for g in grids
                  if any(p.name == key for p in g.workload().params)]
        if not takers:
            raise SweepError(source, where, f"no workload in this sweep takes {key!r} (mapping "
                             "options are engine, seed, and parameters of the workloads swept)")
        prm = next(p for p in takers[0].params if p.name == key)
        for g in grids:
            if key in dict(g.params):
                raise SweepError(source, where, f"{key} is also given at {g.where}.params")
        options.append((key, tuple(_param_value(prm, v, source, where)
                                   for v in expand_values(spec, source, where))))
    return options


def _safe_get(data: dict, key: str) -> Any:
    try:
        return get_path(data, key)
    except KeyError:
        return None


def _param_value(prm, v: Any, source: str, where: str) -> Any:
    """`v` converted to the parameter's type without losing anything (3.5 is no int)."""
    if v is None and prm.default is None:
        converted = None
    elif prm.type in (int, float) and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise SweepError(source, where, f"expected a number for {prm.name!r}, got {v!r}")
    else:
        try:
            converted = prm.type(v)
        except (TypeError, ValueError) as exc:
            raise SweepError(source, where, f"{v!r} is not a valid {prm.name!r}: {exc}") from None
        if prm.type is not str and converted != v:
            raise SweepError(source, where, f"{v!r} is not a valid {prm.name!r} "
                             f"({getattr(prm.type, '__name__', prm.type)} expected)")
    if prm.type is int and prm.choices is None and converted is not None and converted < 0:
        # every integer parameter of a workload is a size or a count: refused here, before
        # any point runs, rather than stored as one failed point per combination
        raise SweepError(source, where, f"{prm.name} must be >= 0, got {v!r}")
    if prm.choices is not None and converted not in prm.choices:
        raise SweepError(source, where, f"{prm.name} must be one of {prm.choices}, got {v!r}")
    return converted
