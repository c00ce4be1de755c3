"""The saved-result files of `dataflow simulate --save FILE` and the per-cycle trace file.

Result file: one JSON object, `{"format": "dataflow-result/1", "result": SimResult.to_dict(),
"arrays": {...}, "schedule": [...], "tile_spans": [...], "roofline": {...}}` — plain data, so
any tool can read it. `dataflow report` also accepts the bare `to_dict()` object that
`dataflow simulate --json` prints, and draws what that holds.

Model result file (`dataflow simulate --model FILE --save R`): `{"format":
"dataflow-model-result/1", "model": ModelResult.to_dict() (each layer's row with its energy,
PE and MAC utilisation added), "arrays": {...} (per-PE busy cycles and per-line SPM counts
summed over the layers), "roofline": {...}}`. The bare `--model --json` object is accepted too.
Both kinds are checked by key path before anything is drawn.

Trace file: one row per op issued, from the reference engine (`cycle, pe_row, pe_col, op`), as
CSV (`.csv`) or JSON lines (`.jsonl`), chosen by the file's extension.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dataflow.errors import KeyPathError, UserError
from dataflow.pe_array.result import SimResult

if TYPE_CHECKING:  # saving one workload's result need not import the models package
    from dataflow.models import ModelResult

FORMAT = "dataflow-result/1"
MODEL_FORMAT = "dataflow-model-result/1"
SCHEDULE_COLUMNS = ("kernel", "copy", "node", "op", "pe_row", "pe_col", "time", "latency", "ii")
TRACE_COLUMNS = ("cycle", "pe_row", "pe_col", "op")


def result_data(res) -> dict:
    """Plain data of a `SimResult` for the result file (no output values)."""
    return {
        "format": FORMAT,
        "result": res.to_dict(),
        "arrays": {
            "pe_busy_cycles": res.pe_busy_cycles.tolist(),
            "spm_reads_per_line": res.spm_reads_per_line.tolist(),
            "spm_writes_per_line": res.spm_writes_per_line.tolist(),
            "spm_conflicts_per_line": res.spm_conflicts_per_line.tolist(),
        },
        "schedule": [dict(zip(SCHEDULE_COLUMNS, row)) for row in res.schedule],
        "tile_spans": [{"kernel": k, "tile": i, "start": s, "end": e}
                       for k, i, s, e in res.tile_spans],
        "roofline": {"peak_macs_per_cycle": res.peak_macs_per_cycle,
                     "dram_bytes_per_cycle": res.dram_bytes_per_cycle},
    }


def model_result_data(r: ModelResult) -> dict:
    """Plain data of a `ModelResult` for the model result file (no output values)."""
    model = r.to_dict()
    model["layers"] = [dict(lr.row(), energy_total_pj=lr.result.energy_total_pj,
                            pe_utilization=lr.result.pe_utilization,
                            mac_utilization=lr.result.mac_utilization,
                            time_seconds=lr.result.time_seconds) for lr in r.layers]
    results = [lr.result for lr in r.layers]
    first = results[0]

    def summed(name: str) -> list:
        return np.sum([getattr(x, name) for x in results], axis=0).tolist()

    return {
        "format": MODEL_FORMAT,
        "model": model,
        "arrays": {name: summed(name) for name in
                   ("pe_busy_cycles", "spm_reads_per_line", "spm_writes_per_line",
                    "spm_conflicts_per_line")},
        # every layer ran on the one architecture: its peaks are the first layer's
        "roofline": {"peak_macs_per_cycle": first.peak_macs_per_cycle,
                     "dram_bytes_per_cycle": first.dram_bytes_per_cycle,
                     "issue_width": first.issue_width},
    }


def _writable(path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        raise UserError(f"--save {path}: is a folder; name the result file to write, "
                        f"e.g. {path / 'result.json'}")
    if not path.parent.is_dir():
        raise UserError(f"--save {path}: folder {path.parent} does not exist")
    return path


def save_result(res, path: str | Path) -> Path:
    """Write the result file of `res` (a `SimResult`, or a `ModelResult`: the model result
    file) to `path` (a file; its folder must exist)."""
    path = _writable(path)
    data = result_data(res) if isinstance(res, SimResult) else model_result_data(res)
    path.write_text(json.dumps(data))
    return path


def load_result(path: str | Path) -> dict:
    """Read a result file (or a bare `--json` object), checked: every key the pictures read has
    the right type and range (`KeyPathError` names the file and the key path)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a folder, not a result file (written by "
                        "`dataflow simulate --save FILE`)")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such result file") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a JSON result file (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not a JSON result file ({exc.msg} at line "
                        f"{exc.lineno})") from None
    if not isinstance(data, dict):
        raise KeyPathError(str(path), "", f"expected a JSON object, got {_kind(data)}")
    if "format" not in data and "layers" in data:  # `dataflow simulate --model --json`
        data = {"format": MODEL_FORMAT, "model": data, "arrays": {}}
    elif "format" not in data:  # the bare object `dataflow simulate --json` prints
        data = {"format": FORMAT, "result": data, "arrays": {}, "schedule": [], "tile_spans": []}
    if data["format"] == MODEL_FORMAT:
        _check_model(data, _Checker(str(path)))
    else:
        _check(data, _Checker(str(path)))
    return data


