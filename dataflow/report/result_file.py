"""The saved-result file of `dataflow simulate --save FILE` and the per-cycle trace file.

Result file: one JSON object, `{"format": "dataflow-result/1", "result": SimResult.to_dict(),
"arrays": {...}, "schedule": [...], "tile_spans": [...], "roofline": {...}}` — plain data, so
any tool can read it. `dataflow report` also accepts the bare `to_dict()` object that
`dataflow simulate --json` prints, and draws what that holds.

Trace file: one row per op issued, from the reference engine (`cycle, pe_row, pe_col, op`), as
CSV (`.csv`) or JSON lines (`.jsonl`), chosen by the file's extension.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from dataflow.errors import UserError

FORMAT = "dataflow-result/1"
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


def save_result(res, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(result_data(res)))
    return path


def load_result(path: str | Path) -> dict:
    """Read a result file (or a bare `--json` object); ValueError names the file and the key."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such result file") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not a JSON result file ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(data).__name__}")  # noqa: TRY004 - bad file content, a user error
    if "format" not in data:  # the bare object `dataflow simulate --json` prints
        data = {"format": FORMAT, "result": data, "arrays": {}, "schedule": [], "tile_spans": []}
    if data["format"] != FORMAT:
        raise UserError(f"{path}: format: expected {FORMAT!r}, got {data['format']!r}")
    for key in ("workload", "arch", "cycles", "macs", "dram_bytes"):
        if key not in data.get("result", {}):
            raise UserError(f"{path}: result.{key}: required key is missing")
    return data


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
    return [tuple(json.loads(line)[c] for c in TRACE_COLUMNS) for line in path.read_text().splitlines()]
