"""Pareto fronts over stored results: non-dominated sorting (numpy), tables, plots, CSV/Parquet.

Rows are flat dicts: `point_id, sweep, workload, group, status, error`, the metrics
(`dataflow.dse.evaluate.METRICS`), `values_match`, then one column per swept architecture key
(`arch.pe_array.rows`), workload parameter (`param.m`) and mapping choice (`mapping.engine`).
Points are compared only within a group (by default the workload instance: the same workload
with the same parameters), because a 32³ GEMM and a 64³ GEMM are not alternatives to each other.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dataflow.dse.evaluate import MAXIMISED, METRICS, metric_name
from dataflow.dse.store import ResultsStore
from dataflow.errors import UserError
from dataflow.ust_frontend.extras import require

# Deferred imports: matplotlib and pyarrow are imported where a plot or a Parquet file is
# written (start-up; pyarrow is the `dse` extra).

BASE_COLUMNS = ("point_id", "sweep", "workload", "group", "status", "error", *METRICS,
                "values_match", "pareto_rank")


# ---------------------------------------------------------------- non-dominated sorting

def pareto_mask(values: np.ndarray) -> np.ndarray:
    """Boolean mask of the non-dominated rows of `values` (n × d), every column minimised.

    Row a dominates b when a <= b in every column and a < b in one. Equal rows do not dominate
    each other (both stay on the front). Rows are visited in lexicographic order, so a row can
    only be dominated by one visited before it: each row is checked against the front so far.
    """
    y = np.asarray(values, dtype=float)
    if y.ndim != 2:
        raise UserError(f"expected an (n, d) array, got shape {y.shape}")
    if not np.isfinite(y).all():
        raise UserError("objective values must be finite (drop failed points first)")
    mask = np.zeros(len(y), dtype=bool)
    front = np.empty((0, y.shape[1]))
    for i in np.lexsort(y.T[::-1]):
        row = y[i]
        if len(front) and np.any(np.all(front <= row, axis=1) & np.any(front < row, axis=1)):
            continue
        mask[i] = True
        front = np.vstack([front, row])
    return mask


def nondominated_ranks(values: np.ndarray) -> np.ndarray:
    """Front number of every row: 0 for the Pareto front, 1 for the front once 0 is removed..."""
    y = np.asarray(values, dtype=float)
    ranks = np.full(len(y), -1, dtype=int)
    left = np.arange(len(y))
    r = 0
    while len(left):
        m = pareto_mask(y[left])
        ranks[left[m]] = r
        left = left[~m]
        r += 1
    return ranks


def _signed(rows: list[dict], objectives: Sequence[str]) -> np.ndarray:
    """Objective matrix with maximised metrics negated, so every column is minimised."""
    return np.array([[(-1.0 if o in MAXIMISED else 1.0) * float(r[o]) for o in objectives]
                     for r in rows], dtype=float).reshape(len(rows), len(objectives))


# ---------------------------------------------------------------- rows

def flatten(row: dict) -> dict:
    """A store row (`ResultsStore.rows`) as one flat dict for tables and exports."""
    point = row["point"]
    out = {"point_id": row["point_id"], "sweep": row["sweep"], "workload": row["workload"],
           "group": row["grp"], "status": row["status"], "error": row["error"]}
    for m in METRICS:
        out[m] = row.get(m)
    out["values_match"] = row.get("values_match")
    for k, v in point.get("arch_overrides", {}).items():
        out[f"arch.{k}"] = v
    for k, v in point.get("params", {}).items():
        out[f"param.{k}"] = v
    for k, v in point.get("mapping", {}).items():
        out[f"mapping.{k}"] = v
    return out


def load_rows(db: str | Path, sweep: str | None = None) -> list[dict]:
    path = Path(db)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such results file")
    with ResultsStore(path) as store:
        rows = store.rows(*(("sweep = ?", (sweep,)) if sweep else ()))
    return [flatten(r) for r in rows]


def rank_rows(rows: list[dict], objectives: Sequence[str], group_by: str = "group") -> list[dict]:
    """Rows with `pareto_rank` set (0 = on the front of its group; None for failed points).
    `group_by` is a column name, or "none" to compare all points with each other."""
    objectives = [metric_name(o) for o in objectives]
    out = [dict(r, pareto_rank=None) for r in rows]
    groups: dict[Any, list[dict]] = {}
    for r in out:
        if r["status"] == "ok" and all(_finite(r.get(o)) for o in objectives):
            key = None if group_by == "none" else _key(r.get(group_by))
            groups.setdefault(key, []).append(r)
    for members in groups.values():
        for r, rank in zip(members, nondominated_ranks(_signed(members, objectives))):
            r["pareto_rank"] = int(rank)
    return out


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _key(v: Any) -> Any:
    return json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v


def columns(rows: list[dict]) -> list[str]:
    """Base columns first, then arch.*, param.*, mapping.* in order of first appearance."""
    extra: dict[str, None] = {}
    for r in rows:
        for k in r:
            if k not in BASE_COLUMNS:
                extra.setdefault(k, None)
    return [*BASE_COLUMNS, *extra]


def varying(rows: list[dict], prefixes=("arch.", "param.", "mapping.")) -> list[str]:
    """The design columns that take more than one value among `rows`."""
    cols = [c for c in columns(rows) if c.startswith(prefixes)]
    return [c for c in cols if len({_key(r.get(c)) for r in rows}) > 1]


def format_table(rows: list[dict], cols: Sequence[str]) -> str:
    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    body = [[cell(r.get(c)) for c in cols] for r in rows]
    widths = [max([len(c), *(len(b[i]) for b in body)]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def front_report(rows: list[dict], objectives: Sequence[str], group_by: str = "group") -> str:
    """Text: per group, the points on the Pareto front sorted by the first objective."""
    objectives = [metric_name(o) for o in objectives]
    ranked = rank_rows(rows, objectives, group_by)
    ok = [r for r in ranked if r["pareto_rank"] is not None]
    failed = [r for r in ranked if r["status"] != "ok"]
    parts = []
    keys = sorted({_key(r.get(group_by)) if group_by != "none" else None for r in ok}, key=str)
    for key in keys:
        members = [r for r in ok if group_by == "none" or _key(r.get(group_by)) == key]
        front = sorted((r for r in members if r["pareto_rank"] == 0),
                       key=lambda r: tuple(r[o] for o in objectives))
        title = "all points" if group_by == "none" else f"{group_by} = {key}"
        cols = ["point_id", *varying(members), *objectives,
                *(m for m in ("pe_utilization", "values_match") if m not in objectives)]
        parts.append(f"{title}: {len(front)} of {len(members)} points on the front of "
                     f"({', '.join(objectives)})\n" + format_table(front, cols))
    if failed:
        parts.append(f"{len(failed)} failed points (not ranked), e.g. {failed[0]['point_id']}: "
                     f"{failed[0]['error']}")
    if not parts:
        parts.append("no stored points")
    return "\n\n".join(parts)


# ---------------------------------------------------------------- plots

def plot_front(rows: list[dict], x: str, y: str, path: str | Path, group_by: str = "group",
               objectives: Sequence[str] | None = None):
    """Scatter of y against x per group (all points grey, the 2-D front of (x, y) highlighted
    and joined by its staircase; points on the front of `objectives`, if given, ringed)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    x, y = metric_name(x), metric_name(y)
    ranked2 = rank_rows(rows, [x, y], group_by)
    full = {r["point_id"]: r["pareto_rank"] for r in rank_rows(rows, objectives, group_by)} \
        if objectives else {}
    ok = [r for r in ranked2 if r["pareto_rank"] is not None]
    if not ok:
        raise UserError("no successful points to plot")
    keys = sorted({_key(r.get(group_by)) if group_by != "none" else None for r in ok}, key=str)
    n = len(keys)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 4 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        members = [r for r in ok if group_by == "none" or _key(r.get(group_by)) == key]
        xs = np.array([r[x] for r in members], float)
        ys = np.array([r[y] for r in members], float)
        on = np.array([r["pareto_rank"] == 0 for r in members])
        ax.scatter(xs[~on], ys[~on], s=14, c="0.65", label="dominated")
        order = np.argsort(xs[on])
        ax.step(xs[on][order], ys[on][order], where="post", c="tab:red", lw=1)
        ax.scatter(xs[on], ys[on], s=28, c="tab:red", label=f"front of ({x}, {y})", zorder=3)
        if full:
            ring = np.array([full.get(r["point_id"]) == 0 for r in members])
            ax.scatter(xs[ring], ys[ring], s=80, facecolors="none", edgecolors="tab:blue",
                       label=f"front of ({', '.join(objectives)})", zorder=4)
        ax.set_xlabel(x, fontsize=8)
        ax.set_ylabel(y, fontsize=8)
        ax.set_title("all points" if group_by == "none" else str(key), fontsize=8)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- exports

