"""Calling the local Lambda host the way users do: a plain boto3 client."""

from __future__ import annotations

import json
import time
from typing import Any

from moeless.lambda_host.client import lambda_client

__all__ = ["call", "lambda_client", "wait_for"]


def call(client: Any, name: str, event: Any, **kwargs: Any) -> tuple[dict, Any]:
    """Invoke ``name`` with a JSON event; returns (boto3 response, decoded payload)."""
    response = client.invoke(FunctionName=name, Payload=json.dumps(event), **kwargs)
    return response, json.loads(response["Payload"].read() or b"null")


def wait_for(predicate: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")
