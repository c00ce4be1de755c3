"""Semantic checks of an `ArchSpec`: values a real machine cannot have."""

from __future__ import annotations

import math

from dataflow.arch.errors import ArchError
from dataflow.arch.limits import (
    MAX_RECONFIGURABLE_SIDE,
    MAX_SIMD_LANES,
    MAX_SPM_LINES,
    MAX_SYSTOLIC_SIDE,
    shown,
)
from dataflow.arch.spec import AddressMapping, ArchSpec, PEKind, Topology
from dataflow.dfg.ops import Op

# the YAML loader already refuses other words; these catch a spec edited in code
# (`dataclasses.replace(spm, address_mapping="hashed")`)
PE_KINDS = tuple(k.value for k in PEKind)
TOPOLOGIES = tuple(t.value for t in Topology)
ADDRESS_MAPPINGS = tuple(m.value for m in AddressMapping)
#: most SPM slots per streamed input (`dram.tile_buffers`): beyond a few the DMA is never the
#: reason a tile waits, and each slot is a tile's inputs more in the SPM
MAX_TILE_BUFFERS = 8
DTYPES = {"float32": 4, "float16": 2, "float64": 8, "int32": 4, "int8": 1}


class _Checks:
    """The checks of one spec: each failure is an `ArchError` naming its file and key path."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, msg: str) -> None:
        raise ArchError(self.source, key, msg)

    def positive(self, key: str, value: float) -> None:
        if not value > 0:  # NaN fails every comparison
            self.fail(key, f"must be > 0, got {value}")
        if not math.isfinite(value):
            self.fail(key, f"must be finite, got {value}")

    def non_negative(self, key: str, value: float) -> None:
        if not value >= 0:
            self.fail(key, f"must be >= 0, got {value}")
        if not math.isfinite(value):
            self.fail(key, f"must be finite, got {value}")

    def at_most(self, key: str, value: int, limit: int, why: str = "") -> None:
        if value > limit:
            self.fail(key, f"{value} is beyond the limit of {limit}{why} "
                           "(docs/conventions.md#limits)")


def validate_arch(spec: ArchSpec) -> None:
    """Raise `ArchError` (file + key path) on the first impossible value."""
    c = _Checks(spec.source)
    _check_pe_array(c, spec)
    _check_interconnect(c, spec)
    _check_spm(c, spec)
    c.positive("dram.bytes_per_cycle", spec.dram.bytes_per_cycle)
    c.non_negative("dram.latency_cycles", spec.dram.latency_cycles)
    c.positive("dram.channels", spec.dram.channels)
    c.positive("dram.dma_engines", spec.dram.dma_engines)
    if not 2 <= spec.dram.tile_buffers <= MAX_TILE_BUFFERS:
        c.fail("dram.tile_buffers",
               f"must be 2 (double buffering) to {MAX_TILE_BUFFERS}, got {spec.dram.tile_buffers}")
    c.positive("clock_ghz", spec.clock_ghz)
    if spec.dtype not in DTYPES:
        c.fail("dtype", f"must be one of {sorted(DTYPES)}, got {spec.dtype!r}")
    if DTYPES[spec.dtype] != spec.word_bytes:
        c.fail("word_bytes",
               f"{spec.dtype} words are {DTYPES[spec.dtype]} bytes, got {spec.word_bytes}")
    c.non_negative("reconfiguration_cycles", spec.reconfiguration_cycles)
    for name, value in vars(spec.energy).items():
        c.non_negative(f"energy.{name}", value)
    for name, value in vars(spec.area).items():
        c.non_negative(f"area.{name}", value)


def _check_pe_array(c: _Checks, spec: ArchSpec) -> None:
    pe = spec.pe_array
    c.positive("pe_array.rows", pe.rows)
    c.positive("pe_array.cols", pe.cols)
    c.positive("pe_array.simd_lanes", pe.simd_lanes)
    c.positive("pe_array.register_file_entries", pe.register_file_entries)
    c.positive("pe_array.instruction_entries", pe.instruction_entries)
    if pe.kind not in PE_KINDS:
        c.fail("pe_array.kind", f"must be one of {PE_KINDS}, got {pe.kind!r}")
    # sizes the mapper does not handle in reasonable time, refused before it starts
    if pe.kind == PEKind.SYSTOLIC:
        side, why = MAX_SYSTOLIC_SIDE, " for a systolic array"
    else:
        side, why = (MAX_RECONFIGURABLE_SIDE, " for a reconfigurable array (planning a "
                     "larger one takes tens of seconds)")
    c.at_most("pe_array.rows", pe.rows, side, why)
    c.at_most("pe_array.cols", pe.cols, side, why)
    c.at_most("pe_array.simd_lanes", pe.simd_lanes, MAX_SIMD_LANES)
    known_ops = {op.value for op in Op}
    seen: dict[str, str] = {}
    for i, fu in enumerate(pe.functional_units):
        key = f"pe_array.functional_units[{i}]"
        c.positive(f"{key}.latency_cycles", fu.latency_cycles)
        c.positive(f"{key}.issue_interval_cycles", fu.issue_interval_cycles)
        if not fu.ops:
            c.fail(f"{key}.ops", "a functional unit must execute at least one op")
        for op in fu.ops:
            if op not in known_ops:
                c.fail(f"{key}.ops",
                       f"unknown op {shown(op)}; known ops: {', '.join(sorted(known_ops))}")
            if op in seen:
                c.fail(f"{key}.ops", f"op {op!r} is already executed by unit {seen[op]!r}")
            seen[op] = fu.name
    c.positive("pe_array.issue_width", pe.issue_width)
    if pe.kind == PEKind.RECONFIGURABLE and pe.issue_width > len(pe.functional_units):
        c.fail("pe_array.issue_width",
               f"a PE issues each op of a cycle on a different functional unit: at most "
               f"{len(pe.functional_units)} (the units of pe_array.functional_units), "
               f"got {pe.issue_width}")
    if pe.kind == PEKind.RECONFIGURABLE:
        for op in ("load", "store", "mul", "add", "mac"):
            if op not in seen:
                c.fail("pe_array.functional_units", f"no functional unit executes {op!r}")


def _check_interconnect(c: _Checks, spec: ArchSpec) -> None:
    ic, pe = spec.interconnect, spec.pe_array
    if ic.topology not in TOPOLOGIES:
        c.fail("interconnect.topology", f"must be one of {TOPOLOGIES}, got {ic.topology!r}")
    c.positive("interconnect.hop_latency_cycles", ic.hop_latency_cycles)
    c.positive("interconnect.link_width_words", ic.link_width_words)
    c.positive("interconnect.links_per_direction", ic.links_per_direction)
    for i, s in enumerate(ic.skip_hop_strides):
        if s < 2 or s >= max(pe.rows, pe.cols):
            c.fail(f"interconnect.skip_hop_strides[{i}]",
                   f"stride must be in [2, {max(pe.rows, pe.cols) - 1}] for a "
                   f"{pe.rows}x{pe.cols} array, got {s}")


def _check_spm(c: _Checks, spec: ArchSpec) -> None:
    spm, pe = spec.spm, spec.pe_array
    c.positive("spm.lines", spm.lines)
    c.at_most("spm.lines", spm.lines, MAX_SPM_LINES)
    c.positive("spm.words_per_row", spm.words_per_row)
    c.positive("spm.capacity_words_per_line", spm.capacity_words_per_line)
    c.positive("spm.read_ports_per_line", spm.read_ports_per_line)
    c.positive("spm.write_ports_per_line", spm.write_ports_per_line)
    c.positive("spm.access_latency_cycles", spm.access_latency_cycles)
    if spm.write_queue_depth < 0:
        c.fail("spm.write_queue_depth", f"must be >= 0, got {spm.write_queue_depth}")
    if spm.address_mapping not in ADDRESS_MAPPINGS:
        c.fail("spm.address_mapping",
               f"must be one of {ADDRESS_MAPPINGS}, got {spm.address_mapping!r}")
    if spm.address_mapping == AddressMapping.XOR and spm.lines & (spm.lines - 1):
        c.fail("spm.address_mapping", "'xor' needs a power-of-two number of lines, got "
                                      f"spm.lines = {spm.lines}")
    if spm.capacity_words_per_line % spm.words_per_row:
        c.fail("spm.capacity_words_per_line",
               f"must be a multiple of spm.words_per_row ({spm.words_per_row}), "
               f"got {spm.capacity_words_per_line}")
    if pe.kind == PEKind.RECONFIGURABLE and spm.words_per_row < pe.simd_lanes:
        c.fail("spm.words_per_row",
               f"a row ({spm.words_per_row} words) must hold one SIMD vector "
               f"(pe_array.simd_lanes = {pe.simd_lanes})")
