"""Whole networks, layer by layer (docs/architecture.md#models): SCALE-Sim topology files,
PyTorch models captured with torch.export, and the built-in model files under `models/`."""

from dataflow.models.layers import MODEL_INPUT, Layer, LayerKind, Model, ModelError

__all__ = ["MODEL_INPUT", "Layer", "LayerKind", "Model", "ModelError"]
