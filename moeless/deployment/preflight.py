"""``moeless deploy --check``: does the account hold this plan? Read before anything is built.

A plan the account cannot hold otherwise fails inside CloudFormation, after every image is built
and pushed, and rolls back. The rules are the planner's (:mod:`moeless.planning.quotas`: reserved,
provisioned and kept-warm environments, the busiest layer's on-demand invokes, the 100 unreserved
Lambda requires, function memory), held here to the account's own figures and to what other
functions of it reserve; ``max_memory_mb`` says the memory cap, which no AWS API reads.

And one rule of the plan itself: a function fetches its experts from S3 at a cold start
(``moeless:expertCode=s3``), which must end within the function's timeout
(:func:`slow_functions`; the cost model's stated fetch and load rates).

The account's figures come from ``GetAccountSettings``; this stage's own functions, if deployed,
give back what they already reserve, so a re-deploy of the same plan fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moeless.aws_limits import MAX_FUNCTION_MEMORY_MB
from moeless.contracts.manifest import Manifest
from moeless.contracts.plan import Plan
from moeless.planning.quotas import AccountQuotas, Shortfall, concurrency_of, quota_shortfalls, refuse

if TYPE_CHECKING:
    from moeless.planning.cost_model import CostModel


@dataclass(frozen=True)
class AccountFit:
    concurrency_limit: int
    unreserved_now: int
    reserved_by_stage: int  # what this stage's deployed functions reserve today
    needed_reserved: int
    needed_unreserved: int  # provisioned or kept warm without a reservation
    peak_on_demand: int  # the busiest layer's on-demand invokes at once
    max_memory_mb: int
    shortfalls: tuple[Shortfall, ...]

    def summary(self) -> str:
        return (
            f"account: {self.concurrency_limit:,} concurrent executions, {self.unreserved_now:,} "
            f"unreserved now ({self.reserved_by_stage:,} of the rest reserved by this stage); the plan "
            f"reserves {self.needed_reserved:,}, holds {self.needed_unreserved:,} unreserved and invokes "
            f"up to {self.peak_on_demand:,} more on demand at once; functions up to {self.max_memory_mb:,} MB"
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
    others = limit - unreserved - reserved_now  # reserved by functions of other stages and apps
    claim = concurrency_of(deployed)
    shortfalls = quota_shortfalls(deployed, AccountQuotas(limit, max_memory_mb), reserved_elsewhere=others)
    return AccountFit(
        limit,
        unreserved,
        reserved_now,
        claim.reserved,
        claim.held,
        claim.peak_on_demand,
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
    """Raise :class:`~moeless.errors.PlanDoesNotFit` naming every shortfall."""
    refuse(fit.shortfalls)


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
