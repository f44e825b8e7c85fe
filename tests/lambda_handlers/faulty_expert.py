"""The expert handler with a fault injected by ``FAULT``: ``raise`` (handler exception), ``exit``
(the process dies mid-request), ``garbage`` (a reply that is not an expert output), ``slow``
(a correct reply after 0.3 s)."""

import os
import time

from moeless.contracts.payload import payload_json
from moeless.experts.function import ExpertFunction

FUNCTION = ExpertFunction.from_env(os.environ)
FAULT = os.environ.get("FAULT", "")


def handler(event, context):
    if FAULT == "raise":
        raise RuntimeError("injected fault")
    if FAULT == "exit":
        os._exit(1)
    if FAULT == "slow":
        time.sleep(0.3)
    if FAULT == "garbage":
        return {"dtype": "float32", "shape": [1, 1], "data": "AAAAAA=="}
    return payload_json(FUNCTION.invoke(event, context.aws_request_id))
