"""The plan cache: a dict in memory, backed by one pickle file per plan on disk.

Directory: the `directory` argument, else `$DATAFLOW_CACHE_DIR`, else
`~/.cache/dataflow/plans`. Each file is `<key>.plan`: one header line
`dataflow-plan <FORMAT_VERSION> <code fingerprint>\\n`, then the pickled `Plan`. Files are
written to a temporary name and `os.replace`d, so readers never see half a file.

A file that cannot be used -- truncated, garbage, unpickling error, another format version,
written by a different version of the code (`dataflow.cachefiles.code_fingerprint` hashes
every source a cached plan depends on), or holding a plan for another key -- is deleted and the
plan rebuilt; the reason is kept in `stats.discarded`. Pickle runs code on load: the directory is trusted like
`~/.cache` itself, so do not point it at files from elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dataflow.cachefiles import ENV_VAR, atomic_write_bytes, code_fingerprint, resolve_cache_dir
from dataflow.errors import UserError
from dataflow.ust_frontend.plan import Plan

__all__ = ["ENV_VAR", "CacheStats", "PlanCache", "code_fingerprint", "default_cache",
           "resolve_cache_dir"]

FORMAT_VERSION = 1
SUFFIX = ".plan"
# what a truncated or corrupt pickle stream raises
_UNPICKLE_ERRORS = (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError,
                    KeyError, TypeError, ValueError, OverflowError, MemoryError)


def header() -> bytes:
    return f"dataflow-plan {FORMAT_VERSION} {code_fingerprint()}\n".encode()


@dataclass
class CacheStats:
    """Counters since the cache object was made. `builds` counts plans actually built."""

    builds: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
    disk_writes: int = 0
    discarded: list[str] = field(default_factory=list)  # "<file>: <reason>"


class PlanCache:
    """Plans by key: memory first, then disk, else build (and store in both).

    `memory=False` / `disk=False` switch a tier off. The memory tier keeps the
    `max_memory_entries` most recently used plans (a long-running process, e.g. an injected
    model fed varying token counts, must not grow without bound).
    """

    def __init__(self, directory: str | os.PathLike | None = None, *, memory: bool = True,
                 disk: bool = True, max_memory_entries: int = 256):
        if max_memory_entries < 1:
            raise UserError(f"max_memory_entries must be >= 1, got {max_memory_entries}")
        self.directory = resolve_cache_dir(directory)
        self.use_memory = memory
        self.use_disk = disk
        self.max_memory_entries = max_memory_entries
        self.stats = CacheStats()
        self._plans: OrderedDict[str, Plan] = OrderedDict()

    def path_for(self, key: str) -> Path:
        return self.directory / f"{key}{SUFFIX}"

    def get_or_build(self, key: str, build: Callable[[], Plan]) -> tuple[Plan, str]:
        """(plan, source) with source one of "memory", "disk", "built"."""
        if self.use_memory and key in self._plans:
            self.stats.memory_hits += 1
            self._plans.move_to_end(key)
            return self._plans[key], "memory"
        if self.use_disk:
            plan = self._load(key)
            if plan is not None:
                self.stats.disk_hits += 1
                self._remember(plan)
                return plan, "disk"
        plan = build()
        self.stats.builds += 1
        if plan.key != key:
            raise ValueError(f"plan builder returned a plan for key {plan.key[:12]}, "
                             f"asked for {key[:12]}")
        self._remember(plan)
        if self.use_disk:
            self._store(plan)
        return plan, "built"

    def _remember(self, plan: Plan) -> None:
        if not self.use_memory:
            return
        self._plans[plan.key] = plan
        self._plans.move_to_end(plan.key)
        while len(self._plans) > self.max_memory_entries:
            self._plans.popitem(last=False)

    def clear_memory(self) -> None:
        self._plans.clear()

    def clear_disk(self) -> None:
        if self.directory.is_dir():
            for p in self.directory.glob(f"*{SUFFIX}"):
                p.unlink(missing_ok=True)

    def __contains__(self, key: str) -> bool:
        return key in self._plans or (self.use_disk and self.path_for(key).is_file())

    # -- disk ------------------------------------------------------------------------------------
    def _load(self, key: str) -> Plan | None:
        path = self.path_for(key)
        try:
            blob = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            self._discard(path, f"unreadable ({exc})")
            return None
        want = header()
        if not blob.startswith(want):
            first = blob.split(b"\n", 1)[0][:80]
            reason = ("stale: written by another version "
                      f"({first.decode(errors='replace')!r}, expected {want.strip().decode()!r})"
                      if first.startswith(b"dataflow-plan ") else "not a plan file (bad header)")
            self._discard(path, reason)
            return None
        try:
            plan = pickle.loads(blob[len(want):])
        except _UNPICKLE_ERRORS as exc:
            self._discard(path, f"corrupt: {type(exc).__name__}: {exc}")
            return None
        if not isinstance(plan, Plan) or plan.key != key:
            self._discard(path, "holds another object or another key")
            return None
        return plan

    def _discard(self, path: Path, reason: str) -> None:
        self.stats.discarded.append(f"{path.name}: {reason}")
        with contextlib.suppress(OSError):  # the rebuilt plan's write replaces it or says why not
            path.unlink(missing_ok=True)

    def _store(self, plan: Plan) -> None:
        final = self.path_for(plan.key)
        try:
            atomic_write_bytes(final, header() + pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError as exc:
            raise OSError(f"plan cache: cannot write {final} ({exc}); point ${ENV_VAR} or "
                          "PlanCache(directory=...) at a writable folder, or use "
                          "PlanCache(disk=False)") from exc
        self.stats.disk_writes += 1


_DEFAULT: dict[Path, PlanCache] = {}


def default_cache() -> PlanCache:
    """The process's cache for the current default directory (env var read on each call)."""
    d = resolve_cache_dir()
    if d not in _DEFAULT:
        _DEFAULT[d] = PlanCache(d)
    return _DEFAULT[d]
