"""The account's concurrency, by Lambda's rules: one limit shared by every function of the account;
a reservation carves a function's own pool out of it and must leave a minimum unreserved; provisioned
concurrency is held out of the pool it draws from (its function's reservation, else the unreserved
pool), busy or not.

AWS's words: "You can configure up to the unreserved account concurrency in your account, minus 100"
and "You can't allocate more provisioned concurrency than reserved concurrency for a function."
(https://docs.aws.amazon.com/lambda/latest/dg/provisioned-concurrency.html); the messages are the ones
Lambda answers with.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from moeless.aws_limits import LambdaLimits


class ConcurrencyRefused(Exception):
    """A reservation or provisioned configuration Lambda refuses (400 InvalidParameterValueException)."""


@dataclass(frozen=True)
class FunctionUsage:
    """One function's claim on the account's concurrency.

    Attributes:
        reserved: its reserved concurrency (``None``: it draws on the unreserved pool).
        provisioned: provisioned concurrency its configurations hold (failed ones hold none).
        on_demand: invocations in flight on its on-demand instances.
    """

    reserved: int | None
    provisioned: int
    on_demand: int


def unreserved(limits: LambdaLimits, functions: Iterable[FunctionUsage]) -> int:
    """``UnreservedConcurrentExecutions``: the account's limit less every reservation."""
    return limits.account_concurrency - sum(f.reserved or 0 for f in functions)


def check_reservation(limits: LambdaLimits, others: Iterable[FunctionUsage], count: int) -> None:
    """Raise :class:`ConcurrencyRefused` unless reserving ``count`` for one function leaves the
    minimum unreserved (``others``: every other function)."""
    if unreserved(limits, others) - count < limits.min_unreserved_concurrency:
        raise ConcurrencyRefused(
            "Specified ReservedConcurrentExecutions for function decreases account's "
            f"UnreservedConcurrentExecution below its minimum value of [{limits.min_unreserved_concurrency}]."
        )


def check_provisioning(
    limits: LambdaLimits, function: FunctionUsage, others: Iterable[FunctionUsage], count: int
) -> None:
    """Raise :class:`ConcurrencyRefused` unless ``count`` more provisioned concurrency fits.

    ``function`` counts its other qualifiers' configurations, not the one being set; ``others`` is
    every other function.
    """
    if function.reserved is not None:
        if function.provisioned + count > function.reserved:
            raise ConcurrencyRefused(
                "Requested Provisioned Concurrency should not be greater than the "
                "reservedConcurrentExecution for function"
            )
        return
    if on_demand_headroom(limits, [function, *others]) - count < limits.min_unreserved_concurrency:
        raise ConcurrencyRefused(
            "Specified ConcurrentExecutions for function decreases account's "
            f"UnreservedConcurrentExecution below its minimum value of [{limits.min_unreserved_concurrency}]."
        )


def on_demand_headroom(limits: LambdaLimits, functions: Iterable[FunctionUsage]) -> int:
    """What the unreserved pool leaves to on-demand invocations: the provisioned concurrency of
    functions without a reservation is held out of it."""
    functions = list(functions)
    return unreserved(limits, functions) - sum(f.provisioned for f in functions if f.reserved is None)


def unreserved_pool_has_room(limits: LambdaLimits, functions: Iterable[FunctionUsage]) -> bool:
    """Whether one more on-demand invocation of a function without a reservation fits the account."""
    functions = list(functions)
    in_flight = sum(f.on_demand for f in functions if f.reserved is None)
    return in_flight < on_demand_headroom(limits, functions)


def reserved_pool_has_room(function: FunctionUsage) -> bool:
    """Whether one more on-demand invocation fits a function's reservation (its provisioned
    concurrency is held out of it, so a fully provisioned reservation throttles ``$LATEST``)."""
    assert function.reserved is not None
    return function.provisioned + function.on_demand < function.reserved
