"""The workload registry behind `dataflow simulate --workload NAME` and `dataflow.simulate(NAME)`.

A workload module registers itself on import with `register(Workload(...))`; `WORKLOAD_MODULES`
lists the modules imported the first time the registry is read. A workload's `run` takes the
architecture, the engine name, the seed and its own declared parameters, and returns a
`SimResult` whose `values_match_reference` and `max_abs_error` are already filled in.

Parameters are declared once (`Param`); the CLI turns the union of all workloads' parameters
into flags (`--seq`, `--top-k`, ...) and passes a workload only the ones it declares, so a flag
given to a workload that does not take it is an error that names the flag.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dataflow.arch.limits import gib, memory_budget_bytes, shown
from dataflow.errors import UserError
from dataflow.testing import max_abs_error, values_match

#: Modules that register workloads when imported (each adds its own line).
WORKLOAD_MODULES: tuple[str, ...] = (
    "dataflow.matmul_workloads",
    "dataflow.attention.api",
    "dataflow.dynamic.workloads",
    "dataflow.moe",
    "dataflow.butterfly.workloads",
)


@dataclass(frozen=True)
class Param:
    name: str  # python name; the CLI flag is --name with "_" -> "-"
    type: Callable[[str], Any]
    default: Any
    help: str
    choices: tuple | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def coerce(self, value: Any) -> Any:
        """`value` as this parameter's declared type: what the CLI would make of the same text
        (`"32"` -> 32), an integral float as an int (`32.0` -> 32); floats must be finite.
        Anything else raises a `UserError` naming the parameter. None (a default) stays."""
        if value is None:
            return None
        where = f"{self.flag} (parameter {self.name!r})"
        if self.type is int:
            if isinstance(value, bool):
                raise UserError(f"{where} must be an integer, got {value!r}")
            if isinstance(value, float) and value.is_integer():
                return int(value)
            try:
                if isinstance(value, (int, str)) or hasattr(value, "__index__"):
                    return int(value)
            except ValueError:
                pass
            raise UserError(f"{where} must be an integer, got {shown(value)}")
        if self.type is float:
            try:
                out = float(value) if not isinstance(value, bool) else None
            except (TypeError, ValueError):
                out = None
            if out is None:
                raise UserError(f"{where} must be a number, got {shown(value)}")
            if not math.isfinite(out):
                raise UserError(f"{where} must be a finite number, got {shown(value)}")
            return out
        if self.type is str and not isinstance(value, str):
            raise UserError(f"{where} must be a string, got {shown(value)}")
        return value


@dataclass(frozen=True)
class Workload:
    name: str
    run: Callable[..., Any]  # run(spec, *, engine, seed, **params) -> SimResult
    params: tuple[Param, ...] = field(default=())
    help: str = ""

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """Declared parameters with defaults filled in; unknown names raise ValueError."""
        known = {p.name: p for p in self.params}
        unknown = sorted(set(given) - set(known))
        if unknown:
            flags = ", ".join("--" + u.replace("_", "-") for u in unknown)
            raise UserError(f"workload {self.name!r} does not take {flags}; it takes "
                             + (", ".join(p.flag for p in self.params) or "no parameters"))
        out = {}
        for p in self.params:
            v = p.coerce(given.get(p.name, p.default))
            if p.choices is not None and v not in p.choices:
                raise UserError(f"{p.flag} must be one of {p.choices}, got {v!r}")
            out[p.name] = v
        return out


_REGISTRY: dict[str, Workload] = {}
_loaded = False


def register(w: Workload) -> Workload:
    _REGISTRY[w.name] = w
    return w


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in WORKLOAD_MODULES:
        importlib.import_module(mod)


def workloads() -> dict[str, Workload]:
    _load()
    return dict(_REGISTRY)


def get(name: str) -> Workload:
    reg = workloads()
    if name not in reg:
        raise UserError(f"unknown workload {name!r}; choose one of {sorted(reg)}")
    return reg[name]


def all_params() -> dict[str, Param]:
    """Union of every workload's parameters by name (first declaration gives the flag's type)."""
    out: dict[str, Param] = {}
    for w in workloads().values():
        for p in w.params:
            out.setdefault(p.name, p)
    return out


def host_budget() -> float:
    """The bytes `check_host_memory` allows (infinite when the host's memory is unknown)."""
    return float(memory_budget_bytes() or math.inf)


def fits_host_memory(nbytes: float) -> bool:
    """Whether `nbytes` fit the host's memory budget (`check_host_memory` without the error)."""
    return nbytes <= host_budget()


def check_host_memory(what: str, nbytes: float) -> None:
    """Refuse, before allocating, operands and results of `nbytes` bytes that would not fit the
    host's memory budget (`dataflow.limits.memory_budget_bytes`); a `UserError` naming both."""
    budget = memory_budget_bytes()
    if budget and nbytes > budget:
        raise UserError(f"{what} need {gib(nbytes)} of host memory; the limit is {gib(budget)} "
                        "(a quarter of the memory available on this machine): use smaller sizes")


def dense_bytes(*shapes: tuple[int, ...], itemsize: int = 4) -> int:
    """Bytes of dense arrays of these shapes (fp32 unless `itemsize` says otherwise)."""
    return sum(math.prod(int(d) for d in s) for s in shapes) * itemsize


def finish(res, reference, t0: float, mapping=None):
    """Fill a `SimResult`'s value check and wall time (the helper every workload's run uses)."""
    return dataclasses.replace(
        res, values_match_reference=values_match(res.output, reference),
        max_abs_error=max_abs_error(res.output, reference),
        wall_seconds=time.perf_counter() - t0,
        mapping_summary=mapping.summary() if mapping is not None else res.mapping_summary)
