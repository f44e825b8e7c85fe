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

The other way to keep a level warm is to **ping** it: the backbone invokes the function's
environments every few minutes, under the idle timeout (``moeless/serving/keep_warm.py``), for a
request and one token's compute each (:func:`ping_cost_usd`): hundreds of times cheaper than
provisioned GB-s, but Lambda does not promise to keep an idle environment, so it is a choice the
user can refuse (``--no-keep-warm``).

:func:`provisioned_for` prices a cold start at ``usd_per_cold_start`` (the Lagrange multiplier of
the latency target) and keeps each level warm the cheaper way when ``lambda * c_j`` pays for it.
``lambda = 0`` provisions only what saves money outright; ``lambda = inf`` keeps every level that
saw a cold start warm. The optimiser (:mod:`moeless.simulation.sizing`) finds the smallest multiplier whose
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


def ping_cost_usd(
    span_s: float, memory_mb: int, ping_s: float, ping_ms: float, prices: LambdaPrices = PRICES
) -> float:
    """$ of keeping one on-demand environment alive over ``span_s`` with a warm-up invoke every
    ``ping_s`` (one request and ``ping_ms`` of billed duration each)."""
    per_ping = prices.per_request + math.ceil(ping_ms) / 1e3 * memory_mb / 1024 * prices.per_gb_second
    return math.ceil(span_s / ping_s) * per_ping


@dataclass(frozen=True)
class Warmth:
    """One function's answer: ``provisioned`` environments, then ``keep_warm`` more kept alive by pings."""

    provisioned: int = 0
    keep_warm: int = 0


def provisioned_for(
    demand: LevelDemand,
    span_s: float,
    memory_mb: int,
    usd_per_cold_start: float,
    prices: LambdaPrices = PRICES,
    ping_usd: float | None = None,
) -> Warmth:
    """How one function's levels are kept warm at ``usd_per_cold_start`` per cold start.

    Each level that saw cold starts is worth keeping warm when they cost at least the cheaper way
    to do it: provisioning (:func:`level_cost_usd`) or, where ``ping_usd`` is given, pinging an
    on-demand environment (:func:`ping_cost_usd`); a level provisioning saves money on is always
    provisioned. The function's provisioned concurrency is the highest provisioned level, its
    ``keep_warm`` the pinged levels above it. Both only grow with the price.
    """
    provisioned = pinged = 0
    for index, (busy, cold) in enumerate(zip(demand.busy_s, demand.cold_starts, strict=True)):
        level = index + 1
        provision = level_cost_usd(busy, span_s, memory_mb, prices)
        cheapest = provision if ping_usd is None else min(provision, ping_usd)
        if provision <= 0 or (provision <= cheapest and _pays(usd_per_cold_start, cold, cheapest)):
            provisioned = level
        elif _pays(usd_per_cold_start, cold, cheapest):
            pinged = level
    return Warmth(provisioned, max(0, pinged - provisioned))


def _pays(usd_per_cold_start: float, cold_starts: int, cost: float) -> bool:
    return cold_starts > 0 and (math.isinf(usd_per_cold_start) or usd_per_cold_start * cold_starts >= cost)


def with_concurrency(plan: Plan, warmth: dict[str, Warmth]) -> Plan:
    """``plan`` with each function's provisioned concurrency and kept-warm environments set from
    ``warmth`` (absent: none); a reservation below them is raised to them, and each expert's
    provisioned count follows its functions'."""
    functions = []
    for spec in plan.functions:
        chosen = warmth.get(spec.name, Warmth())
        reserved = spec.reserved_concurrency
        needed = chosen.provisioned + chosen.keep_warm
        functions.append(
            replace(
                spec,
                provisioned_concurrency=chosen.provisioned,
                keep_warm=chosen.keep_warm,
                reserved_concurrency=None if reserved is None else max(reserved, needed),
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


def with_replicas(plan: Plan, scale: int) -> Plan:
    """``plan`` with every function-hosted expert's replicas multiplied by ``scale`` (more
    concurrent environments of the same functions; the functions are unchanged)."""
    if scale == 1:
        return plan
    experts = [p if p.function is None else replace(p, replicas=p.replicas * scale) for p in plan.experts]
    return replace(plan, experts=experts)
