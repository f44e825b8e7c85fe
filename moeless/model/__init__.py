"""The model side: reading checkpoints, exporting experts to ONNX, packaging, the split model,
the tiny and trained demo models, the unsplit reference and whole-model shapes."""

from moeless.model.archs import spec_for_config
from moeless.model.packaging import package
from moeless.model.reference import eos_token_ids, greedy_texts
from moeless.model.shapes import ModelShape, resolve_model
from moeless.model.split import load_split_model
from moeless.model.tiny import TinySpec, build_tiny_model
from moeless.model.training import TrainSpec, trained_model

__all__ = [
    "ModelShape",
    "TinySpec",
    "TrainSpec",
    "build_tiny_model",
    "eos_token_ids",
    "greedy_texts",
    "load_split_model",
    "package",
    "resolve_model",
    "spec_for_config",
    "trained_model",
]
