"""Lambda's account, memory and init limits, with AWS's defaults, in one place: the local host
enforces them, the deploy's pre-flight checks a plan against an account's, and the expert
function times its init by them.

Every figure is AWS's documented default; tests and small machines pass their own
:class:`LambdaLimits` (smaller init limits keep tests fast; a smaller account shows throttling).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LambdaLimits:
    """The limits of one (local) account and its functions' init phase.

    Attributes:
        account_concurrency: concurrent executions of all functions together; the quotas table
            reads "Concurrent executions | 1,000 | Tens of thousands" (default quota, and how far
            it can be raised; https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html).
        min_unreserved_concurrency: what reservations must leave to the functions without one.
            "You can reserve up to the Unreserved account concurrency value that is shown, minus 100
            for functions that don't have reserved concurrency."
            (https://docs.aws.amazon.com/lambda/latest/dg/configuration-concurrency.html); new accounts
            get a smaller minimum with their smaller limit.
        on_demand_init_s: how long an on-demand environment's Init may run. "The Init phase is
            limited to 10 seconds. If all three tasks do not complete within 10 seconds, Lambda
            retries the Init phase at the time of the first function invocation with the configured
            function timeout." (https://docs.aws.amazon.com/lambda/latest/dg/lambda-runtime-environment.html#runtimes-lifecycle-ib)
        provisioned_init_s: the floor of a provisioned environment's Init limit. "The 10-second
            timeout doesn't apply to functions that are using provisioned concurrency [...]. The time
            limit is 130 seconds or the configured function timeout (maximum 900 seconds), whichever
            is higher." (same page)
    """

    account_concurrency: int = 1000
    min_unreserved_concurrency: int = 100
    on_demand_init_s: float = 10.0
    provisioned_init_s: float = 130.0

    def __post_init__(self) -> None:
        assert self.account_concurrency >= 1 and self.min_unreserved_concurrency >= 0, self
        assert self.on_demand_init_s > 0 and self.provisioned_init_s > 0, self

    def provisioned_init_limit_s(self, function_timeout_s: float) -> float:
        """A provisioned environment's Init limit for a function with this timeout."""
        return max(self.provisioned_init_s, function_timeout_s)


DEFAULT_LIMITS = LambdaLimits()

MAX_FUNCTION_MEMORY_MB = 10_240
"""A function's memory: "128 MB to 10,240 MB, in 1-MB increments" (the quotas page above); new
accounts get less (3,008 MB), and no AWS API reads an account's cap."""
