"""Calling the local Lambda host the way users do: a plain boto3 client."""

from __future__ import annotations

import json
import time
from typing import Any

import boto3
from botocore.config import Config


def lambda_client(endpoint_url: str, pool: int = 10) -> Any:
    """A boto3 Lambda client for the host at ``endpoint_url``; no retries, so throttles surface."""
    return boto3.client(
        "lambda",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
        config=Config(retries={"total_max_attempts": 1}, max_pool_connections=pool, read_timeout=60),
    )


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
