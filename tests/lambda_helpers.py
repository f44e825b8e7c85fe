"""Calling the local Lambda host the way users do: a plain boto3 client, against a host of probe
functions (``tests/lambda_handlers/probe.py``)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from moeless.lambda_host import FunctionConfig, LambdaHost
from moeless.lambda_host.client import lambda_client

__all__ = ["call", "lambda_client", "probe", "running", "wait_for"]

HANDLERS = Path(__file__).resolve().parent / "lambda_handlers"


def probe(name: str = "probe", **overrides: Any) -> FunctionConfig:
    """A function running the probe handler (``overrides``: other FunctionConfig fields)."""
    fields = {"task_root": HANDLERS, "handler": "probe.handler", "python": sys.executable} | overrides
    return FunctionConfig(name, **fields)


@contextmanager
def running(*functions: FunctionConfig, **options: Any) -> Iterator[tuple[LambdaHost, Any]]:
    """A started host of ``functions`` (``options``: LambdaHost's), and a boto3 client for it."""
    with LambdaHost(list(functions), **options) as host:
        yield host, lambda_client(host.endpoint_url)


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
