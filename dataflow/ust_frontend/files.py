"""Reading sparse tensors from Matrix Market (.mtx) and FROSTT (.tns) files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dataflow.errors import UserError

from .named import NamedFormats
from .storage import build

# Deferred imports: scipy.io is imported where a Matrix Market file is read (start-up).


def read_tensor_file(cls, path: str | os.PathLike):
    """A COO tensor (sorted, duplicates kept) from a .mtx or .tns file."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".mtx":
        import scipy.io

        matrix = scipy.io.mmread(path)
        if not hasattr(matrix, "tocoo"):  # an "array" (dense) Matrix Market file
            return cls.from_dense(matrix)
        coo = matrix.tocoo()
        coords, values, shape = [coo.row, coo.col], coo.data, coo.shape
    elif suffix == ".tns":
        coords, values, shape = _read_tns(path)
    else:
        raise UserError(f"{path}: unknown tensor file type {suffix!r} (use .mtx or .tns)")
    fmt = NamedFormats.coo(len(shape))
    storage = build(fmt, shape, coords, values)
    return cls(fmt, shape, storage.pos, storage.crd, storage.val)


def _read_tns(path: Path):
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if text:
            rows.append((number, text.split()))
    if not rows:
        raise UserError(f"{path}: no entries")
    width = len(rows[0][1])
    for number, fields in rows:
        if len(fields) != width:
            raise UserError(f"{path}:{number}: expected {width} columns, found {len(fields)}")
    if width < 2:
        raise UserError(f"{path}:{rows[0][0]}: a .tns line needs coordinates and a value")
    table = [fields for _, fields in rows]
    try:
        coords = np.array([[int(f) for f in fields[:-1]] for fields in table], np.int64)
        values = np.array([float(fields[-1]) for fields in table])
    except ValueError as exc:
        raise UserError(f"{path}: {exc}") from None
    if (coords < 1).any():
        bad = rows[int(np.flatnonzero((coords < 1).any(axis=1))[0])][0]
        raise UserError(f"{path}:{bad}: FROSTT coordinates are 1-based")
    coords -= 1
    shape = tuple(int(n) + 1 for n in coords.max(axis=0))
    return list(coords.T), values, shape
