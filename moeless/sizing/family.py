"""One structure's family of plans: the warmth each price of a cold start buys, and how each served.

The structure is first **probed**: the simulator replays the planning traffic through it with
nothing warm, after a quiet (no warm-up pass), and records what each function saw by concurrency
level. Each price of a cold start on :data:`~moeless.sizing.settings.PRICE_GRID` then keeps warm
the levels whose cold starts are worth that price (:func:`~moeless.planning.concurrency.provisioned_for`),
and each distinct plan is one candidate; with the search's options, so are every level in reach
kept warm, and every function warm to one level (docs/planner.md, steps 2, 3, 7 and 8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from moeless.contracts.environment import KEEP_WARM_PING_S
from moeless.contracts.plan import Plan
from moeless.planning.concurrency import (
    LONG_MEMORY_S,
    REPLAN_DOWN_AFTER,
    REPLAN_SMOOTHING,
    LevelDemand,
    Warmth,
    ping_cost_usd,
    provisioned_for,
    with_concurrency,
)
from moeless.planning.cost_model import EXPERT_DTYPES
from moeless.simulation.policies import Deployment
from moeless.sizing.settings import MAX_UNIFORM_LEVEL, PRICE_GRID, SearchSpace
from moeless.sizing.structures import Structure


@dataclass(frozen=True)
class FrontierPoint:
    """One plan of a family and how it served the planning traffic."""

    structure: Structure
    usd_per_cold_start: float  # the price its warmth was sized at (inf: every level, or a uniform one)
    plan: Plan
    summary: dict[str, Any]
    uniform_level: int | None = None  # every function warm to this level (None: sized per level)
    every_level: bool = False  # every level in reach warm (step 7)

    @property
    def memory_mb(self) -> int:
        return self.structure.memory_mb

    @property
    def replica_scale(self) -> int:
        return self.structure.replica_scale

    @property
    def packing(self) -> int:
        return self.structure.packing

    @property
    def group(self) -> int:
        return self.structure.group

    @property
    def expert_dtype(self) -> str:
        return self.structure.variant.expert_dtype

    @property
    def prefill_chunk(self) -> int | None:
        return self.structure.variant.prefill_chunk

    @property
    def speculate(self) -> int:
        return self.structure.variant.speculate

    @property
    def stall_tpot_ms(self) -> float | None:
        return self.structure.stall_tpot_ms

    @property
    def usd_per_1k(self) -> float:
        return float(self.summary["usd_per_1k_requests"])

    @property
    def finished(self) -> bool:
        """Whether every request completed: otherwise its p99 covers only those that did."""
        return bool(self.summary["completed"] == self.summary["requests"])

    @property
    def provisioned(self) -> int:
        return sum(f.provisioned_concurrency for f in self.plan.functions)

    @property
    def keep_warm(self) -> int:
        return sum(f.keep_warm for f in self.plan.functions)

    def row(self) -> dict[str, Any]:
        """The point as a CSV row (frontier.csv)."""
        summary = self.summary
        return {
            "policy": self.plan.policy,
            "tier": self.structure.tier,
            "backbone": self.structure.variant.backbone.label(),
            "offload_rows": self.structure.offload_rows or "",
            "memory_mb": self.memory_mb,
            "replica_scale": self.replica_scale,
            "packing": self.packing,
            "group": self.group,
            "expert_dtype": self.expert_dtype,
            "prefill_chunk": self.prefill_chunk or "",
            "speculate": self.speculate,
            "usd_per_cold_start": self.usd_per_cold_start,
            "stall_tpot_ms_p99": "" if self.stall_tpot_ms is None else self.stall_tpot_ms,
            "uniform_level": "" if self.uniform_level is None else self.uniform_level,
            "every_level": self.every_level,
            "provisioned": self.provisioned,
            "keep_warm": self.keep_warm,
            "usd_per_1k_requests": self.usd_per_1k,
            "tpot_ms_p99": _blank(summary["tpot_ms_p99"]),
            "ttft_ms_p99": _blank(summary["ttft_ms_p99"]),
            "cold_start_share": summary["cold_starts"] / max(summary["invokes"], 1),
            "completed": summary["completed"],
            "requests": summary["requests"],
        }


def _blank(value: float | None) -> float | str:
    return "" if value is None else value


@dataclass(frozen=True)
class Candidate:
    """A plan of a family before it is simulated: its structure, warmth and how it was chosen."""

    structure: Structure
    usd_per_cold_start: float
    plan: Plan
    uniform_level: int | None = None
    every_level: bool = False

    @property
    def warm(self) -> bool:
        """Whether it keeps anything warm or re-plans (else it is its structure's probe)."""
        return self.plan.params.get("replan") is not None or any(
            f.provisioned_concurrency or f.keep_warm for f in self.plan.functions
        )

    def key(self) -> tuple[Any, ...]:
        """Plans that come out the same are simulated once (with a re-planner the price is part of
        the plan: the re-planner prices cold starts as the plan was sized)."""
        counts = tuple((f.provisioned_concurrency, f.keep_warm) for f in self.plan.functions)
        replan = self.plan.params.get("replan")
        return (self.structure.key, counts, None if replan is None else self.usd_per_cold_start)

    def judged(self, summary: dict[str, Any]) -> FrontierPoint:
        return FrontierPoint(
            self.structure, self.usd_per_cold_start, self.plan, summary, self.uniform_level, self.every_level
        )


def family(
    structure: Structure,
    demand: dict[str, LevelDemand],
    span_s: float,
    search: SearchSpace,
) -> list[Candidate]:
    """The candidates of ``structure`` the search asks for, from its probe's ``demand``."""
    ping_usd = _ping_usd(structure.variant, structure.memory_mb, span_s) if search.keep_warm else None
    replan = _replanner(structure, search)
    built: dict[tuple[Any, ...], Plan] = {}  # most prices keep the same warmth: one plan each

    def candidate(
        price: float, warmth: dict[str, Warmth], uniform: int | None = None, every: bool = False
    ) -> Candidate:
        key = (tuple(warmth), tuple((w.provisioned, w.keep_warm) for w in warmth.values()))
        plan = built.get(key) or built.setdefault(key, with_concurrency(structure.plan, warmth))
        if replan is not None:  # the re-planner prices cold starts as the plan was sized
            params = replan | {"usd_per_cold_start": None if math.isinf(price) else price}
            plan = replace(plan, params=plan.params | {"replan": params})
        return Candidate(structure, price, plan, uniform, every)

    def warm_to(levels: dict[str, int]) -> dict[str, Warmth]:
        """``levels`` of each function warm: provisioned, or, with pings allowed, pinged above
        the levels that provisioning pays for outright."""
        if ping_usd is None:
            return {name: Warmth(level, 0) for name, level in levels.items()}
        warmth = {}
        for name, level in levels.items():
            seen = demand.get(name)
            kept = (
                provisioned_for(seen, span_s, structure.memory_mb, 0.0, ping_usd=ping_usd)
                if seen is not None
                else Warmth()
            )
            provisioned = min(kept.provisioned, level)
            warmth[name] = Warmth(provisioned, level - provisioned)
        return warmth

    if not structure.plan.functions:  # every expert on the backbone: nothing to keep warm
        return [candidate(0.0, {})]
    every = search.warm_every_level or search.uniform_levels or search.premium is not None
    reach = structure.reach() if every else {}
    if search.warm_every_level:
        return [candidate(math.inf, warm_to(reach), every=True)]
    found = [
        candidate(
            price,
            {
                name: provisioned_for(seen, span_s, structure.memory_mb, price, ping_usd=ping_usd)
                for name, seen in demand.items()
            },
        )
        for price in PRICE_GRID
    ]
    if search.uniform_levels:
        top = min(max(reach.values(), default=0), MAX_UNIFORM_LEVEL)
        found += [
            candidate(math.inf, warm_to({name: min(level, most) for name, most in reach.items()}), level)
            for level in range(top + 1)
        ]
    if search.premium is not None:
        found.append(candidate(math.inf, warm_to(reach), every=True))
    return found


def _replanner(structure: Structure, search: SearchSpace) -> dict[str, Any] | None:
    """The forecasting re-planner's settings a sized plan carries (``None``: no re-planner)."""
    if not search.replan_s:
        return None
    one_round = _ping_usd(structure.variant, structure.memory_mb, KEEP_WARM_PING_S)
    return {
        "interval_s": search.replan_s,
        "ping_usd_per_s": one_round / KEEP_WARM_PING_S if search.keep_warm else None,
        "smoothing": REPLAN_SMOOTHING,
        "down_after": REPLAN_DOWN_AFTER,
        "memory_s": LONG_MEMORY_S,
        "hold_s": None,
    }


def _ping_usd(deployment: Deployment, memory_mb: int, span_s: float) -> float:
    """What keeping one environment of ``memory_mb`` alive by pings costs over the span."""
    model, size = deployment.model, deployment.expert_size()
    speedup = EXPERT_DTYPES[deployment.expert_dtype].compute_speedup
    ping_ms = (
        model.expert_ms(1, size.hidden, size.intermediate, model.vcpus(memory_mb), size.weight_bytes)
        / speedup
    )
    return ping_cost_usd(span_s, memory_mb, KEEP_WARM_PING_S, ping_ms, model.prices)
