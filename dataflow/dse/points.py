"""Design points: one architecture × one workload instance × one mapping choice, with a stable id.

A point's id is the first 16 hex digits of the SHA-256 of its canonical JSON (sorted keys, no
spaces): the *whole* architecture as plain data (not only the swept keys, so editing the base file
makes new points), the workload's name and all its parameters with defaults filled in, the engine
and the seed. The same design reached from two sweep files has one id, so results are shared.
A model workload's id also holds its layers (kind, sizes, inputs, op), not its file's path: the
same model from two places is one design, and editing the file makes new points.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any

from dataflow.arch import ArchError, arch_from_dict, arch_to_dict
from dataflow.dse.evaluate import MODEL_PARAMS, load_model_workload
from dataflow.dse.sweep import MAX_GRID_POINTS, Sweep, SweepError, _tail, get_path
from dataflow.errors import UserError
from dataflow.models import Model


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True, eq=False)
class Point:
    """One design point. `params` are the workload's own parameters (defaults filled), `options`
    the mapping options from the sweep's `mapping` section (also workload parameters)."""

    sweep: str
    arch: dict  # arch_to_dict of the validated architecture
    arch_overrides: tuple[tuple[str, Any], ...]
    workload: str
    params: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...]
    engine: str
    seed: int
    model: str = ""  # a model workload: canonical JSON of its source kind and layers
    model_file: str = ""  # ... and the file it is read from

    def canonical(self) -> dict:
        out = {"arch": self.arch, "workload": self.workload,
               "params": {**dict(self.params), **dict(self.options)},
               "engine": self.engine, "seed": self.seed}
        if self.model:  # the model, not the path it was read from (the workload's name)
            model = json.loads(self.model)
            out.update(workload=model["source"], model=model)
        return out

    @functools.cached_property
    def point_id(self) -> str:
        return hashlib.sha256(canonical_json(self.canonical()).encode()).hexdigest()[:16]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and other.point_id == self.point_id

    def __hash__(self) -> int:
        return hash(self.point_id)

    def payload(self) -> dict:
        """What a worker needs to evaluate the point (plain data, cheap to pickle)."""
        out = {"point_id": self.point_id, **self.canonical()}
        if self.model_file:
            out["model_file"] = self.model_file
        return out

    def describe(self) -> dict:
        """Stored next to the results: what was swept, readable without the sweep file."""
        return {"sweep": self.sweep, "workload": self.workload, "params": dict(self.params),
                "mapping": {"engine": self.engine, "seed": self.seed, **dict(self.options)},
                "arch_overrides": dict(self.arch_overrides), "arch": self.arch,
                **({"model_file": self.model_file} if self.model_file else {})}

    def group(self) -> str:
        """The workload instance: points of one group are comparable on a Pareto front."""
        return _group(self.workload, self.params)


def _group(workload: str, params) -> str:
    # parameters left at None are the workload's own choice: not worth a place in the name
    return f"{workload}({', '.join(f'{k}={v}' for k, v in params if v is not None)})"


def instance_group(sweep: Sweep, workload: str, instance: dict) -> str:
    """`Point.group()` of every point of this workload instance, without building one."""

    w = sweep.workload(workload)
    opts = {k for k, _ in sweep.mapping_options} & {p.name for p in w.params}
    return _group(workload, [(k, v) for k, v in w.resolve(instance).items() if k not in opts])


def make_point(sweep: Sweep, overrides: dict[str, Any], workload: str, instance: dict,
               engine: str, seed: int, options: dict[str, Any], arch: dict | None = None) -> Point:
    """Build one point; raises `ArchError` when the architecture is impossible. `arch`, when
    given, is `checked_arch(sweep, overrides)` already computed."""

    arch = checked_arch(sweep, overrides) if arch is None else arch
    w = sweep.workload(workload)
    declared = {p.name for p in w.params}
    opts = {k: v for k, v in options.items() if k in declared}
    resolved = w.resolve({**instance, **opts})
    params = tuple((k, v) for k, v in resolved.items() if k not in opts)
    grid = sweep.grid(workload)
    model = file = ""
    if grid is not None and grid.source:
        sizes = {k: v for k, v in resolved.items() if k not in {p.name for p in MODEL_PARAMS}}
        try:
            layers = load_model_workload(grid.source, grid.file, sizes)
        except UserError as exc:
            raise SweepError(sweep.source, f"{grid.where}.params", str(exc)) from None
        model = canonical_json({"source": grid.source, "name": layers.name,
                                "layers": _layers(layers)})
        file = grid.file
    return Point(sweep.name, arch, tuple(overrides.items()), workload, params,
                 tuple(sorted(opts.items())), engine, seed, model, file)


