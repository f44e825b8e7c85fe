"""A Lambda handler that does what the event asks: the local host's tests drive it.

Events: ``{}`` (answer at once), ``{"sleep": s}``, ``{"raise": "message"}``, ``{"exit": code}``.
Init: ``PROBE_FAIL_INIT`` makes it raise, ``PROBE_INIT_SLEEP`` (seconds) makes it slow.
"""

import os
import time

if os.environ.get("PROBE_FAIL_INIT"):
    raise RuntimeError("init failed on purpose")
time.sleep(float(os.environ.get("PROBE_INIT_SLEEP", "0")))


def handler(event, context):
    if "sleep" in event:
        time.sleep(event["sleep"])
    if "raise" in event:
        raise ValueError(event["raise"])
    if "exit" in event:
        os._exit(event["exit"])
    return {
        "pid": os.getpid(),
        "init_type": os.environ["AWS_LAMBDA_INITIALIZATION_TYPE"],
        "memory_mb": int(context.memory_limit_in_mb),
        "function": context.function_name,
        "arn": context.invoked_function_arn,
        "request_id": context.aws_request_id,
    }
