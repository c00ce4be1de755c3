"""The plan cache: a dict in memory, backed by one pickle file per plan on disk.

Directory: the `directory` argument, else `$DATAFLOW_CACHE_DIR`, else
`~/.cache/dataflow/plans`. Each file is `<key>.plan`: one JSON header line (code
fingerprint, `dataflow-plan/<FORMAT_VERSION>`, SHA-256 of the pickle), then the pickled `Plan`
(`dataflow.cachefiles.frame_entry`; format 1 files, with a text header, read as stale). Files are
written to a temporary name and `os.replace`d, so readers never see half a file.

A file that cannot be used -- truncated, garbage, a checksum that fails (one flipped byte),
an unpickling error, another format version, written by a different version of the code
(`dataflow.cachefiles.code_fingerprint` hashes every source a cached plan depends on), or
holding a plan for another key -- is deleted and the plan rebuilt; the reason is kept in
`stats.discarded`. The checksum guards against damage, not against an attacker: pickle runs
code on load, so the directory is trusted like `~/.cache` itself; do not point it at files
from elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dataflow.cachefiles import (
    ENV_VAR,
    CacheEntryError,
    atomic_write_bytes,
    code_fingerprint,
    entry_prefix,
    frame_entry,
    resolve_cache_dir,
    unframe_entry,
)
from dataflow.errors import UserError
from dataflow.ust_frontend.plan import Plan

__all__ = ["ENV_VAR", "CacheStats", "PlanCache", "code_fingerprint", "default_cache",
           "plan_file_bytes", "resolve_cache_dir"]

FORMAT_VERSION = 2  # 2: the header line carries the payload's SHA-256
KIND = "plan"
SUFFIX = ".plan"
# what a corrupt pickle stream raises (only a file framed with a matching checksum gets here,
# so this is a file written on purpose, or by a pickle of another Python)
_UNPICKLE_ERRORS = (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError,
                    KeyError, TypeError, ValueError, OverflowError, MemoryError, RecursionError)


def header() -> bytes:
    """What every plan file this code writes starts with (its header line up to the checksum)."""
    return entry_prefix(KIND, FORMAT_VERSION)


def plan_file_bytes(plan: Plan) -> bytes:
    """The whole content of `plan`'s cache file."""
    return frame_entry(KIND, FORMAT_VERSION, pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL))


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
        try:
            plan = pickle.loads(unframe_entry(KIND, FORMAT_VERSION, blob))
        except CacheEntryError as exc:
            self._discard(path, str(exc))
            return None
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
            atomic_write_bytes(final, plan_file_bytes(plan))
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
