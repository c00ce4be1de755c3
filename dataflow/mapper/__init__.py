"""Mapper: placement, routing, modulo schedule (II), tiling to SPM -> `Mapping`."""

from dataflow.mapper.legality import check_mapping
from dataflow.mapper.map import map_kernel, map_program
from dataflow.mapper.mapping import (
    KernelMapping,
    Mapping,
    MappingError,
    Placement,
    Route,
    SPMAllocation,
    SystolicMapping,
    Tile,
)

__all__ = [
    "KernelMapping", "Mapping", "MappingError", "Placement", "Route", "SPMAllocation",
    "SystolicMapping", "Tile", "check_mapping", "map_kernel", "map_program",
]
