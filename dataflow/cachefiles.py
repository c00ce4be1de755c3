"""Helpers every on-disk and in-memory cache of the project shares (a declared leaf module:
it imports nothing from `dataflow`, so any layer may use it).

- `resolve_cache_dir`: the cache folder (argument, else `$DATAFLOW_CACHE_DIR`, else
  `~/.cache/dataflow/plans`).
- `code_fingerprint`: a hash of every source file a cached decision can depend on. A file
  written by other code is stale. The plan cache stores mappings (arch, dfg, mapper), and the
  planning layer scores its choices with the engine (pe_array, spm), so all of those count;
  `tests/test_layers.py` checks that the fingerprint covers every module the cached code
  imports, transitively.
- `atomic_write_bytes`: write to a temporary name, then `os.replace`, so a reader sees the old
  file or the whole new one.
- `BoundedCache`: a small LRU dict for process-wide memo tables (never unbounded).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections import OrderedDict
from functools import cache
from pathlib import Path
from typing import Any

ENV_VAR = "DATAFLOW_CACHE_DIR"
DEFAULT_DIR = Path("~/.cache/dataflow/plans")
PACKAGE_ROOT = Path(__file__).resolve().parent
#: packages whose sources decide a cached plan or a cached planning choice
FINGERPRINT_PACKAGES = ("arch", "dfg", "mapper", "pe_array", "spm", "plan")
#: single modules outside those packages that cached objects depend on
FINGERPRINT_MODULES = ("cachefiles.py", "errors.py", "testing.py", "ust_frontend/plan.py")


def resolve_cache_dir(directory: str | os.PathLike | None = None) -> Path:
    if directory is not None:
        return Path(directory).expanduser()
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else DEFAULT_DIR.expanduser()


def fingerprint_files() -> list[Path]:
    """The source files `code_fingerprint` hashes, in a fixed order."""
    files = [p for d in FINGERPRINT_PACKAGES for p in sorted((PACKAGE_ROOT / d).glob("*.py"))]
    return files + [PACKAGE_ROOT / f for f in FINGERPRINT_MODULES]


@cache
def code_fingerprint() -> str:
    h = hashlib.sha256()
    for p in fingerprint_files():
        h.update(str(p.relative_to(PACKAGE_ROOT)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (parents made); OSError propagates to the caller."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)  # atomic: readers see the old file or the whole new one
    finally:
        with contextlib.suppress(OSError):  # gone after os.replace, or never made
            tmp.unlink(missing_ok=True)


class BoundedCache:
    """At most `max_entries` items, least recently used dropped first."""

    def __init__(self, max_entries: int):
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._items: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key, default=None):
        if key not in self._items:
            return default
        self._items.move_to_end(key)
        return self._items[key]

    def put(self, key, value) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)

    def __contains__(self, key) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()
