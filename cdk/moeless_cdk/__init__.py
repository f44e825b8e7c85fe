"""moeless's CDK app: the artifacts store, the expert functions, the GPU backbone and the REST API.

``build_app`` wires the four stacks; ``app.py`` calls it with the configuration read from the
CDK context (see :mod:`moeless_cdk.config`), and tests call it with their own.
"""

from moeless_cdk.wiring import MoelessStacks, build_app

__all__ = ["MoelessStacks", "build_app"]
