"""The account's Lambda quotas a plan must fit: concurrent executions and function memory.

One rule, for every plan ``moeless plan`` writes (the analytic planner's, the optimiser's
candidates) and for the deploy's pre-flight, which reads the account's figures
(:mod:`moeless.deployment.preflight`). From AWS's Lambda documents:

- A function's reserved concurrency comes out of the account's concurrent executions, which must
  keep :attr:`AccountQuotas.min_unreserved` unreserved ("You can reserve up to the Unreserved
  account concurrency value that is shown, minus 100 for functions that don't have reserved
  concurrency", https://docs.aws.amazon.com/lambda/latest/dg/configuration-concurrency.html).
- Provisioned concurrency of a function without a reservation comes out of the unreserved pool,
  which must keep its 100; of a function with one, out of that reservation
  (https://docs.aws.amazon.com/lambda/latest/dg/provisioned-concurrency.html).
- Environments the backbone keeps warm by pinging are on-demand ones: they take unreserved
  concurrency while they run, and counting them as held is the safe side.
- A layer's invokes go out together (``Plan.invoke_targets``: one per replica), so the busiest
  layer's on-demand invokes (those beyond their function's provisioned environments, which they
  find first; a function with a reservation stays within it) run at once in the unreserved pool.
  Counting one invoke per replica bounds a step whose rows fit one payload; a bundled invoke of
  several experts counts once per expert.
- A function's memory is at most 10,240 MB; new accounts get 3,008, and no AWS API reads an
  account's cap ("Lambda quotas", https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html).

So a plan needs reserved + held + max(min_unreserved, busiest layer's on-demand invokes)
concurrent executions: what its reservations and held environments leave unreserved must be both
Lambda's minimum and what one layer's invokes take at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from moeless.aws_limits import DEFAULT_LIMITS, MAX_FUNCTION_MEMORY_MB
from moeless.contracts.plan import Plan
from moeless.errors import PlanDoesNotFit

CONCURRENCY_QUOTA = "Lambda 'Concurrent executions' (Service Quotas code L-B99A9384)"
MEMORY_QUOTA = "Lambda function memory"


@dataclass(frozen=True)
class AccountQuotas:
    """The quotas a plan is held to, AWS's defaults unless the user says their account's.

    Attributes:
        concurrency: the account's concurrent executions, all functions together.
        max_function_memory_mb: the largest memory a function may have.
        min_unreserved: what reservations and provisioned concurrency must leave unreserved.
    """

    concurrency: int = DEFAULT_LIMITS.account_concurrency
    max_function_memory_mb: int = MAX_FUNCTION_MEMORY_MB
    min_unreserved: int = DEFAULT_LIMITS.min_unreserved_concurrency

    def __post_init__(self) -> None:
        assert self.concurrency >= 1 and self.min_unreserved >= 0, self
        assert 128 <= self.max_function_memory_mb <= MAX_FUNCTION_MEMORY_MB, self


DEFAULT_QUOTAS = AccountQuotas()


@dataclass(frozen=True)
class Shortfall:
    """One quota the plan needs more of: ``needed`` against the account's ``have``, and why."""

    quota: str
    needed: int
    have: int
    why: str

    @property
    def more(self) -> int:
        """The increase to ask for."""
        return self.needed - self.have

    def __str__(self) -> str:
        return (
            f"{self.quota}: the plan needs {self.needed:,}, the account has {self.have:,} "
            f"({self.why}); ask for {self.more:,} more"
        )


@dataclass(frozen=True)
class Concurrency:
    """What a plan takes of the account's concurrent executions.

    Attributes:
        reserved: its functions' reservations.
        held: provisioned and kept-warm environments of the functions without a reservation.
        peak_on_demand: the most on-demand invokes one layer sends at once to functions without a
            reservation, beyond their provisioned environments.
        busiest_layer: the layer that sends them (``None``: no layer invokes a function).
    """

    reserved: int
    held: int
    peak_on_demand: int
    busiest_layer: int | None

    def needed(self, min_unreserved: int) -> int:
        """The account's concurrent executions this plan needs (the module's rule)."""
        return self.reserved + self.held + max(min_unreserved, self.peak_on_demand)

    def why(self, min_unreserved: int) -> str:
        """The parts of :meth:`needed`, in words."""
        unreserved = (
            f"{self.peak_on_demand:,} on-demand invokes of layer {self.busiest_layer} at once"
            if self.peak_on_demand > min_unreserved
            else f"{min_unreserved:,} left unreserved as Lambda requires"
        )
        return (
            f"{self.reserved:,} reserved, {self.held:,} provisioned or kept warm without a "
            f"reservation, {unreserved}"
        )


