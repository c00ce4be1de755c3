"""How one layer runs: a registry from `LayerKind` to a runner (the conv runner lives in
`dataflow.models.conv`, the others in `dataflow.models.simulate`).

A runner is `run(layer, inputs, weights, arch, options) -> LayerRun`: `inputs` are the values of
the layers it reads (in `layer.inputs` order), `weights` its parameters by name ("weight",
"bias", ...), and it returns the engine's `SimResult`, the layer's output values and the numpy
reference of the layer on the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dataflow.arch import ArchSpec
from dataflow.models.layers import Layer, LayerKind, ModelError
from dataflow.pe_array.result import SimResult


@dataclass(frozen=True)
class RunOptions:
    """What the caller chose for every layer."""

    engine: str = "fast"
    dataflow: str | None = None  # systolic arrays: os | ws | is
    seed: int = 0


@dataclass(frozen=True)
class LayerRun:
    result: SimResult
    output: np.ndarray
    reference: np.ndarray


LayerRunner = Callable[[Layer, list[np.ndarray], dict[str, np.ndarray], ArchSpec, RunOptions],
                       LayerRun]
_RUNNERS: dict[LayerKind, LayerRunner] = {}


def register_runner(kind: LayerKind, run: LayerRunner) -> LayerRunner:
    _RUNNERS[kind] = run
    return run


def runner_for(layer: Layer) -> LayerRunner:
    if layer.kind not in _RUNNERS:
        raise ModelError(f"{layer.where}: no runner for layer kind {str(layer.kind)!r} "
                         f"(layer {layer.name!r}); known: {sorted(map(str, _RUNNERS))}")
    return _RUNNERS[layer.kind]
