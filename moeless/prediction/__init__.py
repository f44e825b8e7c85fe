"""Which experts a request will need: routing traces, the predictors and their evaluation."""

from moeless.prediction.crosslayer import CrossLayerModel, TransitionTable
from moeless.prediction.evaluation import evaluate
from moeless.prediction.predictors import Embedder, FrequencyPrior, LayerAware, SimilarPromptSearch, fit_sps
from moeless.prediction.prompt_predictors import KernelNeighbours, fit_kernel
from moeless.prediction.routing_eval import evaluate_routing
from moeless.prediction.routing_file import load_routing, load_routing_or_trace
from moeless.prediction.trace import Trace, TraceError, load_trace, profile, read_prompts

__all__ = [
    "CrossLayerModel",
    "Embedder",
    "FrequencyPrior",
    "KernelNeighbours",
    "LayerAware",
    "SimilarPromptSearch",
    "Trace",
    "TraceError",
    "TransitionTable",
    "evaluate",
    "evaluate_routing",
    "fit_kernel",
    "fit_sps",
    "load_routing",
    "load_routing_or_trace",
    "load_trace",
    "profile",
    "read_prompts",
]
