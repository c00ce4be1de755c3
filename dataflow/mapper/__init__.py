"""Mapper: placement, routing, modulo schedule (II), tiling to SPM -> `Mapping`.

The names are imported when first used (PEP 562), so a run that needs only the `Mapping`
types -- a systolic GEMM -- does not import the modulo scheduler and the router (start-up,
issue 14)."""

import importlib

_WHERE = {
    "check_mapping": "dataflow.mapper.legality",
    "map_kernel": "dataflow.mapper.map", "map_program": "dataflow.mapper.map",
    **{name: "dataflow.mapper.mapping" for name in (
        "KernelMapping", "Mapping", "MappingError", "Placement", "Route", "SPMAllocation",
        "SystolicMapping", "Tile")},
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
