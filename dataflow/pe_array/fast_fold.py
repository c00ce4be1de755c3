"""Accumulator runs folded for the fast engine (`fast.py`): a run of consecutive same-address
iterations of an ACC / ACC_MAX / SCATTER_ACC / MACC combines in its PE's register strictly left
to right, one rounding per step, and flushes once. `segment_fold` folds every run of a tile at
once (numpy by run length, or compiled loops where they pay: `fast_policy.compiled_fold_pays`);
`macc_fold` fuses a MACC's product into the compiled fold; `group_macc_fold` folds a group of
MACCs that share their inputs, each selecting a lane of input 0, in one pass.
docs/architecture.md#engine-speed-exact-shortcuts-of-the-fast-engine and
#sharing-and-compiled-gathers.
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np

from dataflow.dfg.graph import Node
from dataflow.pe_array.fast_policy import compiled_fold_pays, fold_spent
from dataflow.pe_array.semantics import ACC_IDENTITY, operands

# Deferred imports: numba is imported by the `_compiled_*` builders, on first use (start-up).

__all__ = ["MACC_GROUPS_ENV", "group_macc_fold", "macc_fold", "macc_groups_on", "segment_fold"]


def segment_fold(ufunc, identity, src: np.ndarray, ends: np.ndarray, dtype) -> np.ndarray:
    """reg[r] = identity . src[s_r] . src[s_r + 1] . ... . src[ends[r]], folded strictly left to
    right (one rounding per step, as a PE's register does), for the runs of consecutive rows
    that end at `ends` (sorted; the last is the last row). The same values as
    `ufunc.at(reg, run, src)`, faster: runs of one length are folded together as a
    (runs, length, lanes) block (a reshape when every run has that length, else a gather)."""
    src = np.asarray(src)
    ragged = len(ends) > 1 and not _one_length(ends)
    if compiled_fold_pays(src.size, dtype, ragged):
        out = np.empty((len(ends),) + src.shape[1:], dtype=dtype)
        src2 = src.astype(dtype, copy=False).reshape(len(src), -1)
        _compiled_fold()(src2, np.asarray(ends, np.int64), np.dtype(dtype).type(identity),
                         ufunc is np.maximum, out.reshape(len(ends), -1))
        return out
    t0 = time.perf_counter()
    try:
        return _segment_fold_numpy(ufunc, identity, src, ends, dtype)
    finally:
        fold_spent["numpy_s"] += time.perf_counter() - t0


def _segment_fold_numpy(ufunc, identity, src: np.ndarray, ends: np.ndarray, dtype):
    starts = np.concatenate(([0], ends[:-1] + 1))
    lens = ends - starts + 1
    ident = np.asarray(identity, dtype=dtype)
    if len(lens) and int(lens.min()) == int(lens.max()):  # every run one length: a reshape
        block = src.astype(dtype, copy=False).reshape((len(lens), int(lens[0])) + src.shape[1:])
        return _fold_block(ufunc, ident, block)
    reg = np.empty((len(ends),) + src.shape[1:], dtype=dtype)
    for length in np.unique(lens):
        which = np.flatnonzero(lens == length)
        idx = starts[which][:, None] + np.arange(length)
        reg[which] = _fold_block(ufunc, ident, src[idx].astype(dtype, copy=False))
    return reg


def _one_length(ends: np.ndarray) -> bool:
    """Whether the runs ending at `ends` all have one length."""
    return bool(ends[0] + 1 == ends[1] - ends[0]
                and (len(ends) == 2 or np.all(np.diff(ends) == ends[1] - ends[0])))


def _fold_loops(src, ends, ident, is_max, out):  # pragma: no cover - compiled by numba
    """`segment_fold` as loops: each run from `ident`, left to right, one rounding per step;
    the maximum as np.maximum computes it (NaN wins, the first operand on ties). The lanes
    are independent chains, stepped together."""
    width = src.shape[1]
    reg = np.empty(width, dtype=out.dtype)
    start = 0
    for r in range(ends.shape[0]):
        for lane in range(width):
            reg[lane] = ident
        for i in range(start, ends[r] + 1):
            if is_max:
                for lane in range(width):
                    x = src[i, lane]
                    a = reg[lane]
                    if not (a >= x or a != a):
                        reg[lane] = x
            else:
                for lane in range(width):
                    reg[lane] = reg[lane] + src[i, lane]
        for lane in range(width):
            out[r, lane] = reg[lane]
        start = ends[r] + 1


def macc_fold(ctx, vals, node: Node, shape, ends: np.ndarray) -> np.ndarray:
    """A MACC's flushed registers with the product fused into the compiled fold: each step
    adds the rounded product (`semantics.stored_value`: one rounded multiply, then the
    rounded add), no fused multiply-add."""
    a, b = (np.asarray(x).astype(ctx.dtype, copy=False)
            for x in operands(node, [vals[i] for i in node.inputs]))
    a, b = (np.broadcast_to(x if x.ndim == 2 else x.reshape(-1, 1), shape) for x in (a, b))
    out = np.empty((len(ends), shape[1]), dtype=ctx.dtype)
    _compiled_macc_fold()(a, b, np.asarray(ends, np.int64),
                          np.dtype(ctx.dtype).type(ACC_IDENTITY[node.op]), out)
    return out


def _macc_fold_loops(a, b, ends, ident, out):  # pragma: no cover - compiled by numba
    width = a.shape[1]
    reg = np.empty(width, dtype=out.dtype)
    start = 0
    for r in range(ends.shape[0]):
        for lane in range(width):
            reg[lane] = ident
        for i in range(start, ends[r] + 1):
            for lane in range(width):
                p = a[i, lane] * b[i, lane]
                reg[lane] = reg[lane] + p
        for lane in range(width):
            out[r, lane] = reg[lane]
        start = ends[r] + 1


#: Environment switch of the grouped MACC folds (`group_macc_fold`; on unless 0).
MACC_GROUPS_ENV = "DATAFLOW_MACC_GROUPS"


def macc_groups_on() -> bool:
    return os.environ.get(MACC_GROUPS_ENV, "1").strip().lower() not in ("0", "false", "no",
                                                                      "off")


def group_macc_fold(ctx, w, vals, node: Node, shape,
                     ends: np.ndarray) -> np.ndarray:
    """`macc_fold` of every MACC of `node`'s group at once (`_macc_group_loops`): each
    iteration reads input 1's lanes once and multiplies them by each member's lane of input 0
    (the rounded product, then the rounded add, one chain per member and lane, in order). The
    first member folds the group; the others take their registers from `w.group_regs`."""
    if node.id in w.group_regs:
        return w.group_regs.pop(node.id)
    ids = ctx.macc_groups[node.id]
    nodes = [ctx.km.kernel.nodes[i] for i in ids]
    a, b = (np.asarray(vals[i]).astype(ctx.dtype, copy=False) for i in node.inputs)
    b = np.broadcast_to(b if b.ndim == 2 else b.reshape(-1, 1), shape)
    lanes = np.array([n.lane for n in nodes], dtype=np.int64)
    out = np.empty((len(ids), len(ends), shape[1]), dtype=ctx.dtype)
    _compiled_macc_group()(a.reshape(len(a), -1), lanes, b, np.asarray(ends, np.int64),
                           np.dtype(ctx.dtype).type(ACC_IDENTITY[node.op]), out)
    for j, i in enumerate(ids):
        if i != node.id:
            w.group_regs[i] = out[j]
    return out[ids.index(node.id)]


def _macc_group_loops(a, lanes, b, ends, ident, out):  # pragma: no cover - compiled by numba
    """out[g, r, l] = ident + a[i, lanes[g]] * b[i, l] + ... over run r's iterations i, in
    order, one rounding per multiply and per add (independent chains, stepped together)."""
    groups, width = lanes.shape[0], b.shape[1]
    reg = np.empty((groups, width), dtype=out.dtype)
    start = 0
    for r in range(ends.shape[0]):
        for g in range(groups):
            for lane in range(width):
                reg[g, lane] = ident
        for i in range(start, ends[r] + 1):
            for g in range(groups):
                x = a[i, lanes[g]]
                for lane in range(width):
                    p = x * b[i, lane]
                    reg[g, lane] = reg[g, lane] + p
        for g in range(groups):
            for lane in range(width):
                out[g, r, lane] = reg[g, lane]
        start = ends[r] + 1


@functools.cache
def _compiled_macc_group():
    import numba

    return numba.njit(cache=True)(_macc_group_loops)


@functools.cache
def _compiled_macc_fold():
    import numba

    return numba.njit(cache=True)(_macc_fold_loops)


@functools.cache
def _compiled_fold():
    import numba

    return numba.njit(cache=True)(_fold_loops)


def _fold_block(ufunc, ident: np.ndarray, block: np.ndarray) -> np.ndarray:
    """Fold (runs, length, ...) along its second axis, left to right, from `ident`: one ufunc
    call per position when each call has enough work, else `ufunc.accumulate` (which also
    combines in order, never pairwise)."""
    runs, length = block.shape[:2]
    reg = ufunc(ident, block[:, 0])
    if length == 1:
        return reg
    if reg.size >= 256 or length <= 16:
        for j in range(1, length):
            ufunc(reg, block[:, j], out=reg)
        return reg
    block = block.copy()
    block[:, 0] = reg
    return ufunc.accumulate(block, axis=1)[:, -1]
