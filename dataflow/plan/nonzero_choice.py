"""Which nonzero unroll a CSR program runs with (docs/conventions.md#nonzero-unroll).

`choose_unroll` compiles the program as lowered and with its nonzero loop unrolled by each
factor of `UNROLLS` (`dataflow.dfg.nonzero_unroll`), each by the compiler's own kernel search,
and keeps the one whose whole run on the fast engine (DRAM and stalls included) is fastest: a
first tile scaled to the iterations misjudged it (on default.yaml, 2048 x 1024 x 64 at 4 %,
the unrolled kernel's first tile measured faster and its run 4.7 % slower). Only a program
`nonzero_unroll.shape` accepts, on an array whose SIMD rows hold u words, with every
gathered operand finite (a padded nonzero multiplies its gathered row by zero: 0 * inf would
be NaN).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.graph import Program
from dataflow.dfg.nonzero_unroll import shape, unroll_nonzeros
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import Mapping
from dataflow.pe_array.simulate import simulate_mapping

#: (unroll factor, terms summed by a tree into one acc) tried; each factor divides the SIMD
#: row, so a row load of u words is one SPM row. Measured on CSR SpMM 4096^2 1 % x 64 on
#: mlx_4x4 (docs/conventions.md#nonzero-unroll), u = 4 and 8, and the u accumulations of one
#: address without the tree (maccs: no acc on the load/store unit, but u flushes at a row's
#: end, one write port a line) ran slower than u = 2 with the tree, so only that is tried
UNROLLS = ((2, True),)


def applies(program: Program, arch: ArchSpec) -> bool:
    """Whether `choose_unroll` tries anything for `program` (module docstring)."""
    if shape(program) is None:
        return False
    k = program.kernels[0]
    gathered = {n.buffer for n in k.nodes if n.op is Op.GATHER}
    inputs = program.input_map
    return all(b in inputs and np.isfinite(inputs[b]).all() for b in gathered)


def estimate(mapping: Mapping, arch: ArchSpec) -> float:
    """Cycles of the mapping's whole run on the fast engine (the system: DRAM, stalls)."""
    return float(simulate_mapping(mapping).cycles)


def choose_unroll(program: Program, arch: ArchSpec, compile_kernels: Callable,
                  base: tuple) -> tuple[tuple[int, bool], tuple]:
    """((u, tree), what `compile_kernels` returned for the program so unrolled) of the
    fastest of `base` (the program as lowered, compiled: u = 0) and each unroll in `UNROLLS`
    that the SIMD row holds."""
    if not applies(program, arch):
        return (0, False), base
    best = (estimate(base[0], arch), (0, False), base)
    for u, tree in UNROLLS:
        if arch.spm.words_per_row % u:
            continue
        unrolled = unroll_nonzeros(program, u, tree)
        if unrolled is None:
            continue
        got = compile_kernels(unrolled)
        cost = estimate(got[0], arch)
        if cost < best[0]:
            best = (cost, (u, tree), got)
    return best[1], best[2]
