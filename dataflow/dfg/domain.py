"""Enumeration of a kernel's iteration domain, vectorised with numpy.

The fast engine and the mapper's tiling use this; the reference stepper walks the same domain
with plain nested Python loops, so the two are independent implementations.
"""

from __future__ import annotations

import numpy as np

from dataflow.dfg.graph import Kernel
from dataflow.errors import UserError


def enumerate_domain(kernel: Kernel, lanes: int = 1,
                     outer: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """All iterations in loop order: `{var: int64 array}`, one entry per iteration.

    The vector loop (if any) steps by `lanes`, its value being the first lane's element index.
    `outer=(lo, hi)` restricts the outermost loop to `range(lo, hi)` (one tile).
    """
    first = kernel.loops[0]
    if not first.is_dense:
        raise UserError(f"kernel {kernel.name!r}: the outermost loop must be dense")
    lo, hi = (0, first.extent) if outer is None else outer
    cols: dict[str, np.ndarray] = {first.var: np.arange(lo, hi, dtype=np.int64)}
    n = hi - lo
    for lp in kernel.loops[1:]:
        if lp.is_dense:
            step = lanes if lp.var == kernel.vector_var else 1
            vals = np.arange(0, lp.extent, step, dtype=np.int64)
            counts = np.full(n, len(vals), dtype=np.int64)
            new = np.tile(vals, n)
        else:
            pos = kernel.domain[lp.pos]
            parent = cols[lp.parent]
            start, stop = pos[parent], pos[parent + 1]
            counts = stop - start
            total = int(counts.sum())
            # position within each parent's run, then shift by that parent's start
            run_start = np.repeat(np.cumsum(counts) - counts, counts)
            new = np.arange(total, dtype=np.int64) - run_start + np.repeat(start, counts)
        cols = {v: np.repeat(a, counts) for v, a in cols.items()}
        cols[lp.var] = new
        n = len(new)
    return cols


def iterate_domain(kernel: Kernel, lanes: int = 1, outer: tuple[int, int] | None = None):
    """The same iterations as `enumerate_domain`, yielded one dict at a time (plain loops)."""
    first = kernel.loops[0]
    lo, hi = (0, first.extent) if outer is None else outer

    def rec(level: int, env: dict[str, int]):
        if level == len(kernel.loops):
            yield dict(env)
            return
        lp = kernel.loops[level]
        if level == 0:
            rng = range(lo, hi)
        elif lp.is_dense:
            rng = range(0, lp.extent, lanes if lp.var == kernel.vector_var else 1)
        else:
            pos = kernel.domain[lp.pos]
            p = env[lp.parent]
            rng = range(int(pos[p]), int(pos[p + 1]))
        for v in rng:
            env[lp.var] = v
            yield from rec(level + 1, env)

    yield from rec(0, {})


def num_iterations(kernel: Kernel, lanes: int = 1) -> int:
    """Iterations of the domain, counting the vector loop in vectors of `lanes` elements."""
    return len(enumerate_domain(kernel, lanes)[kernel.loops[0].var])
