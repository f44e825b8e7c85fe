"""The expert Lambda: one or more routed experts served with onnxruntime.

Init (module import, Lambda's init phase) loads and checksum-checks the experts named by
the environment (see ``moeless/expert_function.py``); each invoke runs one expert on the
payload of DESIGN.md and returns its output with ``init_ms`` and ``compute_ms``.
"""

import os

from moeless.expert_function import ExpertFunction

FUNCTION = ExpertFunction.from_env(os.environ)


def handler(event, context):
    return FUNCTION.invoke(event, getattr(context, "aws_request_id", ""))
