"""Evaluate one design point: simulate it and reduce the `SimResult` to the metrics a sweep keeps.

Runs in worker processes (or Dask workers), so it takes and returns plain data only. A point that
cannot be built or mapped (ArchError, MappingError, ...) comes back as a *failed* record carrying
the message; it is stored like any other result and never stops the sweep.

A point's workload may also be a whole model (a model file, `models/*.yaml`, or a SCALE-Sim
topology file): `model_workload` describes it as a `Workload` whose parameters are the file's
sizes and the model options, and the point runs through `dataflow.models.simulate`; its metrics
are the model's totals (the layers' sums; utilisations over the model's cycles).
"""

from __future__ import annotations

import functools
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any

from dataflow.api import simulate
from dataflow.arch import arch_from_dict
from dataflow.arch.load import read_yaml
from dataflow.attention.patterns import PATTERNS
from dataflow.errors import USER_ERRORS, UserError
from dataflow.models import Model, ModelError, ModelResult, load_model
from dataflow.models import simulate as simulate_model
from dataflow.models.files import model_sizes
from dataflow.models.topology import read_topology
from dataflow.pe_array.simulate import area_breakdown
from dataflow.workloads import Param, Workload, all_params

#: the workload keys of a sweep file naming a whole model, and what reads each
MODEL_SOURCES = ("model", "topology")
#: what a model workload takes besides its file's sizes
MODEL_PARAMS = (
    Param("attention_pattern", str, None, "the pattern of every attention layer (default: "
          "each layer's own)", choices=(None, *PATTERNS, "causal")),
    all_params()["dataflow"],
)

#: Metrics stored per point, with units. All are minimised on Pareto fronts except MAXIMISED.
METRICS: dict[str, str] = {
    "cycles": "array clock cycles",
    "time_s": "seconds at the architecture's clock",
    "energy_pj": "total energy (SimResult.energy_total_pj), pJ",
    "area_mm2": "chip area from the ArchSpec area table, mm²",
    "edp_pj_s": "energy-delay product, pJ·s",
    "pe_utilization": "ops issued over PE-cycles x pe_array.issue_width",
    "mac_utilization": "useful MACs over peak MACs in the elapsed cycles",
    "dram_bytes": "DRAM bytes read + written",
    "max_abs_error": "largest |engine - numpy reference|",
    "wall_s": "simulation wall time, s",
}
MAXIMISED = frozenset({"pe_utilization", "mac_utilization"})
ALIASES = {"latency": "cycles", "time": "time_s", "energy": "energy_pj", "area": "area_mm2",
           "edp": "edp_pj_s", "utilization": "pe_utilization", "utilisation": "pe_utilization"}


def metric_name(name: str) -> str:
    """Canonical metric name for `name` or an alias (`energy` -> `energy_pj`)."""
    name = ALIASES.get(name, name)
    if name not in METRICS:
        raise UserError(f"unknown metric {name!r}")
    return name


def area_breakdown_mm2(arch: dict) -> dict[str, float]:
    """Area per component (mm²) of an architecture given as `arch_to_dict` plain data: the one
    area model of the project, `pe_array.simulate.area_breakdown` (the same numbers a
    `SimResult.area_mm2` carries)."""

    return area_breakdown(arch_from_dict(arch, source="<area>"))


def file_sizes(source: str, file: str | Path) -> dict[str, int]:
    """The size names of a model file with their values ({} for a topology file)."""
    if source == "topology":
        return {}
    data = read_yaml(Path(file), lambda f, k, m: ModelError(f"{f}: {k}: {m}" if k else
                                                             f"{f}: {m}"), "the model file")
    if not isinstance(data, dict):
        raise ModelError(f"{file}: expected a mapping with name, sizes and layers")
    return model_sizes(data, str(file), {})


def load_model_workload(source: str, file: str | Path, sizes: dict[str, Any]) -> Model:
    """The `Model` of a model workload: a model file with `sizes` (None: the file's own
    value), or a topology file (no sizes)."""
    given = {k: v for k, v in sizes.items() if v is not None}
    if source == "model":
        return load_model(file, **given)
    if source != "topology":
        raise UserError(f"a model workload is one of {MODEL_SOURCES}, got {source!r}")
    if given:
        raise UserError(f"{file}: a topology file has no sizes to set, got {sorted(given)}")
    return read_topology(file)


