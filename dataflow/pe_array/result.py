"""`SimResult`: what the engine returns (docs/architecture.md#objects-that-cross-stages)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where arrays are compared (`same_as`), so the
    # numpy-free timing path (dataflow/pe_array/systolic_timing.py) can build a SimResult
    import numpy as np


class Bound(str, Enum):
    """The resource whose floor is highest."""

    COMPUTE = "compute"
    DRAM = "dram"
    SPM_PORTS = "spm_ports"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Roofline:
    """The three floors in cycles (fractional: a bound, not a schedule); computed by
    `dataflow.pe_array.roofline`."""

    compute_cycles: float
    dram_cycles: float
    spm_port_cycles: float

    @property
    def cycles(self) -> float:
        return max(self.compute_cycles, self.dram_cycles, self.spm_port_cycles)

    @property
    def bound(self) -> Bound:
        floors = {Bound.COMPUTE: self.compute_cycles, Bound.DRAM: self.dram_cycles,
                  Bound.SPM_PORTS: self.spm_port_cycles}
        return max(floors, key=floors.get)  # ties: compute first, then DRAM

    def fraction(self, cycles: int) -> float:
        """Bound over achieved cycles (0 for an empty run)."""
        return self.cycles / cycles if cycles else 0.0

    def to_dict(self) -> dict:
        return {"compute": self.compute_cycles, "dram": self.dram_cycles,
                "spm_ports": self.spm_port_cycles, "cycles": self.cycles,
                "bound": str(self.bound)}


@dataclass(frozen=True)
class TileResult:
    """One tile of one kernel: array cycles (incl. SPM stalls) and its DMA traffic in bytes."""

    kernel: str
    index: int
    iterations: int
    compute_cycles: int
    stall_cycles_spm_conflict: int
    dram_bytes_read: int
    dram_bytes_written: int
    # one DMA transfer per buffer: (buffer, "read" | "write", bytes), in kernel buffer order
    dram_transfers: tuple[tuple[str, str, int], ...] = ()


@dataclass(frozen=True)
class ArrayResult:
    """Array-level outcome of one kernel, produced identically by both engines."""

    kernel: str
    tiles: tuple[TileResult, ...]
    pe_busy_cycles: np.ndarray  # (rows, cols) ops issued per PE
    spm_reads_per_line: np.ndarray
    spm_writes_per_line: np.ndarray
    spm_conflicts_per_line: np.ndarray  # extra cycles each line needed beyond its ports
    op_counts: tuple[tuple[str, int], ...]  # element ops by opcode (lanes counted)
    link_word_hops: int
    macs: int
    outputs: tuple[tuple[str, np.ndarray], ...]
    trace: tuple[tuple[int, tuple[int, int], str], ...] | None = None  # (cycle, PE, op)

    def same_as(self, other: ArrayResult) -> list[str]:
        """Names of the fields that differ (empty when identical, values bit for bit)."""
        import numpy as np

        diffs = []
        for name in ("kernel", "tiles", "op_counts", "link_word_hops", "macs"):
            if getattr(self, name) != getattr(other, name):
                diffs.append(name)
        for name in ("pe_busy_cycles", "spm_reads_per_line", "spm_writes_per_line",
                     "spm_conflicts_per_line"):
            if not np.array_equal(getattr(self, name), getattr(other, name)):
                diffs.append(name)
        a, b = dict(self.outputs), dict(other.outputs)
        if a.keys() != b.keys() or any(not np.array_equal(a[k], b[k]) for k in a):
            diffs.append("outputs")
        return diffs


@dataclass(frozen=True)
class SystemTimeline:
    """The system level's schedule of a run (`system.run_system`, or SCALE-Sim's memory model
    for systolic kernels, `systolic_memory.run_systolic_system`), in array cycles."""

    cycles: int
    stall_cycles_dram: int
    stall_cycles_reconfiguration: int
    kernel_spans: tuple[tuple[int, int], ...]  # (start, end) of each kernel on the array
    tile_spans: tuple[tuple[str, int, int, int], ...]  # (kernel, tile, start, end)
    # cycles the array waits for a producer kernel beyond its own loads: kernels run in program
    # order and a consumer's inputs arrive by its loads (counted as DRAM stalls), so this model
    # has none; the field keeps the rule here, where the waits are counted
    stall_cycles_dependency: int = 0


@dataclass(frozen=True)
class KernelResult:
    kernel: str
    start_cycle: int
    end_cycle: int
    compute_cycles: int
    ii: int
    mii: int
    copies: int
    tiles: tuple[TileResult, ...]
    roofline: Roofline | None = None  # this kernel's floors (`pe_array.roofline`)

    @property
    def span_cycles(self) -> int:
        return self.end_cycle - self.start_cycle

    @property
    def fraction_of_roofline(self) -> float | None:
        """The kernel's bound over its span on the system timeline."""
        return self.roofline.fraction(self.span_cycles) if self.roofline else None


