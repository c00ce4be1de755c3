"""`ArchSpec`: the hardware description shared by the mapper and the engine.

Every field is a plain typed value so the spec is hashable (a plan-cache key), printable and
round-trips through YAML. The fields a caller branches on are `str` enums: a member equals,
hashes and JSON-encodes as its YAML word, so cache keys and architecture hashes are the same
whether a spec holds the member or the plain string (`dataclasses.replace(spm,
address_mapping="xor")`); compare with `==`, not `is`, for that reason. Units are in the
field names or docstrings: cycles, words, bytes, pJ, mm². Validation of values that are
impossible for hardware lives in `validate.py`, not here: no computation in constructors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class PEKind(str, Enum):
    """`pe_array.kind`: a modulo-scheduled CGRA or a systolic array (dense GEMM only)."""

    RECONFIGURABLE = "reconfigurable"
    SYSTOLIC = "systolic"

    def __str__(self) -> str:  # messages and f-strings print the YAML word
        return self.value


class Topology(str, Enum):
    """`interconnect.topology`: nearest-neighbour links, with or without wrap-around."""

    MESH = "mesh"
    TORUS = "torus"

    def __str__(self) -> str:
        return self.value


class AddressMapping(str, Enum):
    """`spm.address_mapping`: which SPM line a word address lives on (`dataflow.spm.lines`)."""

    INTERLEAVED = "interleaved"
    BLOCKED = "blocked"
    XOR = "xor"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class FunctionalUnit:
    """One functional-unit kind available in every PE.

    `ops` are opcode names from `dataflow.dfg.ops.Op` (lower-case). `latency_cycles` is the
    result latency; `issue_interval_cycles` is how often a new op can start (1 = pipelined).
    """

    name: str
    ops: tuple[str, ...]
    latency_cycles: int = 1
    issue_interval_cycles: int = 1


@dataclass(frozen=True)
class PEArraySpec:
    """The PE grid. `kind` is `reconfigurable` (modulo-scheduled CGRA) or `systolic`
    (`PEKind`).

    `issue_width`: ops a PE may issue in one cycle, each on a different functional unit (a
    unit still issues once per its `issue_interval_cycles`); 1 is a single-issue PE, more
    models decoupled per-unit pipelines such as MLX's load / store / compute / transfer
    pipelines (docs/references.md#mlx, docs/architecture.md#issue-width)."""

    rows: int
    cols: int
    kind: PEKind = PEKind.RECONFIGURABLE
    simd_lanes: int = 1
    register_file_entries: int = 16
    instruction_entries: int = 32
    functional_units: tuple[FunctionalUnit, ...] = ()
    issue_width: int = 1

    @property
    def num_pes(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class InterconnectSpec:
    """Links between PEs. `skip_hop_strides` adds links of those strides along rows and columns
    (MLX's "skip-hop" links that butterfly strides need)."""

    topology: Topology = Topology.MESH
    hop_latency_cycles: int = 1
    link_width_words: int = 1
    links_per_direction: int = 1
    skip_hop_strides: tuple[int, ...] = ()


@dataclass(frozen=True)
class SPMSpec:
    """The multi-line scratchpad.

    A word address `a` lives on line `line_of(a)` (`AddressMapping`): `interleaved` puts
    consecutive rows on consecutive lines, `blocked` gives each line one contiguous range of
    `capacity_words_per_line`, `xor` folds higher row bits into the line index.
    Each line serves `read_ports_per_line` reads and `write_ports_per_line` writes per cycle; one
    access moves one row of `words_per_row` words.
    """

    lines: int
    words_per_row: int
    capacity_words_per_line: int
    read_ports_per_line: int = 1
    write_ports_per_line: int = 1
    access_latency_cycles: int = 1
    address_mapping: AddressMapping = AddressMapping.INTERLEAVED
    # stores a line can hold pending beyond its write ports (a decoupled store pipeline, as in
    # MLX's decoupled load / store / compute / transfer pipelines, docs/references.md#mlx); 0: none,
    # a store that finds no free write port stalls the array
    write_queue_depth: int = 0

    @property
    def capacity_words(self) -> int:
        return self.lines * self.capacity_words_per_line


@dataclass(frozen=True)
class DRAMSpec:
    """Off-chip memory as seen by the DMA engines: `bytes_per_cycle` at the array clock.
    `prefetch_next_kernel`: the DMA loads the next kernel's first-tile program inputs while the
    current kernel runs, where the SPM has room (docs/conventions.md#system-level).
    `tile_buffers`: SPM slots per streamed input, where the SPM has room for them: 2 is double
    buffering (one tile's loads in flight while the array computes on the other slot); n > 2
    keeps up to n - 1 tiles' loads in flight at once (docs/conventions.md#deeper-tile-buffers)."""

    bytes_per_cycle: float
    latency_cycles: int = 100
    channels: int = 1
    dma_engines: int = 1
    prefetch_next_kernel: bool = True
    tile_buffers: int = 2


@dataclass(frozen=True)
class EnergyTable:
    """Energy per action in pJ. Defaults: Horowitz, ISSCC 2014, 45 nm (docs/references.md)."""

    mac_pj: float = 4.6  # FP32 mult 3.7 + FP32 add 0.9
    alu_pj: float = 0.9  # FP32 add
    sfu_pj: float = 14.8  # exp / divide on the special-function unit: ~4 FP32 mults (assumption)
    spm_access_pj: float = 10.0  # 64-bit read of an 8 KB SRAM
    dram_byte_pj: float = 20.0  # 64-bit DRAM access 1.3-2.6 nJ -> ~160-320 pJ/B; conservative low
    link_hop_pj: float = 0.5
    reconfiguration_pj: float = 100.0


@dataclass(frozen=True)
class AreaTable:
    """Area per component in mm²."""

    pe_mm2: float = 0.05
    spm_line_mm2: float = 0.1
    router_mm2: float = 0.01


@dataclass(frozen=True)
class ArchSpec:
    """A whole accelerator. Load with `dataflow.load_arch(path)`."""

    name: str
    pe_array: PEArraySpec
    spm: SPMSpec
    dram: DRAMSpec
    interconnect: InterconnectSpec = field(default_factory=InterconnectSpec)
    clock_ghz: float = 1.0
    word_bytes: int = 4
    dtype: str = "float32"
    reconfiguration_cycles: int = 0
    energy: EnergyTable = field(default_factory=EnergyTable)
    area: AreaTable = field(default_factory=AreaTable)
    source: str = ""  # file it came from, for error messages and reports

    def fu_for(self, op_name: str) -> FunctionalUnit:
        """The functional unit that executes `op_name` (raises KeyError naming the op)."""
        for fu in self.pe_array.functional_units:
            if op_name in fu.ops:
                return fu
        raise KeyError(f"architecture {self.name!r} has no functional unit for op {op_name!r}")

    def op_latency(self, op_name: str) -> int:
        return self.fu_for(op_name).latency_cycles
