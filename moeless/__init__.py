"""moeless: serverless Mixture-of-Experts inference.

The engine package. It never imports the deployables (``cli``, ``backbone_service``,
``functions``, ``cdk``), and heavy libraries (torch, transformers, onnxruntime) are
imported inside the functions that need them so that the CLI, planner and simulator
start fast.
"""

__version__ = "0.1.0"