def _layers(model: Model) -> list[dict]:
    """What a model's results depend on: each layer's kind, sizes, inputs and op."""
    return [{"name": la.name, "kind": str(la.kind), "sizes": dict(la.sizes),
             "inputs": list(la.inputs), "op": la.op} for la in model.layers]


def checked_arch(sweep: Sweep, overrides: dict[str, Any]) -> dict:
    """The validated architecture as plain data with normalised types (raises `ArchError`)."""
    return arch_to_dict(arch_from_dict(sweep.arch_for(overrides), source=sweep.source))


def arch_combinations(sweep: Sweep):
    """Every combination of the swept architecture values, as {key path: value}."""
    for combo in itertools.product(*(d.values for d in sweep.dimensions)):
        overrides: dict[str, Any] = {}
        for dim, values in zip(sweep.dimensions, combo):
            overrides.update(zip(dim.keys, values))
        yield overrides


def mapping_combinations(sweep: Sweep):
    keys = [k for k, _ in sweep.mapping_options]
    for engine, seed, *vals in itertools.product(sweep.engines, sweep.seeds,
                                                 *(v for _, v in sweep.mapping_options)):
        yield engine, seed, dict(zip(keys, vals))


@dataclass(frozen=True)
class Grid:
    points: tuple[Point, ...]
    impossible_archs: int  # combinations dropped (arch.skip_impossible)
    duplicates: int  # combinations that named a point already in the grid


def _culprit(sweep: Sweep, overrides: dict[str, Any], exc: ArchError) -> str | None:
    """The swept key to blame for an impossible combination: the one the error names, else
    the first whose base value makes the combination possible again."""
    for k in overrides:
        if exc.key_path.split("[")[0] == k.split("[")[0]:
            return k
    base = sweep.arch_for({})

    for k in overrides:
        try:
            checked_arch(sweep, {**overrides, k: get_path(base, k)})
            return k
        except ArchError:
            continue
    return None


def grid_points(sweep: Sweep) -> Grid:
    """All points of the sweep's grid, in a stable order, without repeats.

    An impossible architecture combination is a `SweepError` naming the sweep file and the
    swept key, unless the sweep sets `arch.skip_impossible`.
    """

    if sweep.grid_size > MAX_GRID_POINTS:
        raise SweepError(sweep.source, "arch.sweep", f"{sweep.grid_size} points is more than "
                         f"{MAX_GRID_POINTS}; use --search optuna for spaces this large")
    out: dict[str, Point] = {}
    impossible = duplicates = 0
    where_of = {k: d.where for d in sweep.dimensions for k in d.keys}
    for overrides in arch_combinations(sweep):
        try:
            arch = checked_arch(sweep, overrides)
        except ArchError as exc:
            if sweep.skip_impossible:
                impossible += 1
                continue
            key = _culprit(sweep, overrides, exc)
            raise SweepError(
                sweep.source, where_of.get(key, "arch.sweep"),
                f"the combination {overrides} is impossible: {exc.key_path}: {_tail(exc)} "
                "(set arch.skip_impossible: true to drop such combinations)") from None
        for wg in sweep.workloads:
            for inst in wg.instances():
                for engine, seed, opts in mapping_combinations(sweep):
                    p = make_point(sweep, overrides, wg.name, inst, engine, seed, opts, arch)
                    if p.point_id in out:
                        duplicates += 1
                    else:
                        out[p.point_id] = p
    return Grid(tuple(out.values()), impossible, duplicates)
