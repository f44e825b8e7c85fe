"""One expert as it runs in its function: onnxruntime sessions and the handler's logic. No torch."""

from moeless.experts.function import ExpertFunction
from moeless.experts.runtime import ExpertExecutor, OnnxExpertPool
from moeless.experts.session import session_options

__all__ = ["ExpertExecutor", "ExpertFunction", "OnnxExpertPool", "session_options"]
