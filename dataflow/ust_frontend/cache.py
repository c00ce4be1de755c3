"""The plan cache: a dict in memory, backed by one pickle file per plan on disk.

Directory: the `directory` argument, else `$DATAFLOW_CACHE_DIR`, else
`~/.cache/dataflow/plans`. Each file is `<key>.plan`: one header line
`dataflow-plan <FORMAT_VERSION> <code fingerprint>\\n`, then the pickled `Plan`. Files are
written to a temporary name and `os.replace`d, so readers never see half a file.

A file that cannot be used -- truncated, garbage, unpickling error, another format version,
written by a different version of the mapper (the fingerprint hashes the sources that decide a
mapping), or holding a plan for another key -- is deleted and the plan rebuilt; the reason is
kept in `stats.discarded`. Pickle runs code on load: the directory is trusted like
`~/.cache` itself, so do not point it at files from elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from dataflow.ust_frontend.plan import Plan

FORMAT_VERSION = 1
ENV_VAR = "DATAFLOW_CACHE_DIR"
DEFAULT_DIR = Path("~/.cache/dataflow/plans")
SUFFIX = ".plan"
# sources whose changes can change a plan: a file written by other code is stale
_FINGERPRINT_DIRS = ("dfg", "mapper", "arch")
_FINGERPRINT_FILES = ("ust_frontend/plan.py",)
# what a truncated or corrupt pickle stream raises
_UNPICKLE_ERRORS = (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError,
                    KeyError, TypeError, ValueError, OverflowError, MemoryError)


@cache
def code_fingerprint() -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    files = [p for d in _FINGERPRINT_DIRS for p in sorted((root / d).glob("*.py"))]
    files += [root / f for f in _FINGERPRINT_FILES]
    for p in files:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def header() -> bytes:
    return f"dataflow-plan {FORMAT_VERSION} {code_fingerprint()}\n".encode()


def resolve_cache_dir(directory: str | os.PathLike | None = None) -> Path:
    if directory is not None:
        return Path(directory).expanduser()
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else DEFAULT_DIR.expanduser()


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
            raise ValueError(f"max_memory_entries must be >= 1, got {max_memory_entries}")
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
        tmp = final.with_name(f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(header())
                pickle.dump(plan, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, final)  # atomic: readers see the old file or the whole new one
        except OSError as exc:
            raise OSError(f"plan cache: cannot write {final} ({exc}); point ${ENV_VAR} or "
                          "PlanCache(directory=...) at a writable folder, or use "
                          "PlanCache(disk=False)") from exc
        finally:
            with contextlib.suppress(OSError):  # gone after os.replace, or never made
                tmp.unlink(missing_ok=True)
        self.stats.disk_writes += 1


_DEFAULT: dict[Path, PlanCache] = {}


def default_cache() -> PlanCache:
    """The process's cache for the current default directory (env var read on each call)."""
    d = resolve_cache_dir()
    if d not in _DEFAULT:
        _DEFAULT[d] = PlanCache(d)
    return _DEFAULT[d]
