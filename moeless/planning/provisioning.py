"""Apply a plan's concurrency to live functions through the Lambda API, changing only what differs.

The same calls run against AWS and against the local host (boto3 with ``endpoint_url``), so the
code that re-provisions a fleet is the code the tests exercise.
"""

from __future__ import annotations

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
