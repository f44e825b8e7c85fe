"""``moeless deploy --check``: does the account hold this plan? Read before anything is built.

A plan the account cannot hold otherwise fails inside CloudFormation, after every image is built
and pushed, and rolls back. The rules, from AWS's Lambda documents:

- Reserved concurrency comes out of the account's concurrent executions, which must keep at
  least :data:`UNRESERVED_MINIMUM` unreserved ("Lambda functions concurrency",
  https://docs.aws.amazon.com/lambda/latest/dg/configuration-concurrency.html).
- Provisioned concurrency of a function with a reservation comes out of that reservation (it may
  not exceed it); of a function without one, out of the unreserved pool, which must keep its 100
  (https://docs.aws.amazon.com/lambda/latest/dg/provisioned-concurrency.html).
- Environments the backbone keeps warm by pinging are ordinary on-demand ones: they take
  unreserved concurrency while they run, and counting them as held is the safe side.
- Function memory is at most 10,240 MB; new accounts get less (3,008 MB), and AWS offers no API
  that reads an account's cap ("Lambda quotas", https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html):
  ``max_memory_mb`` says it.

And one rule of the plan itself: a function fetches its experts from S3 at a cold start
(``moeless:expertCode=s3``), which must end within the function's timeout
(:func:`slow_functions`; the cost model's stated fetch and load rates).

The account's figures come from ``GetAccountSettings``; this stage's own functions, if deployed,
give back what they already reserve, so a re-deploy of the same plan fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moeless.aws_limits import DEFAULT_LIMITS, MAX_FUNCTION_MEMORY_MB
from moeless.contracts.manifest import Manifest
from moeless.contracts.plan import Plan
from moeless.errors import MoelessError

if TYPE_CHECKING:
    from moeless.planning.cost_model import CostModel

UNRESERVED_MINIMUM = DEFAULT_LIMITS.min_unreserved_concurrency
CONCURRENCY_QUOTA = "Lambda 'Concurrent executions' (Service Quotas code L-B99A9384)"


class PlanDoesNotFit(MoelessError):
    """The account's quotas cannot hold the plan; the message names each quota and the increase."""


@dataclass(frozen=True)
class Shortfall:
    quota: str
    needed: int
    have: int
    why: str

    def __str__(self) -> str:
        return (
            f"{self.quota}: the plan needs {self.needed:,}, the account has {self.have:,} "
            f"({self.why}); ask for {self.needed - self.have:,} more"
        )


@dataclass(frozen=True)
class AccountFit:
    concurrency_limit: int
    unreserved_now: int
    reserved_by_stage: int  # what this stage's deployed functions reserve today
    needed_reserved: int
    needed_unreserved: int
    max_memory_mb: int
    shortfalls: tuple[Shortfall, ...]

    def summary(self) -> str:
        return (
            f"account: {self.concurrency_limit:,} concurrent executions, {self.unreserved_now:,} "
            f"unreserved now ({self.reserved_by_stage:,} of the rest reserved by this stage); the plan "
            f"reserves {self.needed_reserved:,} and holds {self.needed_unreserved:,} unreserved; "
            f"functions up to {self.max_memory_mb:,} MB"
        )


def check_account(
    lambda_client: Any, plan: Plan, function_prefix: str, max_memory_mb: int = MAX_FUNCTION_MEMORY_MB
) -> AccountFit:
    """How ``plan`` (as deployed: ``function_prefix`` names) fits the account; raise nothing."""
    settings = lambda_client.get_account_settings()["AccountLimit"]
    limit = int(settings["ConcurrentExecutions"])
    unreserved = int(settings["UnreservedConcurrentExecutions"])
    deployed = plan.prefixed(function_prefix)
    reserved_now = _reserved_by(lambda_client, {spec.name for spec in deployed.functions})
    needed_reserved = sum(spec.reserved_concurrency or 0 for spec in deployed.functions)
    needed_unreserved = sum(
        spec.provisioned_concurrency + spec.keep_warm
        for spec in deployed.functions
        if spec.reserved_concurrency is None
    )
    shortfalls = []
    others = limit - unreserved - reserved_now  # reserved by functions of other stages and apps
    needed_limit = others + needed_reserved + needed_unreserved + UNRESERVED_MINIMUM
    if needed_limit > limit:
        shortfalls.append(
            Shortfall(
                CONCURRENCY_QUOTA,
                needed_limit,
                limit,
                f"{needed_reserved:,} reserved, {needed_unreserved:,} provisioned or kept warm "
                f"without a reservation, {UNRESERVED_MINIMUM} left unreserved as Lambda requires"
                + (f", {others:,} reserved by other functions" if others else ""),
            )
        )
    if too_big := [spec for spec in deployed.functions if spec.memory_mb > max_memory_mb]:
        biggest = max(spec.memory_mb for spec in too_big)
        shortfalls.append(
            Shortfall(
                "Lambda function memory",
                biggest,
                max_memory_mb,
                f"{len(too_big)} function(s) above it, e.g. {too_big[0].name}; or re-plan with "
                "smaller functions",
            )
        )
    return AccountFit(
        limit,
        unreserved,
        reserved_now,
        needed_reserved,
        needed_unreserved,
        max_memory_mb,
        tuple(shortfalls),
    )


def slow_functions(plan: Plan, manifest: Manifest, model: CostModel | None = None) -> list[str]:
    """The plan's functions whose experts a cold start cannot fetch from S3 and load within the
    functions' timeout (``CostModel.too_slow_to_load``), each with why."""
    from moeless.planning.cost_model import CostModel

    model = model or CostModel()
    slow = []
    for spec in plan.functions:
        weight = sum(manifest.expert(layer, expert).bytes for layer, expert in spec.experts)
        if why := model.too_slow_to_load(weight):
            slow.append(f"{spec.name}: {why}")
    return slow


def require_fit(fit: AccountFit) -> None:
    """Raise :class:`PlanDoesNotFit` naming every shortfall."""
    if fit.shortfalls:
        listed = "\n  ".join(str(s) for s in fit.shortfalls)
        raise PlanDoesNotFit(f"the account cannot hold this plan:\n  {listed}")


def _reserved_by(lambda_client: Any, names: set[str]) -> int:
    """What the deployed functions among ``names`` reserve now (0 for none deployed)."""
    deployed = {
        function["FunctionName"]
        for page in lambda_client.get_paginator("list_functions").paginate()
        for function in page["Functions"]
    } & names
    return sum(
        int(
            lambda_client.get_function_concurrency(FunctionName=name).get("ReservedConcurrentExecutions") or 0
        )
        for name in sorted(deployed)
    )
