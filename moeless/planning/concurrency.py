"""How much provisioned concurrency each function gets: a rule on the demand it sees, by level.

On Lambda a replica is one more concurrent execution environment of the same function, so the
replica optimiser's output is, function by function, an integer provisioned concurrency ``p``: the
first ``p`` invokes in flight at once find a warm environment whatever the traffic did before;
beyond them, on-demand environments serve, warm if one was used within the idle timeout, else
after a cold start on the request path.

A function's demand is counted by **level**: an invoke at level ``j`` found ``j - 1`` of the
function's environments busy (:class:`LevelDemand`, recorded by the simulator, or by the serving
path). Provisioning level ``j`` over a span of ``S`` seconds, for memory ``m`` GB:

* costs ``S * m * provisioned_price`` and turns the level's busy seconds ``b_j`` from the on-demand
  duration price into the cheaper provisioned one: net ``m * (S * P_prov + b_j * (P_pdur - P_dur))``,
  negative (provisioning saves money) once level ``j`` is busy more than about 60% of the time;
* saves the level's cold starts ``c_j`` on the request path.

:func:`provisioned_for` prices a cold start at ``usd_per_cold_start`` (the Lagrange multiplier of
the latency target) and provisions the highest level that pays: ``lambda * c_j >= net cost_j``.
``lambda = 0`` provisions only what saves money outright; ``lambda = inf`` every level that saw a
cold start. The optimiser (:mod:`moeless.simulation.sizing`) finds the smallest multiplier whose
plan meets the SLO in the simulator; the result is monotone in it, so a tighter SLO never costs less.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from moeless.aws_prices import PRICES, LambdaPrices
from moeless.contracts.plan import ExpertPlacement, FunctionSpec, Plan


@dataclass
class LevelDemand:
    """One function's invokes over a span, by concurrency level (index ``j - 1`` for level ``j``):
    how many arrived there, how long they kept an environment busy (s), and how many waited for a
    cold or still-initialising environment on the request path."""

    invokes: list[int] = field(default_factory=list)
    busy_s: list[float] = field(default_factory=list)
    cold_starts: list[int] = field(default_factory=list)

    def add(self, level: int, busy_s: float, cold: bool) -> None:
        while len(self.invokes) < level:
            self.invokes.append(0)
            self.busy_s.append(0.0)
            self.cold_starts.append(0)
        self.invokes[level - 1] += 1
        self.busy_s[level - 1] += busy_s
        self.cold_starts[level - 1] += int(cold)

    @property
    def peak(self) -> int:
        """The highest level any invoke reached (the most environments in use at once)."""
        return len(self.invokes)


def level_cost_usd(busy_s: float, span_s: float, memory_mb: int, prices: LambdaPrices = PRICES) -> float:
    """The net $ of provisioning one level over ``span_s``: the provisioned GB-s, less what its busy
    seconds save at the provisioned duration price (negative: provisioning is the cheaper way)."""
    gb = memory_mb / 1024
    saved = busy_s * gb * (prices.per_gb_second - prices.provisioned_duration_per_gb_second)
    return span_s * gb * prices.provisioned_per_gb_second - saved


def provisioned_for(
    demand: LevelDemand,
    span_s: float,
    memory_mb: int,
    usd_per_cold_start: float,
    prices: LambdaPrices = PRICES,
) -> int:
    """The provisioned concurrency of one function: the highest level whose cold starts, at
    ``usd_per_cold_start`` each, are worth its net cost over the span (0: none pays)."""
    chosen = 0
    for index, (busy, cold) in enumerate(zip(demand.busy_s, demand.cold_starts, strict=True)):
        cost = level_cost_usd(busy, span_s, memory_mb, prices)
        worth = usd_per_cold_start * cold if cold else 0.0
        if cost <= 0 or (cold and (math.isinf(usd_per_cold_start) or worth >= cost)):
            chosen = index + 1
    return chosen


def with_concurrency(plan: Plan, provisioned: dict[str, int]) -> Plan:
    """``plan`` with each function's provisioned concurrency set from ``provisioned`` (absent: 0); a
    reservation below it is raised to it, and each expert's count follows its functions'."""
    functions = []
    for spec in plan.functions:
        count = int(provisioned.get(spec.name, 0))
        reserved = spec.reserved_concurrency
        functions.append(
            replace(
                spec,
                provisioned_concurrency=count,
                reserved_concurrency=None if reserved is None else max(reserved, count),
            )
        )
    by_name = {f.name: f for f in functions}
    hosts = plan.replica_functions()
    experts: list[ExpertPlacement] = [
        replace(
            p,
            provisioned_concurrency=sum(
                by_name[name].provisioned_concurrency for name in hosts.get((p.layer, p.expert), [])
            ),
        )
        for p in plan.experts
    ]
    return replace(plan, experts=experts, functions=functions)


def with_memory(plan: Plan, memory_mb: int) -> Plan:
    """``plan`` with every function (and the experts it hosts) at ``memory_mb``."""
    functions: list[FunctionSpec] = [replace(f, memory_mb=memory_mb) for f in plan.functions]
    experts = [p if p.function is None else replace(p, memory_mb=memory_mb) for p in plan.experts]
    return replace(plan, experts=experts, functions=functions)
