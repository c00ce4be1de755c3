"""`ArchSpec`, its YAML loader and the presets by name, shared by the mapper and the engine."""

from dataflow.arch.errors import ArchError
from dataflow.arch.load import arch_from_dict, arch_to_dict, load_arch
from dataflow.arch.resolve import preset_names, preset_path, resolve_arch
from dataflow.arch.spec import (
    AddressMapping,
    ArchSpec,
    AreaTable,
    DRAMSpec,
    EnergyTable,
    FunctionalUnit,
    InterconnectSpec,
    PEArraySpec,
    PEKind,
    SPMSpec,
    Topology,
)

__all__ = [
    "AddressMapping", "ArchError", "ArchSpec", "AreaTable", "DRAMSpec", "EnergyTable",
    "FunctionalUnit", "InterconnectSpec", "PEArraySpec", "PEKind", "SPMSpec", "Topology",
    "arch_from_dict", "arch_to_dict", "load_arch", "preset_names", "preset_path", "resolve_arch",
]
