"""Apply a plan's concurrency to live functions through the Lambda API.

The same calls run against AWS and against the local host (boto3 with ``endpoint_url``), so the
code that re-provisions a fleet is the code the tests exercise.
"""

from __future__ import annotations

import contextlib
from typing import Any

from moeless.plan import Plan

DEFAULT_ALIAS = "live"


def apply_concurrency(lambda_client: Any, plan: Plan, qualifier: str = DEFAULT_ALIAS) -> dict[str, int]:
    """Set each function's reserved and provisioned concurrency to what ``plan`` says.

    Functions the plan gives no provisioned concurrency lose any they had (nothing idle is paid for).
    Returns ``{function: provisioned concurrency}`` as requested.
    """
    applied: dict[str, int] = {}
    for spec in plan.functions:
        if spec.reserved_concurrency is not None:
            lambda_client.put_function_concurrency(
                FunctionName=spec.name, ReservedConcurrentExecutions=spec.reserved_concurrency
            )
        if spec.provisioned_concurrency > 0:
            lambda_client.put_provisioned_concurrency_config(
                FunctionName=spec.name,
                Qualifier=qualifier,
                ProvisionedConcurrentExecutions=spec.provisioned_concurrency,
            )
        else:
            with contextlib.suppress(lambda_client.exceptions.ResourceNotFoundException):
                lambda_client.delete_provisioned_concurrency_config(
                    FunctionName=spec.name, Qualifier=qualifier
                )
        applied[spec.name] = spec.provisioned_concurrency
    return applied
