"""Evaluate one design point: simulate it and reduce the `SimResult` to the metrics a sweep keeps.

Runs in worker processes (or Dask workers), so it takes and returns plain data only. A point that
cannot be built or mapped (ArchError, MappingError, ...) comes back as a *failed* record carrying
the message; it is stored like any other result and never stops the sweep.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from typing import Any

from dataflow.api import simulate
from dataflow.arch import arch_from_dict
from dataflow.errors import USER_ERRORS, UserError
from dataflow.pe_array.simulate import area_breakdown

#: Metrics stored per point, with units. All are minimised on Pareto fronts except MAXIMISED.
METRICS: dict[str, str] = {
    "cycles": "array clock cycles",
    "time_s": "seconds at the architecture's clock",
    "energy_pj": "total energy (SimResult.energy_total_pj), pJ",
    "area_mm2": "chip area from the ArchSpec area table, mm²",
    "edp_pj_s": "energy-delay product, pJ·s",
    "pe_utilization": "fraction of PE-cycles that issued an op",
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


def evaluate_point(payload: dict[str, Any]) -> dict[str, Any]:
    """Simulate `Point.payload()`; return the record the results store keeps (plain data)."""

    t0, cpu0 = time.perf_counter(), time.process_time()
    record: dict[str, Any] = {"point_id": payload["point_id"],
                              "worker": f"{socket.gethostname()}:{os.getpid()}"}
    try:
        spec = arch_from_dict(payload["arch"], source=f"point {payload['point_id']}")
        r = simulate(payload["workload"], arch=spec, seed=payload["seed"],
                     engine=payload["engine"], **payload["params"])
    except Exception as exc:  # noqa: BLE001 -- a failed point is a result too (stored, with its message)
        record.update(status="failed", error=_message(exc), wall_s=time.perf_counter() - t0)
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


def _message(exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, USER_ERRORS):  # a bug, not a bad point: say where it happened
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        text += f" (at {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name})"
    return text