@dataclass(frozen=True)
class SimResult:
    """Outcome of `simulate(mapping, arch)`. Cycles are array clock cycles; energy in pJ."""

    workload: str
    arch: str
    clock_ghz: float
    cycles: int
    compute_cycles: int
    stall_cycles_spm_conflict: int
    stall_cycles_dram: int
    stall_cycles_reconfiguration: int
    stall_cycles_dependency: int
    macs: int
    peak_macs_per_cycle: int
    pe_busy_cycles: np.ndarray
    spm_reads_per_line: np.ndarray
    spm_writes_per_line: np.ndarray
    spm_conflicts_per_line: np.ndarray
    dram_bytes_read: int
    dram_bytes_written: int
    energy_pj: tuple[tuple[str, float], ...]
    kernels: tuple[KernelResult, ...]
    output: np.ndarray | None
    engine: str
    trace: tuple | None = None
    notes: tuple[str, ...] = field(default=())
    values_match_reference: bool | None = None
    max_abs_error: float | None = None
    wall_seconds: float | None = None
    mapping_summary: str = ""
    # False for a timing-only run (`--timing-only`): no values were computed, `output` is None
    values_computed: bool = True
    area_mm2: tuple[tuple[str, float], ...] = ()  # by component (pe_array, spm, interconnect)
    dram_bytes_per_cycle: float = 0.0  # the arch's peak, for rooflines
    # ops a PE may issue a cycle (`pe_array.issue_width`): `pe_busy_cycles` counts ops, so
    # utilisation divides by it (docs/architecture.md#issue-width)
    issue_width: int = 1
    # (kernel, copy, node, op, pe_row, pe_col, time, latency, ii) per placed op, for Gantt charts
    schedule: tuple[tuple, ...] = ()
    tile_spans: tuple[tuple[str, int, int, int], ...] = ()  # (kernel, tile, start, end) cycles
    roofline: Roofline | None = None  # the run's floors (`pe_array.roofline`)

    @property
    def roofline_cycles(self) -> float | None:
        return self.roofline.cycles if self.roofline else None

    @property
    def bound(self) -> Bound | None:
        return self.roofline.bound if self.roofline else None

    @property
    def fraction_of_roofline(self) -> float | None:
        """The roofline bound over the achieved cycles (1.0 = at the bound)."""
        return self.roofline.fraction(self.cycles) if self.roofline else None

    @property
    def time_seconds(self) -> float:
        return self.cycles / (self.clock_ghz * 1e9)

    @property
    def stall_cycles(self) -> dict[str, int]:
        return {
            "spm_conflict": self.stall_cycles_spm_conflict,
            "dram_bandwidth": self.stall_cycles_dram,
            "reconfiguration": self.stall_cycles_reconfiguration,
            "dependency": self.stall_cycles_dependency,
        }

    @property
    def pe_utilization(self) -> float:
        """Share of the PEs' issue capacity used: ops issued over PE-cycles x issue width
        (docs/architecture.md#issue-width; with width 1, the PE-cycles that issued an op)."""
        slots = self.pe_busy_cycles.size * self.issue_width * self.cycles
        return float(self.pe_busy_cycles.sum()) / slots if self.cycles else 0.0

    @property
    def mac_utilization(self) -> float:
        """MACs the array issued (padding included) over its peak MACs in the elapsed cycles;
        the useful MACs are the roofline's compute floor times the peak."""
        return self.macs / (self.peak_macs_per_cycle * self.cycles) if self.cycles else 0.0

    @property
    def spm_reads(self) -> int:
        return int(self.spm_reads_per_line.sum())

    @property
    def spm_writes(self) -> int:
        return int(self.spm_writes_per_line.sum())

    @property
    def spm_conflict_cycles(self) -> int:
        return self.stall_cycles_spm_conflict

    @property
    def dram_bytes(self) -> int:
        return self.dram_bytes_read + self.dram_bytes_written

    @property
    def energy_total_pj(self) -> float:
        return float(sum(v for _, v in self.energy_pj))

    @property
    def area_total_mm2(self) -> float:
        return float(sum(v for _, v in self.area_mm2))

    def to_dict(self) -> dict:
        """Plain data (JSON-ready), without the output values and trace."""
        return {
            "workload": self.workload,
            "arch": self.arch,
            "engine": self.engine,
            "cycles": self.cycles,
            "compute_cycles": self.compute_cycles,
            "stall_cycles": self.stall_cycles,
            "time_seconds": self.time_seconds,
            "clock_ghz": self.clock_ghz,
            "macs": self.macs,
            "pe_utilization": self.pe_utilization,
            "issue_width": self.issue_width,
            "mac_utilization": self.mac_utilization,
            "spm_reads": self.spm_reads,
            "spm_writes": self.spm_writes,
            "spm_conflict_cycles": self.spm_conflict_cycles,
            "spm_reads_per_line": self.spm_reads_per_line.tolist(),
            "spm_writes_per_line": self.spm_writes_per_line.tolist(),
            "dram_bytes": self.dram_bytes,
            "dram_bytes_read": self.dram_bytes_read,
            "dram_bytes_written": self.dram_bytes_written,
            "energy_pj": dict(self.energy_pj),
            "energy_total_pj": self.energy_total_pj,
            "area_mm2": dict(self.area_mm2),
            "area_total_mm2": self.area_total_mm2,
            "kernels": [
                {"kernel": k.kernel, "start_cycle": k.start_cycle, "end_cycle": k.end_cycle,
                 "compute_cycles": k.compute_cycles, "ii": k.ii, "mii": k.mii,
                 "copies": k.copies, "tiles": len(k.tiles),
                 **_roofline_fields(k.roofline, k.span_cycles)}
                for k in self.kernels
            ],
            **_roofline_fields(self.roofline, self.cycles),
            "notes": list(self.notes),
            "values_computed": self.values_computed,
            "values_match_reference": self.values_match_reference,
            "max_abs_error": self.max_abs_error,
            "wall_seconds": self.wall_seconds,
            "mapping": self.mapping_summary,
        }


def _roofline_fields(roofline: Roofline | None, cycles: int) -> dict:
    """`roofline_cycles`, `bound`, `fraction_of_roofline` and the three floors, for JSON."""
    if roofline is None:
        return {"roofline_cycles": None, "bound": None, "fraction_of_roofline": None}
    return {"roofline_cycles": roofline.cycles, "bound": str(roofline.bound),
            "fraction_of_roofline": roofline.fraction(cycles), "roofline": roofline.to_dict()}
