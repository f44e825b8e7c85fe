"""The replica optimiser: the cheapest plan that meets a latency SLO on the given traffic.

:func:`size_for_slo` builds the candidate structures (:mod:`~moeless.sizing.structures`), probes
each, sizes its family of warmth (:mod:`~moeless.sizing.family`), has the simulator judge the
candidates and chooses among them (:mod:`~moeless.sizing.choice`). The algorithm, step by step,
with why each step is there: docs/planner.md ("Sizing provisioned concurrency for an SLO").

Judging is the cost: each candidate is a replay of the whole model. Candidates are judged in
worker processes, in order of a lower bound on their cost (what the plan costs standing, whatever
its traffic: the backbone, provisioned GB-s and pings over the window); one whose bound is above
every cost that could still be chosen is not simulated, and a run stops once it certainly misses
the SLO. Neither changes a choice (docs/planner.md, "Judged in order of a bound");
``SearchSpace.exhaustive`` judges every candidate to its end (the frontier shows every point).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tqdm import tqdm

from moeless.contracts.environment import KEEP_WARM_PING_S
from moeless.contracts.plan import Backbone, Plan, PlanEstimate, Policy
from moeless.errors import SimulationError
from moeless.planning.concurrency import ping_cost_usd
from moeless.planning.quotas import layer_invokes
from moeless.simulation.policies import Deployment
from moeless.simulation.routing import StepRouting
from moeless.simulation.simulator import GiveUp, PrewarmModel, Request
from moeless.sizing.choice import Sizing, SloUnreachable, choose, premium_paid
from moeless.sizing.family import Candidate, FrontierPoint, family
from moeless.sizing.fitting import LeftOut, fitting, refuse_none_fits
from moeless.sizing.report import cheapest_by_tier
from moeless.sizing.runner import Job, Runner, Traffic, runner
from moeless.sizing.settings import DEFAULT_SEARCH, SearchSpace
from moeless.sizing.slo import Slo, check_judgeable
from moeless.sizing.structures import Structure, floor_ms, structures

SIZED_POLICIES = (Policy.MOELESS, Policy.REMOE)


def size_for_slo(
    policy: str,
    deployment: Deployment,
    routing: StepRouting,
    replay: list[Request],
    duration_s: float,
    slo: Slo,
    search: SearchSpace = DEFAULT_SEARCH,
    *,
    prewarm: dict[str, PrewarmModel] | None = None,
    seed: int = 0,
    progress: bool = False,
) -> Sizing:
    """The cheapest plan of ``policy`` that meets ``slo`` on ``replay`` within ``search``.

    Plans the account's quotas (``search.quotas``) cannot hold are left out unjudged
    (:mod:`~moeless.sizing.fitting`).

    Raises:
        SloUnreachable: no plan meets it; the error carries every point tried.
        PlanDoesNotFit: no candidate fits the account's quotas; names the smallest increase.
        SimulationError: the policy cannot plan this deployment, or the traffic judges nothing.
    """
    (sizing,) = size_for_slos(
        policy, deployment, routing, replay, duration_s, [slo], search, prewarm=prewarm, seed=seed,
        progress=progress,
    )  # fmt: skip
    if sizing.chosen is None:
        raise SloUnreachable(sizing)
    return sizing


def size_for_slos(
    policy: str,
    deployment: Deployment,
    routing: StepRouting,
    replay: list[Request],
    duration_s: float,
    slos: Sequence[Slo],
    search: SearchSpace = DEFAULT_SEARCH,
    *,
    prewarm: dict[str, PrewarmModel] | None = None,
    seed: int = 0,
    progress: bool = False,
) -> list[Sizing]:
    """:func:`size_for_slo` for each of ``slos`` on the same traffic, the structures probed once
    (the probes do not depend on the SLO; each SLO's candidates are judged against it); a sizing
    whose SLO no plan meets has no ``chosen``.

    Raises:
        PlanDoesNotFit: no candidate fits the account's quotas; names the smallest increase.
        SimulationError: the policy cannot plan this deployment, or the traffic judges nothing.
    """
    if policy not in SIZED_POLICIES:
        raise SimulationError(f"the replica optimiser sizes moeless or remoe plans, not {policy!r}")
    check_judgeable(replay, duration_s)
    shapes = list(structures(policy, deployment, routing, search, replay, duration_s))
    shapes, left_out = fitting(shapes, _plan, search.quotas)
    if not shapes:
        refuse_none_fits(policy, left_out)
    traffic = Traffic(policy, routing, replay, duration_s, search, prewarm, seed)
    sizings = []
    with runner(traffic, search.processes) as run:
        candidates, probes = _probe(shapes, run, search, progress)
        invokes = {shape.key: layer_invokes(shape.plan) for shape in shapes}  # warmth leaves them be
        candidates, too_warm = fitting(candidates, _plan, search.quotas, lambda c: invokes[c.structure.key])
        for slo in slos:
            points, simulated, skipped = _judge(candidates, probes, run, slo, search, progress)
            counts = (simulated, skipped, (*left_out, *too_warm))
            sizing = _answer(policy, slo, points, floor_ms(deployment, search), search, *counts)
            sizings.append(_with_chosen_plan(sizing, run) if sizing.chosen is not None else sizing)
    return sizings


def _with_chosen_plan(sizing: Sizing, run: Runner) -> Sizing:
    """``sizing`` with its chosen plan annotated (stall-probed first where the search did not)."""
    chosen = sizing.chosen
    assert chosen is not None
    if chosen.stall_tpot_ms is None:  # probed anyway, for what the plan says of it
        (stall,) = run.run([Job("stall", chosen.structure.variant, chosen.structure.plan)])
        assert isinstance(stall, float)
        chosen = replace(chosen, structure=replace(chosen.structure, stall_tpot_ms=stall))
    annotated = replace(chosen, plan=_annotated(chosen, sizing))
    judged = tuple(annotated if p is sizing.chosen else p for p in sizing.points)
    return replace(sizing, chosen=annotated, points=judged)


def _plan(item: Structure | Candidate) -> Plan:
    return item.plan


def _probe(
    shapes: list[Structure], run: Runner, search: SearchSpace, progress: bool
) -> tuple[list[Candidate], dict[tuple[object, ...], dict[str, Any]]]:
    """Each structure's probe (nothing warm, after a quiet) and family, and with the stall bound its
    stall probe: every candidate (its structure with its stall figure), and each probe's summary."""
    probed = not (search.warm_every_level and not search.keep_warm)  # else no family reads it
    jobs = [Job.probe(s) for s in shapes] if probed else []
    if search.stall_bound:
        jobs += [Job("stall", s.variant, s.plan) for s in shapes]
    with tqdm(
        total=len(jobs), desc=f"probing {len(shapes)} structures", unit="run", disable=not progress
    ) as bar:
        outcomes = run.run(jobs, bar)
    stalls = outcomes[len(outcomes) - len(shapes) :] if search.stall_bound else [None] * len(shapes)
    candidates: list[Candidate] = []
    summaries: dict[tuple[object, ...], dict[str, Any]] = {}
    for index, (shape, stall) in enumerate(zip(shapes, stalls, strict=True)):
        if probed:
            outcome = outcomes[index]
            assert isinstance(outcome, tuple)
            summaries[shape.key], found = outcome
        else:
            found = family(shape, {}, run.traffic.span_s, search)
        probed_shape = shape if stall is None else replace(shape, stall_tpot_ms=float(stall))  # type: ignore[arg-type]
        candidates += [replace(c, structure=probed_shape) for c in found]
    return candidates, summaries


def standing_usd(plan: Plan, deployment: Deployment, span_s: float) -> float:
    """What ``plan`` costs standing over ``span_s``, whatever its traffic: the backbone instance,
    provisioned GB-s and the pings that keep environments warm; a lower bound on its simulated
    bill (which adds every invoke, and runs past the span while requests finish)."""
    model, size = deployment.model, deployment.expert_size()
    gpu = deployment.hardware(serverful=False).hourly_usd / 3600 * span_s
    lambda_usd = 0.0
    for f in plan.functions:
        lambda_usd += model.provisioned_usd_per_s(f.memory_mb, f.provisioned_concurrency) * span_s
        if f.keep_warm:  # each round pings the provisioned and the kept environments (the simulator's bill)
            ping_ms = model.expert_ms(
                1, size.hidden, size.intermediate, model.vcpus(f.memory_mb), size.weight_bytes
            )
            one = ping_cost_usd(span_s, f.memory_mb, KEEP_WARM_PING_S, ping_ms, model.prices)
            lambda_usd += (f.keep_warm + f.provisioned_concurrency) * one
    return gpu + lambda_usd


class _Bounds:
    """The costs a candidate's lower bound is held to: no candidate above them can be chosen."""

    def __init__(self, slo: Slo, search: SearchSpace) -> None:
        self.slo, self.search = slo, search
        self.factor = 1 + (search.premium or 0.0)
        self.cheapest: dict[tuple[object, ...], float] = {}  # per structure: its cheapest that meets

    def within_bound(self, structure: Structure) -> bool:
        stall = structure.stall_tpot_ms
        return not self.search.stall_bound or stall is None or stall <= self.slo.tpot_ms

    def seen(self, point: FrontierPoint) -> None:
        if self.slo.met(point.summary):
            key = point.structure.key
            self.cheapest[key] = min(self.cheapest.get(key, math.inf), point.usd_per_1k)

    def _limit(self, structures: list[tuple[object, ...]]) -> float:
        return self.factor * min(
            (self.cheapest[k] for k in structures if k in self.cheapest), default=math.inf
        )

    def needed(
        self, candidate: Candidate, bound_per_1k: float, within: dict[tuple[object, ...], bool]
    ) -> bool:
        """Whether ``candidate`` could still be chosen, or change what is (docs/planner.md,
        "Judged in order of a bound")."""
        key = candidate.structure.key
        # the most the choice can cost: (1 + premium) x the cheapest point that meets the SLO of any
        # structure it may pick from (under the stall bound, those within it; the choice without
        # the bound, which the plan also reports, may pick from all)
        limit = self._limit(list(within))
        if within[key]:
            limit = max(limit, self._limit([k for k, ok in within.items() if ok]))
        insurance = candidate.every_level and self.search.premium is not None
        if insurance and key in self.cheapest:  # it matters only if it qualifies as its structure's pick
            return bound_per_1k <= self.factor * self.cheapest[key]
        return bound_per_1k <= limit


def _judge(
    candidates: list[Candidate],
    probes: dict[tuple[object, ...], dict[str, Any]],
    run: Runner,
    slo: Slo,
    search: SearchSpace,
    progress: bool,
) -> tuple[list[FrontierPoint], int, int]:
    """Simulate the candidates that may be chosen (every one, with ``search.exhaustive``) in order
    of their lower bound, plans that come out the same once; a candidate with nothing warm is its
    structure's probe. Returns the points judged, and how many distinct plans were simulated and
    skipped."""
    by_key: dict[tuple[Any, ...], list[Candidate]] = {}
    for candidate in candidates:
        by_key.setdefault(candidate.key(), []).append(candidate)
    summaries: dict[tuple[Any, ...], dict[str, Any]] = {}
    for key, same in by_key.items():
        if not same[0].warm and same[0].structure.key in probes:
            summaries[key] = probes[same[0].structure.key]
    bounds = _Bounds(slo, search)
    # a point's run stops once it certainly misses the SLO (for the frontier every one runs to its end)
    give_up = None if search.exhaustive else GiveUp(slo.tpot_ms, slo.ttft_ms)
    within = {c.structure.key: bounds.within_bound(c.structure) for c in candidates}
    points: list[FrontierPoint] = []

    def judged(key: tuple[Any, ...]) -> None:
        for candidate in by_key[key]:
            point = candidate.judged(summaries[key])
            points.append(point)
            bounds.seen(point)

    for key in list(summaries):
        judged(key)
    requests = max(len(run.traffic.replay), 1)
    waiting = sorted(
        (
            (1000 * standing_usd(same[0].plan, same[0].structure.variant, run.traffic.span_s) / requests, key)
            for key, same in by_key.items()
            if key not in summaries
        ),
        key=lambda bound_and_key: bound_and_key[0],
    )
    bar = tqdm(total=len(waiting), desc=f"sizing {run.traffic.policy}", unit="plan", disable=not progress)
    skipped, simulated = 0, 0

    def next_job() -> tuple[Any, Job] | None:
        """The next candidate that may still be chosen, given every outcome so far."""
        nonlocal skipped, simulated
        while waiting:
            bound, key = waiting.pop(0)
            if search.exhaustive or any(bounds.needed(c, bound, within) for c in by_key[key]):
                simulated += 1
                return key, Job("point", by_key[key][0].structure.variant, by_key[key][0].plan, give_up)
            skipped += 1
            bar.update()
            bar.set_postfix(skipped=skipped)
        return None

    for key, outcome in run.as_done(next_job):
        assert isinstance(outcome, dict)
        summaries[key] = outcome
        judged(key)
        bar.update()
    bar.close()
    return points, simulated, skipped


def _answer(
    policy: str,
    slo: Slo,
    points: list[FrontierPoint],
    floor: float,
    search: SearchSpace,
    simulated: int,
    skipped: int,
    left_out: tuple[LeftOut, ...],
) -> Sizing:
    """The choice among the judged points, with and without the stall bound."""
    premium = search.premium
    chosen = choose(points, slo, premium, bounded=search.stall_bound)
    stalls = [p.stall_tpot_ms for p in points if p.stall_tpot_ms is not None]
    return Sizing(
        policy,
        slo,
        chosen,
        tuple(points),
        floor,
        search.stall_bound,
        min(stalls) if search.stall_bound and stalls else None,
        premium,
        unbounded=choose(points, slo, premium, bounded=False) if search.stall_bound else None,
        premium_paid=premium_paid(points, chosen, slo)
        if chosen and chosen.every_level and premium is not None
        else None,
        simulated=simulated,
        skipped=skipped,
        left_out=left_out,
    )


def _annotated(chosen: FrontierPoint, sizing: Sizing) -> Plan:
    """The chosen plan with what it was sized for and how it served, in its params and estimate."""
    summary, deployment = chosen.summary, chosen.structure.variant
    params = dict(chosen.plan.params) | {
        "warm_up": True,
        "keep_warm_ping_s": KEEP_WARM_PING_S,
        "deployment": deployment.params(),
        "sizing": {
            "slo_tpot_ms_p99": sizing.slo.tpot_ms,
            "slo_ttft_ms_p99": sizing.slo.ttft_ms,
            # JSON has no infinity: null is "every level that saw a cold start" (or, with
            # every level or a uniform level, not priced level by level)
            "usd_per_cold_start": None if math.isinf(price := chosen.usd_per_cold_start) else price,
            "every_level": chosen.every_level,
            "every_level_premium": sizing.every_level_premium,  # None: insurance not judged
            "premium_paid": sizing.premium_paid,  # x its structure's cheapest plan; None: not insured
            "uniform_level": chosen.uniform_level,  # None: sized level by level
            "memory_mb": chosen.memory_mb,
            "replica_scale": chosen.replica_scale,
            "packing": chosen.packing,
            "group": chosen.group,
            "lambda_floor_tpot_ms": sizing.floor_ms,
            "stall_bound": sizing.stall_bound,
            "stall_tpot_ms_p99": chosen.stall_tpot_ms,  # the stall probe, with or without the bound
            "judged_after_quiet": True,  # replays judge it so too (study.py)
            "planned": {
                key: summary[key]
                for key in (
                    "requests",
                    "usd_per_1k_requests",
                    "tpot_ms_p99",
                    "ttft_ms_p99",
                    "cold_starts",
                    "invokes",
                    "tokens_per_forward",
                )
            },
        },
    }
    params["sizing"]["tier"] = chosen.structure.tier
    params["sizing"]["alternatives"] = {
        tier: None if point is None else point.usd_per_1k for tier, point in cheapest_by_tier(sizing).items()
    }
    backbone = deployment.backbone
    estimate = PlanEstimate(
        cost_per_1k_requests=float(summary["usd_per_1k_requests"]),
        makespan_ms=float(summary["moe_layer_ms_p50"] or 0.0),
        functions=len(chosen.plan.functions),
        provisioned_concurrency=chosen.provisioned,
        priced_as="simulated on the planning traffic: Lambda + backbone instances",
        sources=deployment.sources(),
    )
    return replace(
        chosen.plan,
        params=params,
        estimate=estimate,
        backbone=Backbone(backbone.instance.name, backbone.count),
    )
