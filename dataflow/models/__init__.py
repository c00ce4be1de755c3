"""Whole networks, layer by layer (docs/architecture.md#models): SCALE-Sim topology files,
PyTorch models captured with torch.export, and the built-in model files under `models/`."""

from dataflow.models.files import load_model
from dataflow.models.layers import MODEL_INPUT, Layer, LayerKind, Model, ModelError
from dataflow.models.result import Activation, LayerResult, ModelResult
from dataflow.models.simulate import simulate
from dataflow.models.torch_capture import CapturedModel, from_torch

__all__ = ["MODEL_INPUT", "Activation", "CapturedModel", "Layer", "LayerKind", "LayerResult",
           "Model", "ModelError", "ModelResult", "from_torch", "load_model", "simulate"]
