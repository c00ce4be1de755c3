"""Design-space exploration: sweep files → points → evaluation → SQLite results → Pareto fronts.

    sweep = load_sweep("examples/tiny_sweep.yaml")          # validated; errors name file + key
    with ResultsStore("results.db") as store:                # one transaction per point, WAL
        run_sweep(sweep, store, make_runner(workers=2))      # resumes: stored points are skipped
    rows = load_rows("results.db"); print(front_report(rows, ["cycles", "energy_pj", "area_mm2"]))
"""

from dataflow.dse.evaluate import METRICS, area_breakdown_mm2, evaluate_point
from dataflow.dse.pareto import (
    front_report,
    load_rows,
    nondominated_ranks,
    pareto_mask,
    plot_front,
    rank_rows,
    to_arrow,
    write_csv,
    write_parquet,
)
from dataflow.dse.points import Point, grid_points, make_point
from dataflow.dse.runners import DaskRunner, PoolRunner, SerialRunner, make_runner, run_sweep
from dataflow.dse.store import ResultsStore
from dataflow.dse.sweep import Sweep, SweepError, load_sweep, sweep_from_dict

__all__ = [
    "METRICS", "DaskRunner", "Point", "PoolRunner", "ResultsStore", "SerialRunner", "Sweep",
    "SweepError", "area_breakdown_mm2", "evaluate_point", "front_report", "grid_points",
    "load_rows", "load_sweep", "make_point", "make_runner", "nondominated_ranks", "pareto_mask",
    "plot_front", "rank_rows", "run_sweep", "sweep_from_dict", "to_arrow", "write_csv",
    "write_parquet",
]
