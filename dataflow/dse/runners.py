"""Where points are evaluated: serially, in local worker processes (the default), or on an
existing Dask cluster. Every runner yields records as they finish; the caller stores each one
in its own transaction before asking for the next, so an interruption loses no finished point.

Interruption: local workers ignore SIGINT (Ctrl-C reaches the whole process group), so only the
sweep's main process sees it; it stops taking records and calls `abort()`, which terminates and
joins the workers. A worker whose sweep dies without that (SIGKILL, a crash) exits by itself
at once (`_watch_sweep`).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import select
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from dataflow.dse.evaluate import evaluate_point
from dataflow.dse.points import Point, grid_points
from dataflow.dse.store import ResultsStore
from dataflow.dse.sweep import Sweep
from dataflow.errors import UserError
from dataflow.ust_frontend.extras import require

# Deferred imports: Dask (`distributed`, the `dask` extra) and tqdm are imported where a runner
# needs them.


class SerialRunner:
    name = "serial"
    workers = 1

    def imap_unordered(self, payloads: Iterable[dict]) -> Iterator[dict]:
        for p in payloads:
            yield evaluate_point(p)

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


PARENT_POLL_S = 0.5


def _worker_init(sweep_pid: int) -> None:
    """Runs first in every local worker: leave Ctrl-C to the sweep, and exit when it is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_sweep, args=(sweep_pid, os.getppid()), daemon=True,
                     name="dataflow-sweep-watch").start()


def _watch_sweep(sweep_pid: int, parent: int) -> None:
    """Exit the worker as soon as the sweep's process ends. The worker's parent is the
    forkserver, which outlives the sweep as long as a worker does (each holds its alive pipe),
    so neither PDEATHSIG nor the parent's pid would tell; a pidfd of the sweep becomes readable
    the moment it exits, even while it is an unreaped zombie."""
    try:
        fd = os.pidfd_open(sweep_pid)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):  # not Linux >= 5.3: poll
        fd = None
    if fd is not None:
        select.select([fd], [], [])
        os._exit(1)
    while True:
        time.sleep(PARENT_POLL_S)
        try:
            os.kill(sweep_pid, 0)
        except OSError:  # gone (or the pid reused by another user)
            os._exit(1)
        if os.getppid() != parent:
            os._exit(1)


class PoolRunner:
    """Local worker processes. Workers start from a forkserver that has already imported the
    simulator, so a new worker costs a fork, not an import."""

    def __init__(self, workers: int | None = None):
        self.workers = workers or os.cpu_count() or 1
        if self.workers < 1:
            raise UserError(f"--workers must be >= 1, got {self.workers}")
        self.name = f"local pool ({self.workers} workers)"
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["dataflow.dse.evaluate", "dataflow.api"])
        # The forkserver starts now, with SIGINT ignored: a Ctrl-C during its imports would kill
        # it with a traceback; its workers inherit the setting (and _worker_init sets it too).
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) \
            if threading.current_thread() is threading.main_thread() else None
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        self.pool = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_worker_init,
                                        initargs=(os.getpid(),))

    def imap_unordered(self, payloads: Iterable[dict]) -> Iterator[dict]:
        todo = iter(payloads)
        window = 4 * self.workers  # a few queued per worker: busy workers, little lost on a kill
        running = set()
        try:
            while True:
                for p in todo:
                    running.add(self.pool.submit(evaluate_point, p))
                    if len(running) >= window:
                        break
                if not running:
                    return
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    yield f.result()
        except BrokenProcessPool:
            raise RuntimeError("a worker process died (out of memory, or killed); the points "
                               "stored so far are kept: run the sweep again to resume") from None

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def abort(self) -> None:
        """Stop now: terminate the workers (their points in progress are lost, never stored
        half) and join them."""
        # the pool's own process table: Python < 3.14 has no public terminate_workers()
        procs = list((self.pool._processes or {}).values())
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        self.pool.shutdown(wait=True, cancel_futures=True)
        for proc in procs:
            proc.join(5)


