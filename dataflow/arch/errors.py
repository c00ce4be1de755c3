"""The error of a bad architecture description."""

from __future__ import annotations

from dataflow.errors import KeyPathError


class ArchError(KeyPathError):
    """A bad architecture description: `source` is the file, `key_path` the dotted key."""