@functools.cache
def model_workload(name: str, source: str, file: str) -> Workload:
    """A model workload as the sweep sees a registered one: its parameters are the file's
    sizes (default None: the file's value, so sizes computed from others follow them) and
    `MODEL_PARAMS`. It has no `run`: `evaluate_point` simulates the model."""
    sizes = tuple(Param(k, int, None, f"model size {k} (file value {v})")
                  for k, v in file_sizes(source, file).items())
    return Workload(name, run=None, params=(*sizes, *MODEL_PARAMS),
                    help=f"the {source} file {file}")


def evaluate_point(payload: dict[str, Any]) -> dict[str, Any]:
    """Simulate `Point.payload()`; return the record the results store keeps (plain data)."""

    t0, cpu0 = time.perf_counter(), time.process_time()
    record: dict[str, Any] = {"point_id": payload["point_id"],
                              "worker": f"{socket.gethostname()}:{os.getpid()}"}
    try:
        spec = arch_from_dict(payload["arch"], source=f"point {payload['point_id']}")
        if "model_file" in payload:
            r = _simulate_model_point(payload, spec)
        else:
            r = simulate(payload["workload"], arch=spec, seed=payload["seed"],
                         engine=payload["engine"], **payload["params"])
    except Exception as exc:  # noqa: BLE001 -- a failed point is a result too (stored, with its message)
        record.update(status="failed", error=_message(exc), wall_s=time.perf_counter() - t0)
        return record
    if isinstance(r, ModelResult):
        record.update(_model_metrics(r, spec), wall_s=time.perf_counter() - t0)
        record["result"]["evaluation_cpu_s"] = time.process_time() - cpu0
        return record
    energy = r.energy_total_pj
    area = dict(r.area_mm2)
    record.update(
        status="ok", error=None,
        cycles=int(r.cycles), time_s=float(r.time_seconds), energy_pj=float(energy),
        area_mm2=float(sum(area.values())), edp_pj_s=float(energy * r.time_seconds),
        pe_utilization=float(r.pe_utilization), mac_utilization=float(r.mac_utilization),
        dram_bytes=int(r.dram_bytes),
        values_match=None if r.values_match_reference is None else bool(r.values_match_reference),
        max_abs_error=None if r.max_abs_error is None else float(r.max_abs_error),
        wall_s=time.perf_counter() - t0,
        result={**r.to_dict(), "area_mm2": area,
                "evaluation_cpu_s": time.process_time() - cpu0})
    return record


def _simulate_model_point(payload: dict[str, Any], spec) -> ModelResult:
    params = dict(payload["params"])
    options = {p.name: params.pop(p.name, None) for p in MODEL_PARAMS}
    model = load_model_workload(payload["model"]["source"], payload["model_file"], params)
    return simulate_model(model, arch=spec, engine=payload["engine"], seed=payload["seed"],
                          **options)


def _model_metrics(r: ModelResult, spec) -> dict[str, Any]:
    """The stored metrics of a model point: totals over its layers."""
    area = area_breakdown(spec)
    results = [lr.result for lr in r.layers]
    seconds = sum(x.time_seconds for x in results)
    busy = sum(float(x.pe_busy_cycles.sum()) for x in results)
    pes = results[0].pe_busy_cycles.size
    peak = results[0].peak_macs_per_cycle
    energy = r.energy_total_pj
    return dict(
        status="ok", error=None, cycles=int(r.cycles), time_s=float(seconds),
        energy_pj=float(energy), area_mm2=float(sum(area.values())),
        edp_pj_s=float(energy * seconds),
        pe_utilization=busy / (pes * results[0].issue_width * r.cycles) if r.cycles else 0.0,
        mac_utilization=r.macs / (peak * r.cycles) if r.cycles else 0.0,
        dram_bytes=int(r.dram_bytes),
        values_match=None if r.values_match_reference is None else bool(r.values_match_reference),
        max_abs_error=None if r.max_abs_error is None else float(r.max_abs_error),
        result={**r.to_dict(), "area_mm2": area})


def _message(exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, USER_ERRORS):  # a bug, not a bad point: say where it happened
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        text += f" (at {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name})"
    return text
