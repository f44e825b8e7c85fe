"""The backbone service's engine: continuous batching, per-step coalescing of expert calls,
dispatch to functions with fallback, pre-warming and re-planning while serving."""

from moeless.serving.backbone import Backbone, BackboneConfig
from moeless.serving.generation import GenerationEngine, Overloaded, SamplingParams, ShuttingDown

__all__ = ["Backbone", "BackboneConfig", "GenerationEngine", "Overloaded", "SamplingParams", "ShuttingDown"]
