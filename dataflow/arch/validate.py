"""Semantic checks of an `ArchSpec`: values a real machine cannot have."""

from __future__ import annotations

from dataflow.arch.errors import ArchError
from dataflow.arch.spec import AddressMapping, ArchSpec, PEKind, Topology
from dataflow.dfg.ops import Op

# the YAML loader already refuses other words; these catch a spec edited in code
# (`dataclasses.replace(spm, address_mapping="hashed")`)
PE_KINDS = tuple(k.value for k in PEKind)
TOPOLOGIES = tuple(t.value for t in Topology)
ADDRESS_MAPPINGS = tuple(m.value for m in AddressMapping)
DTYPES = {"float32": 4, "float16": 2, "float64": 8, "int32": 4, "int8": 1}


def validate_arch(spec: ArchSpec) -> None:
    """Raise `ArchError` (file + key path) on the first impossible value."""
    def fail(key: str, msg: str) -> None:
        raise ArchError(spec.source, key, msg)

    def positive(key: str, value: float) -> None:
        if value <= 0:
            fail(key, f"must be > 0, got {value}")

    def non_negative(key: str, value: float) -> None:
        if value < 0:
            fail(key, f"must be >= 0, got {value}")

    pe = spec.pe_array
    positive("pe_array.rows", pe.rows)
    positive("pe_array.cols", pe.cols)
    positive("pe_array.simd_lanes", pe.simd_lanes)
    positive("pe_array.register_file_entries", pe.register_file_entries)
    positive("pe_array.instruction_entries", pe.instruction_entries)
    if pe.kind not in PE_KINDS:
        fail("pe_array.kind", f"must be one of {PE_KINDS}, got {pe.kind!r}")
    known_ops = {op.value for op in Op}
    seen: dict[str, str] = {}
    for i, fu in enumerate(pe.functional_units):
        key = f"pe_array.functional_units[{i}]"
        positive(f"{key}.latency_cycles", fu.latency_cycles)
        positive(f"{key}.issue_interval_cycles", fu.issue_interval_cycles)
        if not fu.ops:
            fail(f"{key}.ops", "a functional unit must execute at least one op")
        for op in fu.ops:
            if op not in known_ops:
                fail(f"{key}.ops", f"unknown op {op!r}; known ops: {', '.join(sorted(known_ops))}")
            if op in seen:
                fail(f"{key}.ops", f"op {op!r} is already executed by unit {seen[op]!r}")
            seen[op] = fu.name
    if pe.kind == PEKind.RECONFIGURABLE:
        for op in ("load", "store", "mul", "add", "mac"):
            if op not in seen:
                fail("pe_array.functional_units", f"no functional unit executes {op!r}")

    ic = spec.interconnect
    if ic.topology not in TOPOLOGIES:
        fail("interconnect.topology", f"must be one of {TOPOLOGIES}, got {ic.topology!r}")
    positive("interconnect.hop_latency_cycles", ic.hop_latency_cycles)
    positive("interconnect.link_width_words", ic.link_width_words)
    positive("interconnect.links_per_direction", ic.links_per_direction)
    for i, s in enumerate(ic.skip_hop_strides):
        if s < 2 or s >= max(pe.rows, pe.cols):
            fail(f"interconnect.skip_hop_strides[{i}]",
                 f"stride must be in [2, {max(pe.rows, pe.cols) - 1}] for a "
                 f"{pe.rows}x{pe.cols} array, got {s}")

    spm = spec.spm
    positive("spm.lines", spm.lines)
    positive("spm.words_per_row", spm.words_per_row)
    positive("spm.capacity_words_per_line", spm.capacity_words_per_line)
    positive("spm.read_ports_per_line", spm.read_ports_per_line)
    positive("spm.write_ports_per_line", spm.write_ports_per_line)
    positive("spm.access_latency_cycles", spm.access_latency_cycles)
    if spm.write_queue_depth < 0:
        fail("spm.write_queue_depth", f"must be >= 0, got {spm.write_queue_depth}")
    if spm.address_mapping not in ADDRESS_MAPPINGS:
        fail("spm.address_mapping", f"must be one of {ADDRESS_MAPPINGS}, got {spm.address_mapping!r}")
    if spm.address_mapping == AddressMapping.XOR and spm.lines & (spm.lines - 1):
        fail("spm.address_mapping", f"'xor' needs a power-of-two number of lines, got spm.lines = "
                                    f"{spm.lines}")
    if spm.capacity_words_per_line % spm.words_per_row:
        fail("spm.capacity_words_per_line",
             f"must be a multiple of spm.words_per_row ({spm.words_per_row}), "
             f"got {spm.capacity_words_per_line}")
    if pe.kind == PEKind.RECONFIGURABLE and spm.words_per_row < pe.simd_lanes:
        fail("spm.words_per_row",
             f"a row ({spm.words_per_row} words) must hold one SIMD vector "
             f"(pe_array.simd_lanes = {pe.simd_lanes})")

    positive("dram.bytes_per_cycle", spec.dram.bytes_per_cycle)
    non_negative("dram.latency_cycles", spec.dram.latency_cycles)
    positive("dram.channels", spec.dram.channels)
    positive("dram.dma_engines", spec.dram.dma_engines)

    positive("clock_ghz", spec.clock_ghz)
    if spec.dtype not in DTYPES:
        fail("dtype", f"must be one of {sorted(DTYPES)}, got {spec.dtype!r}")
    if DTYPES[spec.dtype] != spec.word_bytes:
        fail("word_bytes", f"{spec.dtype} words are {DTYPES[spec.dtype]} bytes, got {spec.word_bytes}")
    non_negative("reconfiguration_cycles", spec.reconfiguration_cycles)
    for name, value in vars(spec.energy).items():
        non_negative(f"energy.{name}", value)
    for name, value in vars(spec.area).items():
        non_negative(f"area.{name}", value)