class _Checker:
    """Type and range checks that name the file and the key path of what they reject."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, message: str):
        raise KeyPathError(self.source, where, message)

    def member(self, obj: dict, key: str, where: str, required: bool = True):
        at = f"{where}.{key}" if where else key
        if key not in obj:
            if required:
                self.fail(at, "required key is missing")
            return None, at
        return obj[key], at

    def typed(self, value, where: str, types: tuple[type, ...], name: str):
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            self.fail(where, f"expected {name}, got {_kind(value)}")
        return value

    def count(self, value, where: str, minimum: int = 0, integer: bool = True):
        """A number >= `minimum` (an int unless `integer` is False)."""
        types = (int,) if integer else (int, float)
        self.typed(value, where, types, "an integer" if integer else "a number")
        if not (math.isfinite(value) and value >= minimum):  # also NaN
            self.fail(where, f"must be a finite number >= {minimum}, got {value}")
        return value


_RESULT_STRINGS = ("workload", "arch")
_RESULT_COUNTS = ("cycles", "macs", "dram_bytes")
_SCHEDULE_MINIMA = {"copy": 0, "node": 0, "pe_row": 0, "pe_col": 0, "time": 0, "latency": 0,
                    "ii": 1}


def _check(data: dict, ck: _Checker) -> None:
    if data["format"] != FORMAT:
        ck.fail("format", f"expected {FORMAT!r} or {MODEL_FORMAT!r}, got {data['format']!r}")
    res, _ = ck.member(data, "result", "")
    _check_totals(ck, res, "result", _RESULT_STRINGS)
    for key in ("spm_reads_per_line", "spm_writes_per_line"):
        _check_counts(ck, *ck.member(res, key, "result", required=False), depth=1)
    _check_arrays_and_roofline(data, ck)
    _check_schedule(ck, *ck.member(data, "schedule", "", required=False))


def _check_totals(ck: _Checker, res, where: str, strings: tuple[str, ...]) -> None:
    """`res` an object with the named strings, the counts and an optional utilisation."""
    ck.typed(res, where, (dict,), "an object")
    for key in (*strings, *_RESULT_COUNTS):
        ck.member(res, key, where)
    for key in strings:
        ck.typed(res[key], f"{where}.{key}", (str,), "a string")
    for key in _RESULT_COUNTS:
        ck.count(res[key], f"{where}.{key}")
    util, at = ck.member(res, "pe_utilization", where, required=False)
    if util is not None and ck.count(util, at, integer=False) > 1:
        ck.fail(at, f"a fraction must lie in [0, 1], got {util}")


def _check_model(data: dict, ck: _Checker) -> None:
    model, _ = ck.member(data, "model", "")
    _check_totals(ck, model, "model", ("model", "arch"))
    layers, at = ck.member(model, "layers", "model")
    ck.typed(layers, at, (list,), "a list")
    if not layers:
        ck.fail(at, "a model result has at least one layer")
    for i, row in enumerate(layers):
        where = f"{at}[{i}]"
        _check_totals(ck, row, where, ("name", "kind"))
        ck.count(ck.member(row, "compute_cycles", where)[0], f"{where}.compute_cycles")
        stalls, sat = ck.member(row, "stall_cycles", where)
        ck.typed(stalls, sat, (dict,), "an object")
        for cause, n in stalls.items():
            ck.count(n, f"{sat}.{cause}")
    for key in _RESULT_COUNTS:  # the totals are the layers' sums, or the file was edited
        total = sum(row[key] for row in layers)
        if model[key] != total:
            ck.fail(f"model.{key}", f"{model[key]} is not the sum over the layers ({total})")
    _check_arrays_and_roofline(data, ck)


def _check_arrays_and_roofline(data: dict, ck: _Checker) -> None:
    arrays, at = ck.member(data, "arrays", "", required=False)
    if arrays is not None:
        ck.typed(arrays, at, (dict,), "an object")
        _check_counts(ck, *ck.member(arrays, "pe_busy_cycles", at, required=False), depth=2)
        for key in ("spm_reads_per_line", "spm_writes_per_line", "spm_conflicts_per_line"):
            _check_counts(ck, *ck.member(arrays, key, at, required=False), depth=1)
    roof, at = ck.member(data, "roofline", "", required=False)
    if roof is not None:
        ck.typed(roof, at, (dict,), "an object")
        for key in ("peak_macs_per_cycle", "dram_bytes_per_cycle"):
            value, where = ck.member(roof, key, at, required=False)
            if value is not None:
                ck.count(value, where, integer=False)


def _check_counts(ck: _Checker, value, where: str, depth: int) -> None:
    """A list (`depth` 1) or a list of equal-length lists (2) of non-negative numbers."""
    if value is None:
        return
    ck.typed(value, where, (list,), "a list")
    if depth == 1:
        for i, v in enumerate(value):
            ck.count(v, f"{where}[{i}]", integer=False)
        return
    for i, row in enumerate(value):
        _check_counts(ck, row, f"{where}[{i}]", 1)
        if len(row) != len(value[0]):
            ck.fail(f"{where}[{i}]", f"expected {len(value[0])} entries like row 0, got {len(row)}")


def _check_schedule(ck: _Checker, rows, where: str) -> None:
    if rows is None:
        return
    ck.typed(rows, where, (list,), "a list")
    for i, row in enumerate(rows):
        at = f"{where}[{i}]"
        ck.typed(row, at, (dict,), "an object")
        for key in SCHEDULE_COLUMNS:
            ck.member(row, key, at)
        for key in ("kernel", "op"):
            ck.typed(row[key], f"{at}.{key}", (str,), "a string")
        for key, minimum in _SCHEDULE_MINIMA.items():
            ck.count(row[key], f"{at}.{key}", minimum)


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false",
            type(None): "null"}.get(type(value), type(value).__name__)


def write_trace(trace, path: str | Path) -> Path:
    """Write (cycle, (row, col), op) events as CSV or JSONL (by extension)."""
    path = Path(path)
    rows = [(int(c), int(pe[0]), int(pe[1]), op) for c, pe, op in (trace or ())]
    if path.suffix == ".csv":
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(TRACE_COLUMNS)
            w.writerows(rows)
    elif path.suffix == ".jsonl":
        with path.open("w") as f:
            for r in rows:
                f.write(json.dumps(dict(zip(TRACE_COLUMNS, r))) + "\n")
    else:
        raise UserError(f"{path}: trace files end in .csv or .jsonl, got {path.suffix!r}")
    return path


def read_trace(path: str | Path) -> list[tuple[int, int, int, str]]:
    path = Path(path)
    if path.suffix == ".csv":
        with path.open() as f:
            return [(int(r["cycle"]), int(r["pe_row"]), int(r["pe_col"]), r["op"])
                    for r in csv.DictReader(f)]
    return [tuple(json.loads(line)[c] for c in TRACE_COLUMNS)
            for line in path.read_text().splitlines()]