class DaskRunner:
    """Points as tasks on an existing Dask cluster (`tcp://HOST:PORT`)."""

    def __init__(self, address: str, timeout_s: float = 30):
        Client = require("distributed", "dask", needed_for="--scheduler").Client

        try:
            self.client = Client(address, timeout=timeout_s)
        except (OSError, TimeoutError) as exc:
            raise UserError(f"cannot reach the Dask scheduler at {address} ({exc})") from None
        self.workers = max(1, sum(self.client.nthreads().values()))
        self.name = f"dask {address} ({self.workers} threads)"

    def imap_unordered(self, payloads: Iterable[dict]) -> Iterator[dict]:
        as_completed = require("distributed", "dask").as_completed

        todo = iter(payloads)
        pending = as_completed()
        for p in todo:
            pending.add(self.client.submit(evaluate_point, p, pure=False))
            if pending.count() >= 4 * self.workers:
                break
        for fut in pending:
            yield fut.result()
            fut.release()
            nxt = next(todo, None)
            if nxt is not None:
                pending.add(self.client.submit(evaluate_point, nxt, pure=False))

    def close(self) -> None:
        self.client.close()

    def abort(self) -> None:
        self.client.close()  # the cluster's own workers stay; our tasks are released with us


def make_runner(workers: int | None = None, scheduler: str | None = None, serial: bool = False,
                scheduler_timeout_s: float = 30):
    if scheduler and (serial or workers):
        raise UserError("--scheduler runs on the cluster's workers: it takes no --serial or "
                         "--workers")
    if scheduler:
        return DaskRunner(scheduler, scheduler_timeout_s)
    if serial or workers == 1:
        return SerialRunner()
    return PoolRunner(workers)


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    runner: str
    grid_points: int
    already_stored: int
    evaluated: int
    failed: int
    duplicates: int  # records that found their point already stored (0 unless two sweeps race)
    impossible_archs: int
    wall_s: float
    values_mismatch: int = 0  # points whose engine output differs from the numpy reference

    @property
    def points_per_s(self) -> float:
        return self.evaluated / self.wall_s if self.wall_s > 0 else 0.0

    def text(self) -> str:
        return (f"{self.grid_points} points: {self.already_stored} already stored, "
                f"{self.evaluated} evaluated ({self.failed} failed) in {self.wall_s:.1f} s "
                f"({self.points_per_s:.2f} points/s, {self.runner})"
                + (f"; {self.impossible_archs} impossible architectures skipped"
                   if self.impossible_archs else "")
                + (f"; {self.values_mismatch} points whose values DO NOT MATCH the numpy reference"
                   if self.values_mismatch else ""))


def run_points(points: list[Point], store: ResultsStore, runner, run_id: str, *,
               progress: bool = False, retry_failed: bool = False,
               already_stored: int = 0) -> tuple[int, int, int]:
    """Evaluate `points` on `runner`, storing each as it arrives. Returns (evaluated, failed,
    duplicates) as counted by the store."""
    from tqdm import tqdm

    by_id = {p.point_id: p for p in points}
    bar = tqdm(total=len(points) + already_stored, initial=already_stored, unit="pt",
               disable=not progress, smoothing=0.1, dynamic_ncols=True)
    evaluated = failed = duplicates = 0
    try:
        for rec in runner.imap_unordered(p.payload() for p in points):
            if store.put(by_id[rec["point_id"]], rec, run_id, replace_failed=retry_failed):
                evaluated += 1
                failed += rec["status"] != "ok"
            else:
                duplicates += 1
            bar.update(1)
            if failed:
                bar.set_postfix(failed=failed, refresh=False)
    finally:
        bar.close()
    return evaluated, failed, duplicates


def run_sweep(sweep: Sweep, store: ResultsStore, runner, *, progress: bool = False,
              retry_failed: bool = False) -> RunSummary:
    """Run every point of the grid not yet in `store` (failed ones too with `retry_failed`)."""
    t0 = time.perf_counter()
    grid = grid_points(sweep)
    with store.exclusive():  # a second sweep on this file refuses instead of redoing it all
        done = store.stored_ids(include_failed=not retry_failed)
        pending = [p for p in grid.points if p.point_id not in done]
        skipped = len(grid.points) - len(pending)
        run_id = store.start_run(sweep.name, sweep.source, f"grid / {runner.name}",
                                 len(grid.points), skipped)
        evaluated, failed, dups = run_points(pending, store, runner, run_id, progress=progress,
                                             retry_failed=retry_failed, already_stored=skipped)
        store.finish_run(run_id)
    mismatch = store.conn.execute("SELECT COUNT(*) FROM dse_points WHERE run_id = ? AND "
                                  "values_match = 0", (run_id,)).fetchone()[0]
    return RunSummary(run_id, runner.name, len(grid.points), skipped, evaluated, failed, dups,
                      grid.impossible_archs, time.perf_counter() - t0, mismatch)
