"""Builds notebooks/07_design_space.ipynb (committed without outputs; CI executes it).

    python notebooks/make_07_design_space.py
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    ("md", """# 07 · Design-space exploration

A sweep file names architecture parameters by their `ArchSpec` key path (lists or ranges),
workloads with their parameters, and mapping options. `dataflow sweep` evaluates every point
(simulated cycles and energy, area from the architecture's area table, the engine's values checked
against numpy) and stores each one in a SQLite file in its own transaction, so an interrupted sweep
resumes where it stopped. `dataflow pareto` ranks the stored points. The same from Python:"""),
    ("code", """%matplotlib inline
import tempfile
from pathlib import Path

from IPython.display import Image

from dataflow.dse import (ResultsStore, front_report, grid_points, load_rows, load_sweep,
                          make_runner, plot_front, rank_rows, run_sweep, write_parquet)

sweep = load_sweep("../examples/tiny_sweep.yaml")
print(Path("../examples/tiny_sweep.yaml").read_text())
for d in sweep.dimensions:
    print(d.where, d.keys, d.values)
print(len(grid_points(sweep).points), "points")"""),
    ("md", """Run it on two local worker processes (the default is one per core). The results file
is an ordinary SQLite database."""),
    ("code", """folder = Path(tempfile.mkdtemp())
db = folder / "tiny.db"
runner = make_runner(workers=2)
try:
    with ResultsStore(db) as store:
        print(run_sweep(sweep, store, runner).text())
        # the same sweep again: every point is already stored, nothing is simulated twice
        print(run_sweep(sweep, store, runner).text())
finally:
    runner.close()"""),
    ("md", """Points are compared within a workload instance (same workload, same parameters). The
front below is over cycles, energy and area; bigger arrays buy cycles with area."""),
    ("code", """rows = load_rows(db)
print(front_report(rows, ["cycles", "energy_pj", "area_mm2"]))"""),
    ("code", """png = plot_front(rows, "cycles", "area_mm2", folder / "front.png",
                 objectives=["cycles", "energy_pj", "area_mm2"])
Image(filename=str(png))"""),
    ("md", """For spaces too large to grid, `--search optuna` runs NSGA-II over the same axes, one
study per workload instance, in the same file. Trials whose point is already stored reuse it."""),
    ("code", """import optuna
from dataflow.dse.runners import SerialRunner
from dataflow.dse.search import run_search

with ResultsStore(db) as store:
    print(run_search(sweep, store, SerialRunner(), trials=6).text())
for s in optuna.get_all_study_summaries(f"sqlite:///{db}"):
    study = optuna.load_study(study_name=s.study_name, storage=f"sqlite:///{db}")
    print(s.study_name, "-", len(study.trials), "trials,", len(study.best_trials), "on the front")"""),
    ("md", "Export for other tools (CSV with `write_csv`, Parquet with pyarrow):"),
    ("code", """import pyarrow.parquet as pq

ranked = rank_rows(rows, ["cycles", "energy_pj", "area_mm2"])
write_parquet(ranked, folder / "tiny.parquet")
table = pq.read_table(folder / "tiny.parquet")
print(table.num_rows, "rows;", ", ".join(table.column_names[:12]), "...")"""),
]


def main() -> None:
    nb = new_notebook(cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src)
                             for kind, src in CELLS])
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python",
                                  "name": "python3"}, "language_info": {"name": "python"}}
    path = Path(__file__).resolve().parent / "07_design_space.ipynb"
    nbformat.write(nb, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
