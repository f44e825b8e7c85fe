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
user can refuse (``"keep_warm": false`` in the optimiser's ``--search`` file).

:func:`provisioned_for` prices a cold start at ``usd_per_cold_start`` (the Lagrange multiplier of
the latency target) and keeps each level warm the cheaper way when ``lambda * c_j`` pays for it.
``lambda = 0`` provisions only what saves money outright; ``lambda = inf`` keeps every level that
saw a cold start warm. The optimiser (:mod:`moeless.sizing.family`) judges the plan of every
multiplier on its grid in the simulator and keeps the cheapest that meets the SLO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from moeless.aws_prices import PRICES, LambdaPrices, billed_ms, gb_seconds
from moeless.contracts.plan import ExpertPlacement, FunctionSpec, Plan


@dataclass
class LevelDemand:
    """One function's invokes over a span, by concurrency level (index ``j - 1`` for level ``j``):
    how many arrived there, how long they kept an environment busy (s), and how many found their
    level idle for longer than the idle timeout: a cold start on the request path unless the
    level is kept warm (counted whether or not it was, so a warm level's need stays visible)."""

    invokes: list[float] = field(default_factory=list)
    busy_s: list[float] = field(default_factory=list)
    cold_starts: list[float] = field(default_factory=list)

    def add(self, level: int, busy_s: float, cold: bool) -> None:
        invokes = self.invokes
        if len(invokes) < level:  # (the simulator calls this once per invoke: kept lean)
            missing = level - len(invokes)
            invokes += [0] * missing
            self.busy_s += [0.0] * missing
            self.cold_starts += [0] * missing
        index = level - 1
        invokes[index] += 1
        self.busy_s[index] += busy_s
        if cold:
            self.cold_starts[index] += 1

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
    per_ping = prices.per_request + gb_seconds(billed_ms(ping_ms), memory_mb) * prices.per_gb_second
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


def _pays(usd_per_cold_start: float, cold_starts: float, cost: float) -> bool:
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


def levels_in_reach(plan: Plan, rows_per_step: int, max_rows: int, loops: int = 1) -> dict[str, int]:
    """The most environments of each function that one step's invokes can hold at once.

    A step routes at most ``rows_per_step`` rows to an expert (each token picks an expert once:
    at most the step's tokens), split over its replicas and cut at ``max_rows`` rows per invoke
    (the payload limit); a layer's invokes all return before the next layer's go out, so a
    function hosting experts of several layers needs the most of any one layer. ``loops`` steps
    in flight at once multiply it. Keeping every such level warm leaves no cold start on the
    request path, whatever the traffic, within that bound.
    """
    by_layer: dict[tuple[str, int], int] = {}
    for (layer, _), names in plan.invoke_targets().items():
        per_replica = math.ceil(rows_per_step / len(names))
        pieces = max(math.ceil(per_replica / max_rows), 1)
        for name in names:
            by_layer[(name, layer)] = by_layer.get((name, layer), 0) + pieces
    reach = {f.name: 0 for f in plan.functions}
    for (name, _), count in by_layer.items():
        reach[name] = max(reach.get(name, 0), count * loops)
    return reach


class LevelClock:
    """When each concurrency level of each function was last in use: an invoke at level j uses
    levels 1..j (that many environments were busy at once). Tells whether an invoke's level was
    idle longer than ``idle_timeout_s``, i.e. whether on-demand Lambda alone would have had a
    cold environment for it. The simulator and the serving path count cold starts this way."""

    def __init__(self, idle_timeout_s: float) -> None:
        self.idle_timeout_s = idle_timeout_s
        self._last: dict[str, list[float]] = {}

    def touch(self, function: str, level: int, now: float) -> bool:
        """Record an invoke at ``level``; returns whether that level was idle past the timeout."""
        last = self._last.get(function)
        if last is None:
            last = self._last[function] = []
        known = len(last)
        idle = level > known or now - last[level - 1] > self.idle_timeout_s
        if level > known:
            last += [now] * (level - known)
        if level == 1:
            last[0] = now
        else:
            last[:level] = [now] * level
        return idle

    def in_use(self, function: str, now: float) -> int:
        """How many of ``function``'s levels were used within the idle timeout (an invoke at level
        j uses 1..j, so they are the lowest ones)."""
        return sum(now - t <= self.idle_timeout_s for t in self._last.get(function, ()))

    def all_in_use(self, now: float) -> dict[str, int]:
        """:meth:`in_use` of every function with a level in use."""
        counts = {name: self.in_use(name, now) for name in self._last}
        return {name: n for name, n in counts.items() if n}

    def warmed(self, function: str, levels: int, now: float) -> None:
        """``levels`` environments of ``function`` were just warmed (a warm-up pass)."""
        last = self._last.setdefault(function, [])
        last.extend([now] * (levels - len(last)))
        last[:levels] = [now] * levels


class Hysteresis:
    """Let a proposed provisioned count through only once it has been proposed ``up_after`` (rising)
    or ``down_after`` (falling) re-plans in a row."""

    def __init__(self, up_after: int = 1, down_after: int = 3) -> None:
        self.up_after, self.down_after = up_after, down_after
        self._streak: dict[str, tuple[int, int]] = {}  # function -> (proposed value, times in a row)

    def admit(self, function: str, current: int, proposed: int) -> int:
        """The value to apply now: ``proposed`` once it has persisted, else ``current``."""
        if proposed == current:
            self._streak.pop(function, None)
            return current
        value, times = self._streak.get(function, (proposed, 0))
        times = times + 1 if value == proposed else 1
        self._streak[function] = (proposed, times)
        needed = self.up_after if proposed > current else self.down_after
        if times >= needed:
            self._streak.pop(function, None)
            return proposed
        return current


@dataclass
class _Forecast:
    """One function's forecaster state, per level: the short memory's means, and the long memory's
    decayed sums and the decayed count of windows they hold (their mean is sum / weight)."""

    busy_per_s: list[float] = field(default_factory=list)
    cold_per_s: list[float] = field(default_factory=list)
    long_busy: list[float] = field(default_factory=list)
    long_cold: list[float] = field(default_factory=list)
    weight: float = 0.0

    def fold(self, busy: list[float], cold: list[float], smoothing: float, decay: float) -> None:
        """Fold one window's rates (per level, per second) into both memories; pads ``busy`` and
        ``cold`` with zeros to the levels known."""
        known = len(self.busy_per_s)
        levels = max(known, len(busy))
        busy.extend([0.0] * (levels - len(busy)))
        cold.extend([0.0] * (levels - len(cold)))
        self.busy_per_s += busy[known:]  # a level's short memory starts at its first window
        self.cold_per_s += cold[known:]
        self.long_busy.extend([0.0] * (levels - known))
        self.long_cold.extend([0.0] * (levels - known))
        for index in range(levels):
            self.busy_per_s[index] += smoothing * (busy[index] - self.busy_per_s[index])
            self.cold_per_s[index] += smoothing * (cold[index] - self.cold_per_s[index])
            self.long_busy[index] = decay * self.long_busy[index] + busy[index]
            self.long_cold[index] = decay * self.long_cold[index] + cold[index]
        self.weight = decay * self.weight + 1.0


LONG_MEMORY_S = 1800.0  # the re-planner's long memory: a window's weight halves every 30 minutes
REPLAN_SMOOTHING = 0.5  # the short memory: each window's weight against the forecast so far
REPLAN_DOWN_AFTER = 3  # windows a lower level must persist before the re-planner takes it


class ForecastReplanner:
    """Re-sizes each function's warmth every window from a forecast of the next one.

    The forecaster, per function and level, of the busy seconds and the idle-past-timeout invokes
    per second, is the highest of three:

    * the newest window (a rising burst is met at once);
    * a short memory: an exponentially weighted mean over windows, weight ``smoothing`` on the
      newest (a burst that passes is let go within minutes);
    * a long memory: the mean over the past hours, each window's weight halving every
      ``memory_s`` seconds (normalised by the weights, so it is a mean from the first window on).

    The long memory is what thin traffic needs. Each arriving request's prefill touches every
    function, and a level that requests minutes apart each find idle past the timeout needs
    warming at the rate requests arrive, not at the rate of the last window: a quiet window
    between two requests says nothing about the next one. With the short memory alone the
    forecast decayed in every gap, the levels were let go, and the next request met cold
    functions at every layer. On a steady stream the long memory's decision is the static plan's
    (the same rule on the same rate).

    **The plan it started from is a floor**: for good by default (``hold_s=None``), or until it
    has watched ``hold_s`` seconds. That plan was sized for the SLO, with the simulator, on a whole
    trace; a re-plan adds the warmth traffic the plan did not foresee asks for, and lets it go
    again. Below the plan a per-window price cannot judge: it prices each function's cold starts
    one by one, but a step waits for the slowest invoke of each of its layers. When traffic thins
    (the tail of a burst: a few sequences decoding), each function's demand is too thin to pay for
    its warmth while every token meets cold starts at many layers; slower tokens use each level
    less often, more levels go idle past the timeout, and the tail decodes ever slower. With a
    30-minute hold, two hours of conversations ended that way (``benchmarks/replanner_thin.py
    --replay-window 7200``): once arrivals stopped the re-planner let 15,358 provisioned
    environments down to about 1,300 while six requests were still decoding, and two of them had
    not finished four hours later. To follow traffic down, size a plan again for the new rate.

    The forecast demand for one window is sized by :func:`provisioned_for` at the plan's price of
    a cold start, so a re-plan and the plan it started from answer the same question.

    :class:`Hysteresis` lets increases through at once and a decrease only once it was proposed
    ``down_after`` windows in a row: provisioned concurrency is billed in 5-minute steps and takes
    minutes to be ready, so one quiet window must not drop what the next burst needs. A re-plan
    never drops a provisioned environment that is in use (``in_use``): serving an invoke, or at a
    level used within the idle timeout. On-demand Lambda keeps such a level warm only once an
    on-demand environment exists, so removing its provisioned one makes the level's next invoke a
    cold start on the request path, one the demand never counts (the level was not idle): at
    thin traffic that is every function at once. A provisioned level goes once it has been idle
    past the timeout, where its next use would be cold anyway and is counted as demand.
    """

    def __init__(
        self,
        memory_mb: dict[str, int],
        usd_per_cold_start: float,
        ping_usd_per_s: float | None = None,
        smoothing: float = REPLAN_SMOOTHING,
        down_after: int = REPLAN_DOWN_AFTER,
        prices: LambdaPrices = PRICES,
        memory_s: float | None = LONG_MEMORY_S,
        hold_s: float | None = None,
    ) -> None:
        self.memory_mb = memory_mb
        self.usd_per_cold_start = usd_per_cold_start
        self.ping_usd_per_s = ping_usd_per_s
        self.smoothing = smoothing
        self.memory_s = memory_s  # None: no long memory (the short one alone)
        self.hold_s = hold_s  # None: the plan it started from is a floor for good
        self.prices = prices
        self.hysteresis = Hysteresis(up_after=1, down_after=down_after)
        self._forecast: dict[str, _Forecast] = {}
        self._planned: dict[str, Warmth] | None = None  # the warmth of the first re-plan's plan
        self._watched_s = 0.0

    @classmethod
    def from_plan(cls, plan: Plan) -> ForecastReplanner | None:
        """The re-planner a sized plan asks for in ``params["replan"]`` (``None``: it has none).

        Keys: ``interval_s``, ``usd_per_cold_start`` (``null``: infinite), ``ping_usd_per_s``
        (``null``: provisioned concurrency only), ``smoothing``, ``down_after``, ``memory_s`` (the
        long memory's half-life; ``null``: none), ``hold_s`` (how long the plan is a floor;
        absent or ``null``: for good)."""
        params = plan.params.get("replan")
        if not isinstance(params, dict):
            return None
        price = params.get("usd_per_cold_start")
        ping = params.get("ping_usd_per_s")
        memory = params.get("memory_s", LONG_MEMORY_S)
        hold = params.get("hold_s")
        return cls(
            {f.name: f.memory_mb for f in plan.functions},
            math.inf if price is None else float(price),
            None if ping is None else float(ping),
            float(params.get("smoothing", REPLAN_SMOOTHING)),
            int(params.get("down_after", REPLAN_DOWN_AFTER)),
            memory_s=None if memory is None else float(memory),
            hold_s=None if hold is None else float(hold),
        )

    def forecast(self, window: dict[str, LevelDemand], window_s: float) -> dict[str, LevelDemand]:
        """Fold one window into the forecast; returns the demand expected in the next window."""
        decay = 0.0 if self.memory_s is None else 0.5 ** (window_s / self.memory_s)
        expected = {}
        for name in set(self._forecast) | set(window):
            state = self._forecast.setdefault(name, _Forecast())
            seen = window.get(name, LevelDemand())
            busy = [b / window_s for b in seen.busy_s]
            cold = [c / window_s for c in seen.cold_starts]
            state.fold(busy, cold, self.smoothing, decay)
            demand = LevelDemand()
            for index in range(len(state.busy_per_s)):
                long_busy = state.long_busy[index] / state.weight if self.memory_s else 0.0
                long_cold = state.long_cold[index] / state.weight if self.memory_s else 0.0
                demand.invokes.append(0.0)
                demand.busy_s.append(max(busy[index], state.busy_per_s[index], long_busy) * window_s)
                demand.cold_starts.append(max(cold[index], state.cold_per_s[index], long_cold) * window_s)
            expected[name] = demand
        return expected

    def update(
        self,
        window: dict[str, LevelDemand],
        window_s: float,
        current: dict[str, Warmth],
        in_use: dict[str, int] | None = None,
    ) -> dict[str, Warmth]:
        """The warmth of every function in ``current`` for the next window (see the class doc)."""
        expected = self.forecast(window, window_s)
        using = in_use or {}
        if self._planned is None:
            self._planned = dict(current)
        self._watched_s += window_s
        holding = self.hold_s is None or self._watched_s < self.hold_s
        chosen = {}
        for name, now in current.items():
            memory = self.memory_mb.get(name, 1769)
            ping = None if self.ping_usd_per_s is None else self.ping_usd_per_s * window_s
            proposal = provisioned_for(
                expected.get(name, LevelDemand()),
                window_s,
                memory,
                self.usd_per_cold_start,
                self.prices,
                ping,
            )
            if holding:  # the plan it started from is a floor (the class doc)
                start = self._planned.get(name, Warmth())
                proposal = Warmth(
                    max(proposal.provisioned, start.provisioned), max(proposal.keep_warm, start.keep_warm)
                )
            provisioned = self.hysteresis.admit(f"{name}/provisioned", now.provisioned, proposal.provisioned)
            provisioned = max(provisioned, min(now.provisioned, using.get(name, 0)))
            kept = self.hysteresis.admit(f"{name}/keep_warm", now.keep_warm, proposal.keep_warm)
            chosen[name] = Warmth(provisioned, kept)
        return chosen