def layer_invokes(plan: Plan) -> dict[int, dict[str, int]]:
    """Layer -> function -> the invokes one step of that layer sends the function at once (one per
    replica, ``Plan.invoke_targets``). Plans that differ only in warmth share it."""
    invokes: dict[int, dict[str, int]] = {}
    for (layer, _), names in plan.invoke_targets().items():
        per_function = invokes.setdefault(layer, {})
        for name in names:
            per_function[name] = per_function.get(name, 0) + 1
    return invokes


def concurrency_of(plan: Plan, invokes: Mapping[int, Mapping[str, int]] | None = None) -> Concurrency:
    """The plan's claim on the account's concurrency (the module's rule); ``invokes``: its
    :func:`layer_invokes`, where known."""
    functions = {spec.name: spec for spec in plan.functions}
    open_pool = {name for name, spec in functions.items() if spec.reserved_concurrency is None}
    on_demand = {
        layer: sum(
            max(0, count - functions[name].provisioned_concurrency)
            for name, count in per_function.items()
            if name in open_pool
        )
        for layer, per_function in (layer_invokes(plan) if invokes is None else invokes).items()
    }
    busiest = max(on_demand, key=lambda layer: (on_demand[layer], -layer), default=None)
    return Concurrency(
        reserved=sum(spec.reserved_concurrency or 0 for spec in plan.functions),
        held=sum(functions[name].provisioned_concurrency + functions[name].keep_warm for name in open_pool),
        peak_on_demand=0 if busiest is None else on_demand[busiest],
        busiest_layer=busiest,
    )


def quota_shortfalls(
    plan: Plan,
    quotas: AccountQuotas = DEFAULT_QUOTAS,
    reserved_elsewhere: int = 0,
    invokes: Mapping[int, Mapping[str, int]] | None = None,
) -> list[Shortfall]:
    """Each quota of ``quotas`` that ``plan`` needs more of (none: it fits).

    ``reserved_elsewhere``: what other functions of the account reserve (the deploy's pre-flight
    reads it; a plan alone assumes none). ``invokes``: the plan's :func:`layer_invokes`, where known.
    """
    shortfalls = []
    claim = concurrency_of(plan, invokes)
    needed = reserved_elsewhere + claim.needed(quotas.min_unreserved)
    if needed > quotas.concurrency:
        why = claim.why(quotas.min_unreserved)
        if reserved_elsewhere:
            why += f", {reserved_elsewhere:,} reserved by other functions"
        shortfalls.append(Shortfall(CONCURRENCY_QUOTA, needed, quotas.concurrency, why))
    if too_big := [spec for spec in plan.functions if spec.memory_mb > quotas.max_function_memory_mb]:
        shortfalls.append(
            Shortfall(
                MEMORY_QUOTA,
                max(spec.memory_mb for spec in too_big),
                quotas.max_function_memory_mb,
                f"{len(too_big)} function(s) above it, e.g. {too_big[0].name}; no AWS API reads the cap, "
                "AWS Support raises it; or re-plan with smaller functions",
            )
        )
    return shortfalls


def refuse(shortfalls: Sequence[Shortfall], what: str = "this plan") -> None:
    """Raise :class:`PlanDoesNotFit` naming every shortfall (none: return)."""
    if shortfalls:
        listed = "\n  ".join(str(s) for s in shortfalls)
        raise PlanDoesNotFit(f"the account cannot hold {what}:\n  {listed}")


def require_quotas(plan: Plan, quotas: AccountQuotas = DEFAULT_QUOTAS) -> None:
    """Raise :class:`PlanDoesNotFit` unless ``plan`` fits ``quotas``, naming every shortfall."""
    refuse(quota_shortfalls(plan, quotas))
