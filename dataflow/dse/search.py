"""Guided multi-objective search (Optuna NSGA-II) for spaces too big to grid.

The space is the sweep file's own: each swept architecture axis (or zip group) and the mapping
choices are one parameter each; every workload instance gets its own study (its points are the
comparable ones), named `<sweep>/<workload(params)>`. Objectives default to cycles, energy and
area (`search.objectives`). Studies live in Optuna's RDB storage inside the results file itself
(`sqlite:///results.db`), next to our `dse_points` table: every evaluated point is stored there
like a grid point, and a trial whose point is already stored reuses it instead of simulating it
again. `--trials N` is the number of finished trials each study should reach, so running the same
command again after an interruption continues where it stopped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dataflow.arch import ArchError
from dataflow.dse.evaluate import MAXIMISED
from dataflow.dse.points import Point, instance_group, make_point, mapping_combinations
from dataflow.dse.runners import run_points
from dataflow.dse.store import ResultsStore
from dataflow.dse.sweep import Sweep
from dataflow.errors import UserError
from dataflow.ust_frontend.extras import require

# Deferred imports: optuna and tqdm come with the `dse` extra: imported in the functions that
# use them.


@dataclass(frozen=True)
class SearchSummary:
    run_id: str
    studies: tuple[str, ...]
    trials: int  # finished trials added by this run (all studies)
    evaluated: int  # points simulated by this run
    reused: int  # trials answered from points already stored
    failed: int  # trials whose point was impossible or failed
    wall_s: float

    def text(self) -> str:
        return (f"search: {len(self.studies)} studies, {self.trials} new trials "
                f"({self.evaluated} points simulated, {self.reused} reused from the store, "
                f"{self.failed} failed) in {self.wall_s:.1f} s")


def _ordinal(values: tuple) -> bool:
    vs = [v[0] for v in values] if all(len(v) == 1 for v in values) else None
    return bool(vs) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vs) \
        and (vs == sorted(vs) or vs == sorted(vs, reverse=True))


def _suggest(trial, sweep: Sweep, mappings: list) -> tuple[dict[str, Any], tuple]:
    """Architecture overrides and the mapping choice of one trial."""
    overrides: dict[str, Any] = {}
    for dim in sweep.dimensions:
        n = len(dim.values)
        if n == 1:
            i = 0
        elif _ordinal(dim.values):  # numeric axes keep their order for crossover
            i = trial.suggest_int(dim.where, 0, n - 1)
        else:
            i = trial.suggest_categorical(dim.where, list(range(n)))
        overrides.update(zip(dim.keys, dim.values[i]))
    j = trial.suggest_categorical("mapping", list(range(len(mappings)))) if len(mappings) > 1 \
        else 0
    return overrides, mappings[j]


def _fail_interrupted(study) -> None:
    """Trials left RUNNING by a killed search never finish: close them as failed, marked so
    they do not count towards --trials."""
    TrialState = require("optuna.trial", "dse").TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)


def _finished(study) -> int:
    TrialState = require("optuna.trial", "dse").TrialState

    return sum(1 for t in study.get_trials(deepcopy=False,
                                           states=(TrialState.COMPLETE, TrialState.FAIL))
               if not t.user_attrs.get("interrupted"))


def run_search(sweep: Sweep, store: ResultsStore, runner, trials: int, *,
               storage_url: str | None = None, progress: bool = False) -> SearchSummary:
    """Run NSGA-II studies until each has `trials` finished trials; store every point. One
    search or sweep at a time per results file (`ResultsStore.exclusive`)."""
    with store.exclusive():
        return _search(sweep, store, runner, trials, storage_url, progress)


def _search(sweep: Sweep, store: ResultsStore, runner, trials: int, storage_url: str | None,
            progress: bool) -> SearchSummary:
    optuna = require("optuna", "dse", needed_for="--search optuna")
    TrialState = require("optuna.trial", "dse").TrialState
    from tqdm import tqdm

    if trials < 1:
        raise UserError(f"--trials must be >= 1, got {trials}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.perf_counter()
    storage = optuna.storages.RDBStorage(storage_url or f"sqlite:///{store.path}",
                                         engine_kwargs={"connect_args": {"timeout": 60}})
    objectives = sweep.search.objectives
    directions = ["maximize" if o in MAXIMISED else "minimize" for o in objectives]
    mappings = list(mapping_combinations(sweep))
    instances = [(wg.name, inst) for wg in sweep.workloads for inst in wg.instances()]
    run_id = store.start_run(sweep.name, sweep.source, f"search / {runner.name}",
                             trials * len(instances), 0)
    studies, new_trials, evaluated, reused, failed = [], 0, 0, 0, 0
    bar = tqdm(total=trials * len(instances), unit="trial", disable=not progress)
    for k, (workload, inst) in enumerate(instances):
        name = f"{sweep.name}/{instance_group(sweep, workload, inst)}"
        sampler = optuna.samplers.NSGAIISampler(population_size=sweep.search.population,
                                                seed=sweep.search.seed + k)
        study = optuna.create_study(storage=storage, sampler=sampler, study_name=name,
                                    directions=directions, load_if_exists=True)
        if list(study.directions) != [optuna.study.StudyDirection.MAXIMIZE if d == "maximize"
                                      else optuna.study.StudyDirection.MINIMIZE
                                      for d in directions]:
            raise UserError(f"study {name!r} in {store.path} has other objectives; use another "
                             "--out file or the same search.objectives")
        studies.append(name)
        _fail_interrupted(study)
        done = _finished(study)
        bar.update(min(done, trials))
        while done < trials:
            batch = [study.ask() for _ in range(min(runner.workers, trials - done))]
            todo: dict[str, Point] = {}
            waiting: list[tuple[Any, Point]] = []
            for trial in batch:
                overrides, (engine, seed, opts) = _suggest(trial, sweep, mappings)
                trial.set_user_attr("arch_overrides", {k: v for k, v in overrides.items()})
                try:
                    p = make_point(sweep, overrides, workload, inst, engine, seed, opts)
                except ArchError as exc:  # an impossible combination: a failed trial
                    trial.set_user_attr("error", str(exc))
                    study.tell(trial, state=TrialState.FAIL)
                    failed += 1
                    continue
                trial.set_user_attr("point_id", p.point_id)
                waiting.append((trial, p))
                if store.get(p.point_id) is None:
                    todo[p.point_id] = p
            if todo:
                e, _f, _d = run_points(list(todo.values()), store, runner, run_id)
                evaluated += e
            reused += len(waiting) - len(todo)
            for trial, p in waiting:
                row = store.get(p.point_id)
                if row is None or row["status"] != "ok":
                    trial.set_user_attr("error", row["error"] if row else "not stored")
                    study.tell(trial, state=TrialState.FAIL)
                    failed += 1
                else:
                    study.tell(trial, [float(row[o]) for o in objectives])
            new_trials += len(batch)
            done += len(batch)
            bar.update(len(batch))
    bar.close()
    store.finish_run(run_id)
    return SearchSummary(run_id, tuple(studies), new_trials, evaluated, reused, failed,
                         time.perf_counter() - t0)
