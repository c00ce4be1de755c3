"""What simulating a model returns: one `LayerResult` per layer and the totals."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from dataflow.models.layers import Layer, Model
from dataflow.pe_array.result import SimResult

#: the per-layer columns of `--json` (`layers`) and `--csv`, in order
LAYER_COLUMNS = ("name", "kind", "cycles", "compute_cycles", "stall_cycles", "macs",
                 "dram_bytes", "roofline_cycles", "bound", "fraction_of_roofline",
                 "values_match_reference", "activation")


class Activation(str, Enum):
    """Where a layer's output waits for the layers that read it."""

    SPM = "spm"  # it fits: it stays in the scratchpad, no DRAM round trip
    DRAM = "dram"  # it does not: written back and read again, counted
    OUTPUT = "output"  # the model's output: written back once

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class LayerResult:
    """One layer's simulation (`result`, the engine's SimResult) and where its output went."""

    layer: Layer
    result: SimResult
    activation: Activation = Activation.DRAM
    values_match_reference: bool | None = None

    def row(self) -> dict:
        """This layer's entry of `ModelResult.to_dict()["layers"]` (plain data)."""
        r = self.result
        return {"name": self.layer.name, "kind": str(self.layer.kind), "cycles": r.cycles,
                "compute_cycles": r.compute_cycles, "stall_cycles": r.stall_cycles,
                "macs": r.macs, "dram_bytes": r.dram_bytes, "roofline_cycles": r.roofline_cycles,
                "bound": str(r.bound) if r.bound is not None else None,
                "fraction_of_roofline": r.fraction_of_roofline,
                "values_match_reference": self.values_match_reference,
                "activation": str(self.activation)}


@dataclass(frozen=True)
class ModelResult:
    """Layers run one after another on one architecture: cycles, traffic and energy add."""

    model: Model
    arch: str
    layers: tuple[LayerResult, ...]
    output: np.ndarray | None = None
    values_match_reference: bool | None = None
    max_abs_error: float | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def cycles(self) -> int:
        return sum(lr.result.cycles for lr in self.layers)

    @property
    def compute_cycles(self) -> int:
        return sum(lr.result.compute_cycles for lr in self.layers)

    @property
    def stall_cycles(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for lr in self.layers:
            for cause, n in lr.result.stall_cycles.items():
                out[cause] = out.get(cause, 0) + n
        return out

    @property
    def macs(self) -> int:
        return sum(lr.result.macs for lr in self.layers)

    @property
    def dram_bytes(self) -> int:
        return sum(lr.result.dram_bytes for lr in self.layers)

    @property
    def energy_total_pj(self) -> float:
        return sum(lr.result.energy_total_pj for lr in self.layers)

    @property
    def roofline_cycles(self) -> float | None:
        floors = [lr.result.roofline_cycles for lr in self.layers]
        return None if any(f is None for f in floors) else float(sum(floors))

    @property
    def fraction_of_roofline(self) -> float | None:
        rc = self.roofline_cycles
        return rc / self.cycles if rc is not None and self.cycles else None

    def layer(self, name: str) -> LayerResult:
        return next(lr for lr in self.layers if lr.layer.name == name)

    def to_dict(self) -> dict:
        """Plain data (JSON-ready): the totals and `layers`, one row per layer."""
        return {"model": self.model.name, "arch": self.arch, "cycles": self.cycles,
                "compute_cycles": self.compute_cycles, "stall_cycles": self.stall_cycles,
                "macs": self.macs, "dram_bytes": self.dram_bytes,
                "energy_total_pj": self.energy_total_pj,
                "roofline_cycles": self.roofline_cycles,
                "fraction_of_roofline": self.fraction_of_roofline,
                "values_match_reference": self.values_match_reference,
                "max_abs_error": self.max_abs_error, "notes": list(self.notes),
                "layers": [lr.row() for lr in self.layers]}

    def csv_rows(self) -> list[list]:
        """`LAYER_COLUMNS` as the header, then one row per layer (stall causes joined)."""
        rows: list[list] = [list(LAYER_COLUMNS)]
        for lr in self.layers:
            d = lr.row()
            d["stall_cycles"] = ";".join(f"{k}={v}" for k, v in d["stall_cycles"].items())
            rows.append([d[c] for c in LAYER_COLUMNS])
        return rows
