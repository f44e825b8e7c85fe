"""Apply a plan's concurrency to live functions through the Lambda API, changing only what differs.

The same calls run against AWS and against the local host (boto3 with ``endpoint_url``), so the
code that re-provisions a fleet is the code the tests exercise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moeless.contracts.environment import ALIAS
from moeless.contracts.plan import Plan
from moeless.errors import PlanError


@dataclass(frozen=True)
class Change:
    """One setting of one function that differs from the plan (``None``: not set)."""

    function: str
    setting: str  # "reserved" | "provisioned"
    before: int | None
    after: int | None

    def __str__(self) -> str:
        def show(value: int | None) -> str:
            return "none" if value is None else str(value)

        return f"{self.function}: {self.setting} concurrency {show(self.before)} -> {show(self.after)}"


def current_concurrency(lambda_client: Any, function: str, alias: str) -> tuple[int | None, int]:
    """(reserved or None, provisioned on ``alias``) of one live function.

    Raises:
        PlanError: the function does not exist there.
    """
    errors = lambda_client.exceptions
    try:
        reserved = lambda_client.get_function_concurrency(FunctionName=function).get(
            "ReservedConcurrentExecutions"
        )
    except errors.ResourceNotFoundException:
        raise PlanError(f"function {function} is not deployed at this endpoint") from None
    try:
        answer = lambda_client.get_provisioned_concurrency_config(FunctionName=function, Qualifier=alias)
        provisioned = int(answer.get("RequestedProvisionedConcurrentExecutions", 0))
    except errors.ProvisionedConcurrencyConfigNotFoundException:
        provisioned = 0
    return reserved, provisioned


def plan_changes(lambda_client: Any, plan: Plan, alias: str = ALIAS) -> list[Change]:
    """What must change for the live functions to match ``plan``."""
    changes = []
    for spec in plan.functions:
        reserved, provisioned = current_concurrency(lambda_client, spec.name, alias)
        if reserved != spec.reserved_concurrency:
            changes.append(Change(spec.name, "reserved", reserved, spec.reserved_concurrency))
        if provisioned != spec.provisioned_concurrency:
            changes.append(Change(spec.name, "provisioned", provisioned, spec.provisioned_concurrency))
    return changes


def apply_changes(lambda_client: Any, changes: list[Change], alias: str = ALIAS) -> None:
    """Make the changes: provisioned decreases first, then reservations, then provisioned increases,
    so a lowered reservation never conflicts with provisioned concurrency still in place."""

    def order(change: Change) -> int:
        if change.setting == "provisioned":
            return 0 if (change.after or 0) < (change.before or 0) else 2
        return 1

    for change in sorted(changes, key=order):
        if change.setting == "reserved":
            if change.after is None:
                lambda_client.delete_function_concurrency(FunctionName=change.function)
            else:
                lambda_client.put_function_concurrency(
                    FunctionName=change.function, ReservedConcurrentExecutions=change.after
                )
        elif change.after:
            lambda_client.put_provisioned_concurrency_config(
                FunctionName=change.function, Qualifier=alias, ProvisionedConcurrentExecutions=change.after
            )
        else:
            lambda_client.delete_provisioned_concurrency_config(FunctionName=change.function, Qualifier=alias)


def apply_concurrency(lambda_client: Any, plan: Plan, alias: str = ALIAS) -> list[Change]:
    """Bring the live functions to the plan's reserved and provisioned concurrency; returns the changes."""
    changes = plan_changes(lambda_client, plan, alias)
    apply_changes(lambda_client, changes, alias)
    return changes


@dataclass(frozen=True)
class Allocation:
    """How one function's provisioned concurrency came out: ``READY``, ``FAILED`` (Lambda's
    ``StatusReason`` says why), ``REFUSED`` (the request itself was refused) or ``IN_PROGRESS``
    (still allocating when the wait ended)."""

    function: str
    requested: int
    status: str
    reason: str = ""

    def __str__(self) -> str:
        why = f": {self.reason}" if self.reason else ""
        return f"{self.function}: {self.requested} provisioned, {self.status}{why}"


def allocate_provisioned(
    lambda_client: Any,
    plan: Plan,
    alias: str = ALIAS,
    wait_s: float = 900.0,
    poll_s: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Allocation]:
    """Set each function's provisioned concurrency to the plan's, outside CloudFormation, and wait
    for Lambda to allocate it: one function that cannot be served is reported, never rolls back
    the others (inside a stack, one failed allocation rolls back every function of the stack).

    Decreases go first, so that what they free is there for the increases.
    """
    from botocore.exceptions import ClientError

    changes = [c for c in plan_changes(lambda_client, plan, alias) if c.setting == "provisioned"]
    changes.sort(key=lambda c: (c.after or 0) >= (c.before or 0))
    outcomes: dict[str, Allocation] = {}
    for change in changes:
        try:
            apply_changes(lambda_client, [change], alias)
        except ClientError as exc:
            message = exc.response.get("Error", {}).get("Message", str(exc))
            outcomes[change.function] = Allocation(change.function, change.after or 0, "REFUSED", message)
    pending = [c.function for c in changes if c.after and c.function not in outcomes]
    deadline = time.monotonic() + wait_s
    while pending:
        waiting = []
        for name in pending:
            config = lambda_client.get_provisioned_concurrency_config(FunctionName=name, Qualifier=alias)
            requested = int(config.get("RequestedProvisionedConcurrentExecutions", 0))
            if config.get("Status") == "IN_PROGRESS" and time.monotonic() < deadline:
                waiting.append(name)
                continue
            outcomes[name] = Allocation(
                name, requested, config.get("Status", "?"), config.get("StatusReason", "")
            )
        pending = waiting
        if pending:
            sleep(poll_s)
    return [outcomes[c.function] for c in changes if c.function in outcomes]
