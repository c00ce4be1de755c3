"""`Mapping`: where and when every DFG node runs, how the domain is tiled, where buffers live.

Produced by `dataflow.mapper.map_program`; consumed by the engines. Frozen, printable, and
checked by `dataflow.mapper.legality.check_mapping`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.graph import Kernel, Program
from dataflow.errors import UserError


class MappingError(UserError):
    """A program that cannot be mapped; the message names the resource that ran out."""


@dataclass(frozen=True)
class Placement:
    """Node `node` of body copy `copy` runs on PE (row, col) at `time` cycles after its
    iteration starts; it occupies slot `time % ii` of that PE every II cycles."""

    node: int
    copy: int
    pe: tuple[int, int]
    time: int
    latency: int


@dataclass(frozen=True)
class Route:
    """A value from `src` to `dst` (same copy) over `links`, leaving at `depart` cycles.
    A link is `((r0, c0), (r1, c1))`; hop h is used in cycle `depart + h * hop_latency`."""

    src: int
    dst: int
    copy: int
    links: tuple[tuple[tuple[int, int], tuple[int, int]], ...]
    depart: int


@dataclass(frozen=True)
class SPMAllocation:
    """Buffer `buffer` occupies SPM words [base, base + words) (twice, `double_buffered`)."""

    buffer: str
    base: int
    words: int
    streamed: bool  # re-loaded per tile (else resident for the whole kernel)
    base_alt: int | None = None  # the second half of a double buffer


@dataclass(frozen=True)
class Tile:
    """Outermost-loop range [lo, hi) and, per streamed buffer, the address window it touches."""

    lo: int
    hi: int
    windows: tuple[tuple[str, int, int], ...]  # (buffer, first word, one past last word)

    @cached_property
    def window_map(self) -> dict[str, tuple[int, int]]:
        return {b: (lo, hi) for b, lo, hi in self.windows}


@dataclass(frozen=True, eq=False)
class KernelMapping:
    kernel: Kernel
    copies: int
    ii: int
    res_mii: int
    rec_mii: int
    schedule_length: int
    placements: tuple[Placement, ...]
    routes: tuple[Route, ...]
    allocations: tuple[SPMAllocation, ...]
    tiles: tuple[Tile, ...]
    notes: tuple[str, ...] = ()

    @property
    def mii(self) -> int:
        return max(self.res_mii, self.rec_mii)

    @cached_property
    def allocation_map(self) -> dict[str, SPMAllocation]:
        return {a.buffer: a for a in self.allocations}

    @cached_property
    def placement_map(self) -> dict[tuple[int, int], Placement]:
        return {(p.copy, p.node): p for p in self.placements}

    def summary(self) -> str:
        return (f"{self.kernel.name}: {self.copies} copies x {len(self.kernel.nodes)} nodes, "
                f"II={self.ii} (ResMII={self.res_mii}, RecMII={self.rec_mii}), "
                f"schedule length {self.schedule_length}, {len(self.tiles)} tiles")


@dataclass(frozen=True, eq=False)
class SystolicMapping:
    """Dense GEMM C[M,N] = A[M,K] B[K,N] on a rows x cols systolic array.

    `dataflow` is `os`, `ws` or `is`; `sr`, `sc`, `t` are the GEMM dimensions that map to array
    rows, array columns and time (SCALE-Sim's convention, see `dataflow.pe_array.systolic`).
    """

    kernel: Kernel
    dataflow: str
    rows: int
    cols: int
    m: int
    n: int
    k: int
    # A's element addresses when elements share words (`GemmShape.a_addresses`), else None
    a_addresses: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def ii(self) -> int:
        return 1

    def summary(self) -> str:
        return (f"{self.kernel.name}: systolic {self.dataflow} on {self.rows}x{self.cols}, "
                f"GEMM M={self.m} N={self.n} K={self.k}")


@dataclass(frozen=True, eq=False)
class Mapping:
    program: Program
    arch: ArchSpec
    kernels: tuple[KernelMapping | SystolicMapping, ...]
    orchestration: str = "sequential"

    def summary(self) -> str:
        return "\n".join(k.summary() for k in self.kernels)
