"""The fast engine's SPM row-read counting per (cycle, line), split out of `fast.py`: numpy
keys (`_read_keys`) or compiled loops (`_compiled_read_counts`, under the folds' rent-or-buy
policy, docs/architecture.md#compiled-loops-rent-or-buy)."""

from __future__ import annotations

import functools

import numpy as np

from dataflow.arch.spec import SPMSpec
from dataflow.pe_array.fast_policy import compiled_fold_pays
from dataflow.spm.lines import line_of_row


def _read_keys(reads, spm) -> np.ndarray:
    """(cycle * lines + line) per row read; reads of one row in one cycle are one access
    (the line broadcasts it)."""
    if not reads:
        return np.zeros(0, np.int64)
    cyc = np.concatenate([c for c, _ in reads])
    row = np.concatenate([r for _, r in reads])
    span = int(row.max()) + 1
    keys = np.sort(cyc * span + row)  # sort + run-ends: far faster than np.unique's hashing
    uniq = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
    return (uniq // span) * spm.lines + line_of_row(uniq % span, spm)


def _compiled_read_counts(reads, spm: SPMSpec, n_cycles: int) -> np.ndarray | None:
    """`_read_keys` counted per (cycle, line) in compiled loops, when the fold policy says
    compiled code pays (`_compiled_fold_pays`: numba loaded, or numpy's time would pass its
    start-up): reads bucketed by cycle (a counting sort), a row read again in its cycle
    skipped (`last[row]` holds the cycle that read it last), each first read counted on its
    row's line. None where numpy counts them."""
    if not reads:
        return None
    total = sum(len(c) for c, _ in reads)
    if not compiled_fold_pays(4 * total, np.float32):
        return None
    cyc = np.concatenate([c for c, _ in reads])
    row = np.concatenate([r for _, r in reads])
    rows = int(row.max()) + 1
    if int(row.min()) < 0 or rows > 1 << 26:
        return None
    line = np.asarray(line_of_row(np.arange(rows, dtype=np.int64), spm), dtype=np.int64)
    rd = np.zeros((n_cycles, spm.lines), dtype=np.int64)
    _compiled_reads()(cyc, row, line, rd)
    return rd


def _read_count_loops(cyc, row, line, rd):  # pragma: no cover - compiled by numba
    n_cycles = rd.shape[0]
    start = np.zeros(n_cycles + 1, dtype=np.int64)
    for i in range(cyc.shape[0]):
        start[cyc[i] + 1] += 1
    for c in range(n_cycles):
        start[c + 1] += start[c]
    order = np.empty(cyc.shape[0], dtype=np.int64)
    fill = start[:n_cycles].copy()
    for i in range(cyc.shape[0]):
        order[fill[cyc[i]]] = i
        fill[cyc[i]] += 1
    last = np.full(line.shape[0], -1, dtype=np.int64)
    for j in range(cyc.shape[0]):
        i = order[j]
        r = row[i]
        if last[r] != cyc[i]:
            last[r] = cyc[i]
            rd[cyc[i], line[r]] += 1


@functools.cache
def _compiled_reads():
    import numba

    return numba.njit(cache=True)(_read_count_loops)
