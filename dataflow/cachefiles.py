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
- `frame_entry` / `unframe_entry`: the one framing of every cache file: a JSON header line
  `{"fingerprint": <code fingerprint>, "format": "dataflow-<kind>/<version>", "sha256": <of the
  payload>}\n`, then the payload. A file whose header or checksum does not match is never
  handed to a loader, so a flipped byte costs a rebuild, never a wrong or crashing plan.
- `read_entry` / `write_entry`: a framed file read back through the caller's loader (a file
  that fails its frame or its loader is deleted: a rebuild, never a failure) and written
  atomically (a read-only folder costs a rebuild, never a failure).
- `BoundedCache`: a small LRU dict for process-wide memo tables (never unbounded).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import os
import pickle
import uuid
from collections import OrderedDict
from functools import cache
from pathlib import Path
from typing import Any, Callable

ENV_VAR = "DATAFLOW_CACHE_DIR"
DEFAULT_DIR = Path("~/.cache/dataflow/plans")
PACKAGE_ROOT = Path(__file__).resolve().parent
#: packages whose sources decide a cached plan or a cached planning choice
FINGERPRINT_PACKAGES = ("arch", "dfg", "dfg/index", "mapper", "pe_array", "spm", "plan")
#: single modules outside those packages that cached objects depend on (index_operands: which
#: lowering a frontend plan's program comes from)
FINGERPRINT_MODULES = ("cachefiles.py", "errors.py", "testing.py", "ust_frontend/plan.py",
                       "ust_frontend/index_operands.py")


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


class EntryFault(enum.Enum):
    """Why a cache file was not used (the words callers keep in their discard reasons)."""

    BAD_HEADER = "not a cache file of this kind (bad header)"
    STALE = "stale: written by another version"
    CORRUPT = "corrupt"


class CacheEntryError(Exception):
    """A cache file that must be discarded; `fault` says which kind of damage, `str()` why."""

    def __init__(self, fault: EntryFault, detail: str = ""):
        self.fault = fault
        super().__init__(f"{fault.value} ({detail})" if detail else fault.value)


def entry_prefix(kind: str, version: int) -> bytes:
    """What every file of `kind` written by this code starts with: its header line up to the
    checksum's value."""
    return (f'{{"fingerprint": "{code_fingerprint()}", "format": "dataflow-{kind}/{version}", '
            f'"sha256": "').encode()


def frame_entry(kind: str, version: int, payload: bytes) -> bytes:
    """One JSON header line (code fingerprint, kind and format version, SHA-256 of `payload`),
    then `payload`."""
    digest = hashlib.sha256(payload).hexdigest()
    return entry_prefix(kind, version) + f'{digest}"}}\n'.encode() + payload


def unframe_entry(kind: str, version: int, blob: bytes) -> bytes:
    """The payload of a file written by `frame_entry`; CacheEntryError unless the header line
    is byte for byte the one this code writes for that payload (kind, format version, code
    fingerprint and checksum all match)."""
    line, newline, payload = blob.partition(b"\n")
    want = frame_entry(kind, version, payload).partition(b"\n")[0]
    if newline and line == want:
        return payload
    if not blob.startswith(b'{"fingerprint": "'):
        # the text header of format 1 plan files is an older version, anything else garbage
        if blob.startswith(f"dataflow-{kind} ".encode()):
            raise CacheEntryError(EntryFault.STALE, repr(line[:80].decode(errors="replace")))
        raise CacheEntryError(EntryFault.BAD_HEADER)
    written = _header_fields(line)
    expected = (f"dataflow-{kind}/{version}", code_fingerprint())
    if written is not None and written != expected:
        raise CacheEntryError(EntryFault.STALE, f"{' '.join(written)!r}, expected "
                                                f"{' '.join(expected)!r}")
    if not newline or written is None:
        raise CacheEntryError(EntryFault.CORRUPT, "malformed header line")
    raise CacheEntryError(EntryFault.CORRUPT, "checksum mismatch")


def _header_fields(line: bytes) -> tuple[str, str] | None:
    """(format, fingerprint) of a well-formed header line, else None."""
    try:
        fields = json.loads(line)
    except ValueError:  # also UnicodeDecodeError
        return None
    if not isinstance(fields, dict) or set(fields) != {"fingerprint", "format", "sha256"} or \
            not all(isinstance(v, str) and v.isprintable() for v in fields.values()):
        return None
    return fields["format"], fields["fingerprint"]


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


#: what a loader of a damaged or foreign payload raises (pickle's and JSON's failures, and the
#: ValueError a loader raises for content it rejects)
LOAD_ERRORS = (CacheEntryError, pickle.UnpicklingError, EOFError, AttributeError, ImportError,
               IndexError, KeyError, TypeError, ValueError)


def read_entry(path: Path, kind: str, version: int, load: Callable[[bytes], Any],
               errors: tuple[type[BaseException], ...] = LOAD_ERRORS) -> Any:
    """`load(payload)` of the file `frame_entry` wrote at `path`, or None when there is none (or
    it cannot be read). A file that fails its frame, or whose payload `load` rejects with one
    of `errors`, is deleted, so the caller rebuilds and rewrites it."""
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    try:
        return load(unframe_entry(kind, version, blob))
    except (CacheEntryError, *errors):
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return None


def write_entry(path: Path, kind: str, version: int, payload: bytes) -> None:
    """`payload` framed (`frame_entry`) and written atomically at `path`; a folder that cannot
    be written costs the next process a rebuild, never a failure."""
    try:
        atomic_write_bytes(path, frame_entry(kind, version, payload))
    except OSError:
        pass


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
