"""What a dynamic sparse matmul reports: the micro-tile choices and `DynamicStats`."""

from __future__ import annotations

from dataclasses import dataclass

from dataflow.dynamic.microtile import GRANULARITIES

CHOICES = (*GRANULARITIES, "dense")


@dataclass(frozen=True)
class DynamicStats:
    """Where a dynamic sparse matmul's cycles and MACs went (cycles at the array clock)."""

    granularity: str
    sparsity: float  # measured fraction of zeros in A
    tile_density: float  # fraction of micro-tiles holding a nonzero (1.0 for dense)
    computed_macs: int  # MACs the matmul kernels issued (lanes counted), from the engine
    useful_macs: int  # MACs on A's nonzeros: nnz(A) * n
    index_cycles: int  # cycles of the run-time index build (scan + compaction kernels)
    compute_cycles: int  # cycles of everything else (gathers, matmul, write-back)
    cycles: int

    @property
    def wasted_macs(self) -> int:
        return self.computed_macs - self.useful_macs

    @property
    def wasted_fraction(self) -> float:
        return self.wasted_macs / self.computed_macs if self.computed_macs else 0.0

    def notes(self) -> tuple[str, ...]:
        return ((f"granularity {self.granularity}: sparsity {self.sparsity:.4f}, "
                 f"{100 * self.tile_density:.2f}% of micro-tiles nonzero"),
                (f"MACs computed {self.computed_macs:,}, useful {self.useful_macs:,}, "
                 f"wasted on zeros {self.wasted_macs:,} ({100 * self.wasted_fraction:.1f}%)"),
                f"index build {self.index_cycles:,} cycles, compute {self.compute_cycles:,} cycles")
