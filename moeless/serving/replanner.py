"""Re-planning while serving: rolling loads in, provisioned concurrency out, with hysteresis.

The dispatcher records the tokens each expert receives (and the predictor, when there is one, its
predicted loads) into :class:`RollingLoads`, which forgets with a half-life. Every interval the
:class:`Replanner` recomputes each deployed function's provisioned concurrency from those loads
(:func:`moeless.planning.planner.reprovision`; functions and placement stay as deployed), lets
:class:`Hysteresis` hold back changes that have not persisted, and applies the rest through the
Lambda API. Provisioned concurrency is billed in 5-minute steps: one burst must not thrash it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from moeless.contracts.environment import ALIAS
from moeless.contracts.loads import Loads
from moeless.contracts.plan import Plan
from moeless.planning.concurrency import ForecastReplanner, Hysteresis, LevelDemand, Warmth, with_concurrency
from moeless.planning.provisioning import Change, apply_changes, plan_changes


class RollingLoads:
    """Exponentially decayed token counts per (layer, expert). Thread-safe.

    Args:
        num_experts: experts per layer.
        half_life_s: a count loses half its weight after this long.
        clock: seconds, monotonic (injectable for tests).
    """

    def __init__(
        self, num_experts: int, half_life_s: float = 120.0, clock: Callable[[], float] = time.monotonic
    ):
        self.num_experts = num_experts
        self.half_life_s = half_life_s
        self.clock = clock
        self._counts: dict[int, np.ndarray] = {}
        self._at = clock()
        self._lock = threading.Lock()

    def _decay(self) -> None:
        now = self.clock()
        factor = math.pow(0.5, (now - self._at) / self.half_life_s)
        for counts in self._counts.values():
            counts *= factor
        self._at = now

    def add(self, layer: int, tokens_per_expert: dict[int, float]) -> None:
        with self._lock:
            self._decay()
            counts = self._counts.setdefault(layer, np.zeros(self.num_experts))
            for expert, tokens in tokens_per_expert.items():
                counts[expert] += tokens

    def snapshot(self) -> Loads | None:
        """Recent routing as rates: tokens per second to each expert (``None`` before anything was seen).

        A steady rate r accumulates decayed counts of r * half_life / ln 2, so that is the divisor.
        """
        with self._lock:
            self._decay()
            if not self._counts:
                return None
            scale = math.log(2) / self.half_life_s
            rates = {layer: counts * scale for layer, counts in sorted(self._counts.items())}
            return Loads(rates, {"unit": "tokens_per_s", "half_life_s": self.half_life_s})


class CombinedLoads:
    """Several rolling sources (observed, predicted) seen as one: per expert, the highest rate."""

    def __init__(self, *sources: RollingLoads) -> None:
        self.sources = sources

    def snapshot(self) -> Loads | None:
        snapshots = [s for s in (source.snapshot() for source in self.sources) if s is not None]
        if not snapshots:
            return None
        layers: dict[int, np.ndarray] = {}
        for snapshot in snapshots:
            for layer, rates in snapshot.layers.items():
                layers[layer] = np.maximum(layers[layer], rates) if layer in layers else rates.copy()
        return Loads(dict(sorted(layers.items())), dict(snapshots[0].meta))


class Replanner:
    """Periodically re-provision the deployed plan's functions from rolling loads.

    Args:
        plan: the deployed plan (its functions and placement are kept).
        loads: where observed (and predicted) loads accumulate.
        reprovision: ``(plan, loads) -> plan`` with new provisioned counts.
        lambda_client: boto3 Lambda client (AWS or the local host).
        alias: the alias carrying provisioned concurrency.
        interval_s: seconds between re-plans (the thread sleeps in between).
    """

    def __init__(
        self,
        plan: Plan,
        loads: RollingLoads | CombinedLoads,
        reprovision: Callable[[Plan, Loads], Plan],
        lambda_client: Any,
        alias: str = ALIAS,
        interval_s: float = 60.0,
        hysteresis: Hysteresis | None = None,
        forecaster: ForecastReplanner | None = None,
        demand: Callable[[], tuple[dict[str, LevelDemand], dict[str, int]]] | None = None,
        on_plan: Callable[[Plan], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plan = plan
        self.loads = loads
        self.reprovision = reprovision
        # a sized plan's re-planner (moeless plan --replan-interval): the demand by level since the
        # last step, forecast and sized as the simulator does, instead of the rolling-rate rule
        self.forecaster = forecaster
        self.demand = demand
        self.on_plan = on_plan
        self.clock = clock
        self._last_step = clock()
        self.client = lambda_client
        self.alias = alias
        self.interval_s = interval_s
        self.hysteresis = hysteresis or Hysteresis()
        self.applied: list[Change] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> list[Change]:
        """One re-plan: propose, filter by hysteresis, apply the provisioned changes that pass."""
        if self.forecaster is not None and self.demand is not None:
            return self._forecast_step(self.forecaster, self.demand)
        loads = self.loads.snapshot()
        if loads is None:
            return []
        proposed = self.reprovision(self.plan, loads)
        current = {f.name: f.provisioned_concurrency for f in self.plan.functions}
        for spec in proposed.functions:
            spec.provisioned_concurrency = self.hysteresis.admit(
                spec.name, current.get(spec.name, 0), spec.provisioned_concurrency
            )
        changes = [c for c in plan_changes(self.client, proposed, self.alias) if c.setting == "provisioned"]
        apply_changes(self.client, changes, self.alias)
        self.plan = proposed
        self.applied += changes
        return changes

    def _forecast_step(
        self,
        forecaster: ForecastReplanner,
        demand: Callable[[], tuple[dict[str, LevelDemand], dict[str, int]]],
    ) -> list[Change]:
        now = self.clock()
        window_s, self._last_step = max(now - self._last_step, 1e-3), now
        window, in_use = demand()
        current = {f.name: Warmth(f.provisioned_concurrency, f.keep_warm) for f in self.plan.functions}
        proposed = with_concurrency(self.plan, forecaster.update(window, window_s, current, in_use))
        changes = [c for c in plan_changes(self.client, proposed, self.alias) if c.setting == "provisioned"]
        apply_changes(self.client, changes, self.alias)
        self.plan = proposed
        self.applied += changes
        if self.on_plan is not None:
            self.on_plan(proposed)
        return changes

    def start(self) -> Replanner:
        self._thread = threading.Thread(target=self._run, name="replanner", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.step()
            except Exception:  # a failed re-plan keeps the fleet as it is; the next interval tries again
                self.errors += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
