"""The expert Lambda: one or more routed experts served with onnxruntime.

Init (module import, Lambda's init phase) loads and checksum-checks the experts named by
the environment (see ``moeless/experts/function.py``); each invoke runs one expert, or a bundle
of one layer's experts, on the payload of docs/design.md and returns its output with ``init_ms``
and ``compute_ms``, as JSON bytes (awslambdaric passes bytes through; serialising the long base64
string itself is slower).
"""

import os

from moeless.contracts.payload import payload_json
from moeless.experts.function import ExpertFunction

FUNCTION = ExpertFunction.from_env(os.environ)


def handler(event, context):
    return payload_json(FUNCTION.invoke(event, getattr(context, "aws_request_id", "")))