def _cell(v: Any) -> Any:
    return json.dumps(v) if isinstance(v, (list, dict)) else v


def write_csv(rows: list[dict], path: str | Path) -> list[str]:
    """CSV with a header; empty cell = no value; lists as JSON text. Returns the columns."""
    cols = columns(rows)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow(["" if r.get(c) is None else _cell(r.get(c)) for c in cols])
    return cols


def to_arrow(rows: list[dict]):
    """A pyarrow Table: bool, int64, float64 or string columns (nulls where no value)."""
    pa = require("pyarrow", "dse", needed_for="Arrow and Parquet export")

    arrays = {}
    for c in columns(rows):
        vals = [_cell(r.get(c)) for r in rows]
        present = [v for v in vals if v is not None]
        if present and all(isinstance(v, bool) for v in present):
            t = pa.bool_()
        elif present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
            t = pa.int64()
        elif present and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                             for v in present):
            t, vals = pa.float64(), [None if v is None else float(v) for v in vals]
        else:
            t, vals = pa.string(), [None if v is None else str(v) for v in vals]
        arrays[c] = pa.array(vals, type=t)
    return pa.table(arrays)


def write_parquet(rows: list[dict], path: str | Path):
    pq = require("pyarrow.parquet", "dse", needed_for="Parquet export")
    table = to_arrow(rows)
    pq.write_table(table, path)
    return table
