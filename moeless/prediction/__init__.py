"""Which experts a request will need: routing traces, the predictors and their evaluation."""

from moeless.prediction.evaluation import evaluate
from moeless.prediction.predictors import Embedder, FrequencyPrior, LayerAware, SimilarPromptSearch, fit_sps
from moeless.prediction.trace import Trace, TraceError, load_trace, profile, read_prompts

__all__ = [
    "Embedder",
    "FrequencyPrior",
    "LayerAware",
    "SimilarPromptSearch",
    "Trace",
    "TraceError",
    "evaluate",
    "fit_sps",
    "load_trace",
    "profile",
    "read_prompts",
]
