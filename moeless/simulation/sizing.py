"""The replica optimiser: provisioned concurrency per function for a latency SLO, at the lowest cost.

``moeless plan --slo-tpot-ms T [--slo-ttft-ms U] --arrivals CSV --rate R`` runs :func:`size_for_slo`:

1. **Placement and replicas** come from the policy's planner (moeless: load-aware replicas, one
   function per expert whose replicas are concurrent environments of it; remoe: its optimiser's
   residents and functions), with nothing provisioned.
2. **A probe**: the simulator replays the planning traffic through that plan **after a quiet**
   longer than the idle timeout (nothing warm but what the plan keeps warm: no warm-up pass), and
   records what each function saw by concurrency level
   (:class:`~moeless.planning.concurrency.LevelDemand`): invokes, busy seconds, cold starts.
   Every plan below is judged from the same start. The deployment's warm-up pass runs once per
   deployment, and traffic has lulls: judged from the pass, a trace whose requests come in a
   clump showed every function warm and its plan kept nothing warm, so the next clump after an
   idle hour, or a held-out trace with a 20-minute gap, met cold functions at every layer. From
   a quiet, each level's first use is a cold start the plan must pay for or keep warm, so the
   SLO holds for a burst whenever it comes.
3. **A family of plans**, one per price of a cold start ``lambda`` on a fixed grid
   (:data:`PRICE_GRID`, $ per cold start): each function gets the provisioned concurrency, and
   with ``keep_warm`` the pinged on-demand environments, that pay at that price
   (:func:`~moeless.planning.concurrency.provisioned_for`). The family runs from
   ``lambda = 0`` (only what saves money outright) to ``lambda = inf`` (every level that saw a cold
   start), and each function's count only grows with ``lambda``.
4. **The simulator judges** each plan on the same traffic: p99 TPOT, p99 TTFT, every request
   completed. Every point of the grid is judged (plans that come out the same are simulated once:
   on a whole model a few distinct plans), and the cheapest that meets the SLO is chosen. Not a
   bisection: the cost is not monotone in ``lambda`` (warm environments save the init that a cold
   start bills), and judging every point makes the choice monotone in the SLO (a tighter one is
   met by a subset of the points, so it never costs less). The points are the cost-latency
   frontier. When none meets the SLO, :class:`SloUnreachable` says so with the best latency reached.
5. **Packing, memory and replicas** are decisions too: each packing of ``packings`` (experts of
   consecutive layers per function, default 1 and 4: :mod:`moeless.planning.packing`), each
   grouping of ``groups`` (co-activated experts of one layer per function, each step's rows for
   them in one bundled invoke; default only 1, as each group size is another family), each size
   in ``memory_options`` (default: the smallest that holds the function's experts, and one vCPU
   more) and each factor of ``replica_scales`` on the planner's replicas (default 1 and 4: more
   replicas split a prefill over more concurrent environments, shortening the step that stalls
   every decoding sequence, for more invokes and more environments to keep warm) runs steps 2-4;
   the cheapest feasible wins. The experts' dtype is searched only over ``expert_dtypes`` (default:
   the deployment's): fp16 and int8 change the outputs, so trading accuracy for cost is the
   user's call, never the optimiser's own. The engine's prefill chunk is searched over
   ``prefill_chunks`` (default: the deployment's): a smaller chunk bounds the stall a long prompt
   puts on every decoding sequence (lower p99 TPOT) but re-pays each layer's invokes and expert
   weights once per chunk, which lowers the backbone's prefill throughput (higher TTFT, more
   invokes): a trade only the traffic's prompt lengths and the SLO settle.
6. **The stall bound** (``stall_bound``; ``plan``'s default, ``--no-stall-bound`` drops it): the
   planning traffic shows only the overlaps of prefill and decoding that it happens to have.
   Conversations at 0.02 requests/s (2 requests 20 minutes apart) never overlap, so x1 replicas
   meet a tight TPOT bound there and miss it on code traffic, whose short outputs all decode beside
   other prompts' chunks. With the bound, each candidate's structure (replicas, packing, memory,
   chunk) must also keep the **stall probe** within the TPOT bound: a full batch decoding while a
   prompt prefills, every environment warm (:func:`stall_tpot_ms`), so each of their tokens shares
   its step with a full chunk (chunked: the most prompt a step may carry, whatever the traffic) or
   with a whole prompt as long as the deployment admits. Warmth cannot repair that step, so no plan
   of a structure over the bound is chosen; they are still simulated, so the sizing says what the
   planning traffic alone would take (``Sizing.unbounded``) and what the bound costs. The bound is
   the trace-free half of the SLO: it holds for any mix of output lengths and any overlap of
   prompts with decoding; the simulator's half prices the warmth. Why by default: where serverless
   pays (DeepSeek-V3 at 0.02 requests/s and up, steps of about 1.5 s), a request decodes long
   enough for another's prompt to arrive meanwhile (a 28-token answer for 28 steps, about 42 s, in
   which an arrival at 0.02/s is 57% likely; a 250-token one for six minutes), so a p99 over
   requests meets the overlap, which a window of a trace may not show (the two conversations
   above). With whole prompts the probe's prompt is context-long, beside which a deep model decodes
   slowly whatever its structure (DeepSeek-V3: 17x the floor at best), so a tight SLO is refused,
   saying what the traffic alone would take; chunked prefill is what bounds that stall.
7. **Every level in reach** (``every_level``, ``plan --warm-every-level``): step 3 keeps warm
   the levels the planning traffic used, so other traffic meets the rest cold. With this, each
   structure gets one plan, every level a step can reach kept warm
   (:func:`~moeless.planning.concurrency.levels_in_reach`): provisioned, or with pings allowed
   pinged above the levels provisioning pays for outright. No cold start on the request path
   whatever the traffic, at a price known in advance.
8. **Uniform levels** (``uniform_levels``, ``plan --uniform-levels``): step 3's rule keeps a
   level where its cold starts pay for it, so where every level's first use is its only cold
   start (two requests twenty minutes apart) it cannot tell level 1 from level 4 and keeps all
   or none. With this, each structure's family also holds the brute force's plans: every
   function warm to one level, 0 up to ``MAX_UNIFORM_LEVEL`` (each capped at the function's
   levels in reach; warm as in step 7), one simulation each. On its planning traffic the chosen
   plan then never costs more than a uniform level of its structure that meets the SLO.
9. **Every level's insurance** (``every_level_premium``, ``plan --every-level-premium P``, whose
   default is 0.1): step 3 is cheapest on the planning traffic, and traffic it has not seen
   meets the levels it left cold on the request path. With a premium, each structure's family
   also holds step 7's plan, and where that plan meets the SLO for at most ``1 + P`` times the
   structure's cheapest plan that meets it, it is that structure's pick; across structures the
   cheapest pick wins. The default, 10%, is the tolerance the optimiser is held to against a
   brute force: a plan that costs that much more on its own traffic is still a plan worth having,
   and it leaves no cold start on any traffic's path. Per structure, not against the cheapest
   plan of all: a tighter SLO leaves each structure fewer points that meet it, so (given that
   every level warm is its structure's fastest plan) no structure's pick gets cheaper, and the
   choice stays monotone in the SLO.

Why the simulator in the loop rather than a queueing bound alone: an MoE step's invokes are not a
Poisson stream (a prefill touches every expert of every layer at once; decode touches a few per
layer in lockstep), and TPOT p99 is a per-request mean over its tokens, so how many cold starts a
latency target tolerates depends on the request mix. The rule in step 3 is the queueing part
(which level of which function pays); the simulator sets its one price.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from moeless.contracts.environment import KEEP_WARM_PING_S
from moeless.contracts.loads import Loads, shares
from moeless.contracts.payload import max_tokens_per_request
from moeless.contracts.plan import Plan, PlanEstimate
from moeless.errors import SimulationError
from moeless.planning.concurrency import (
    LONG_MEMORY_S,
    Warmth,
    levels_in_reach,
    ping_cost_usd,
    provisioned_for,
    with_concurrency,
    with_memory,
    with_replicas,
)
from moeless.planning.cost_model import EXPERT_DTYPES, MEMORY_OPTIONS_MB
from moeless.planning.packing import pack_across_layers, pack_within_layer
from moeless.simulation.policies import Deployment, plan_for_policy, simulate_policy
from moeless.simulation.routing import RecordedRouting, StepRouting
from moeless.simulation.simulator import PolicyResult, PrewarmModel, Request

DEFAULT_REPLICA_SCALES = (1, 4)
STALL_STEPS = 4  # chunked prefill: the decode steps the stall probe averages, each beside a full chunk
DEFAULT_PACKINGS = (1, 4)  # experts of consecutive layers per function
DEFAULT_GROUPS = (1,)  # experts of one layer per function (bundled invokes); more only when asked
MAX_UNIFORM_LEVEL = 4  # the highest uniform level judged with uniform_levels (x4 replicas: every level)
# `plan`'s default every_level_premium: the 10% the optimiser is held to against a brute force
DEFAULT_EVERY_LEVEL_PREMIUM = 0.1

# $ per cold start on the request path: 0, 1e-5 .. 10 in quarter decades, and infinity
PRICE_GRID: tuple[float, ...] = (0.0, *(10 ** (k / 4) for k in range(-20, 5)), math.inf)


@dataclass(frozen=True)
class Slo:
    """A latency target: p99 time per output token, and optionally p99 time to first token (ms)."""

    tpot_ms: float
    ttft_ms: float | None = None

    def met(self, summary: dict[str, Any]) -> bool:
        """Whether a run meets it: every request completed within both p99 bounds."""
        return (
            summary["completed"] == summary["requests"]
            and summary["tpot_ms_p99"] <= self.tpot_ms
            and (self.ttft_ms is None or summary["ttft_ms_p99"] <= self.ttft_ms)
        )

    def stall_met(self, stall_tpot_ms: float | None) -> bool:
        """Whether the stall probe's TPOT (``None``: not probed) is within the TPOT bound."""
        return stall_tpot_ms is None or stall_tpot_ms <= self.tpot_ms

    def describe(self) -> str:
        ttft = f", p99 TTFT <= {self.ttft_ms:g} ms" if self.ttft_ms is not None else ""
        return f"p99 TPOT <= {self.tpot_ms:g} ms{ttft}"


@dataclass
class FrontierPoint:
    """One plan of the family and how it served the planning traffic."""

    memory_mb: int
    usd_per_cold_start: float
    plan: Plan
    summary: dict[str, Any]
    replica_scale: int = 1
    packing: int = 1  # experts of consecutive layers per function
    expert_dtype: str = "fp32"
    group: int = 1  # experts of one layer per function, one bundled invoke
    prefill_chunk: int | None = None  # prompt tokens per engine step; None: whole prompts
    stall_tpot_ms: float | None = None  # the stall probe's p99 TPOT, with the stall bound (None: not probed)
    uniform_level: int | None = None  # every function warm to this level (None: sized per level)
    every_level: bool = False  # every level in reach warm (step 7)

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

    @property
    def structure(self) -> tuple[Any, ...]:
        """What the point's family shares: memory, replicas, packing, grouping, dtype and chunk."""
        return (
            self.memory_mb,
            self.replica_scale,
            self.packing,
            self.group,
            self.expert_dtype,
            self.prefill_chunk,
        )

    def row(self) -> dict[str, Any]:
        """The point as a CSV row (frontier.csv)."""
        summary = self.summary
        return {
            "policy": self.plan.policy,
            "memory_mb": self.memory_mb,
            "replica_scale": self.replica_scale,
            "packing": self.packing,
            "group": self.group,
            "expert_dtype": self.expert_dtype,
            "prefill_chunk": self.prefill_chunk or "",
            "usd_per_cold_start": self.usd_per_cold_start,
            "stall_tpot_ms_p99": "" if self.stall_tpot_ms is None else self.stall_tpot_ms,
            "uniform_level": "" if self.uniform_level is None else self.uniform_level,
            "every_level": self.every_level,
            "provisioned": self.provisioned,
            "keep_warm": self.keep_warm,
            "usd_per_1k_requests": self.usd_per_1k,
            "tpot_ms_p99": summary["tpot_ms_p99"],
            "ttft_ms_p99": summary["ttft_ms_p99"],
            "cold_start_share": summary["cold_starts"] / max(summary["invokes"], 1),
            "completed": summary["completed"],
            "requests": summary["requests"],
        }


@dataclass
class Sizing:
    """The optimiser's answer: the chosen point (``None``: unreachable) and every point it simulated."""

    policy: str
    slo: Slo
    chosen: FrontierPoint | None
    points: list[FrontierPoint] = field(default_factory=list)
    floor_ms: float = 0.0  # the Lambda floor of TPOT: layers x (invoke overhead + slowest piece)
    stall_ms: float | None = None  # with the stall bound: the lowest stall probe TPOT of any structure
    every_level: bool = False  # each structure kept warm at every level in reach, not priced per level
    every_level_premium: float | None = None  # step 9's premium (None: not judged)
    premium_paid: float | None = None  # the chosen every-level plan's cost / its structure's cheapest
    chosen_stall_ms: float | None = None  # the stall probe of the chosen structure, bound or not
    # with the stall bound: the choice the planning traffic alone asks for (None: none meets it)
    unbounded: FrontierPoint | None = None

    def best_latency(self) -> FrontierPoint:
        """The point with the lowest p99 TPOT (what an unreachable SLO can have instead), among
        those that completed the most requests: an overloaded plan that finished none has no
        latency to speak of, not the best one."""
        return min(self.points, key=fastest_completing)


def fastest_completing(point: FrontierPoint) -> tuple[int, float, float]:
    """Sort key: most requests completed first, then lowest p99 TPOT, then cheapest."""
    return (-int(point.summary["completed"]), point.summary["tpot_ms_p99"], point.usd_per_1k)


class SloUnreachable(SimulationError):
    """No plan of the family meets the SLO; carries the sizing with its best reachable latency."""

    def __init__(self, sizing: Sizing) -> None:
        super().__init__(_why_unreachable(sizing))
        self.sizing = sizing


def _why_unreachable(sizing: Sizing) -> str:
    """The refusal: the best latency reached, or, where only the stall bound stands in the way,
    why and what the planning traffic alone would take."""
    slo, stall_ms = sizing.slo, sizing.stall_ms
    chunked = any(p.prefill_chunk for p in sizing.points)
    shorter = (
        "a smaller prefill chunk or more replicas shorten that step"
        if chunked
        else "whole prompts: a prefill chunk (--prefill-chunk) bounds that step, more replicas shorten it"
    )
    beyond = (
        f"no replicas, packing or memory tried decode faster than {stall_ms:.1f} ms per token beside a "
        f"prefill ({shorter})"
        if stall_ms is not None and stall_ms > slo.tpot_ms
        else ""
    )
    if (alone := sizing.unbounded) is not None:
        return (
            f"{sizing.policy} cannot meet {slo.describe()} within the stall bound: "
            + (beyond or "the replicas, packing and memory within it miss it on this traffic")
            + f". Sized on this traffic's own overlaps of prefill and decoding (--no-stall-bound) it is "
            f"met here by replicas x{alone.replica_scale}, {alone.memory_mb} MB, "
            f"${alone.usd_per_1k:.2f} per 1k requests, which decode at {alone.stall_tpot_ms:.1f} ms per "
            "token beside a prefill"
        )
    best = sizing.best_latency().summary
    return (
        f"{sizing.policy} cannot meet {slo.describe()} on this traffic at any provisioned "
        f"concurrency: the best reached is p99 TPOT {best['tpot_ms_p99']:.1f} ms, p99 TTFT "
        f"{best['ttft_ms_p99']:.1f} ms ({best['completed']}/{best['requests']} requests completed; "
        f"the Lambda floor of TPOT is {sizing.floor_ms:.1f} ms)"
        + (f"; under the stall bound {beyond}" if beyond else "")
    )


def lambda_floor_ms(deployment: Deployment, memory_mb: int) -> float:
    """TPOT's floor on Lambda: every MoE layer pays one warm invoke of one token and its expert."""
    model, size = deployment.model, deployment.expert_size()
    speedup = EXPERT_DTYPES[deployment.expert_dtype].compute_speedup
    expert = model.expert_ms(1, size.hidden, size.intermediate, model.vcpus(memory_mb), size.weight_bytes)
    return len(deployment.shape.moe_layers) * (model.invoke_ms(1, size.hidden) + expert / speedup)


def stall_probe(deployment: Deployment) -> list[Request]:
    """The worst routine step for decoding, as requests: a full batch decoding beside a prefill.

    ``max_batch - 1`` sequences with one-token prompts arrive at 0 (step 1 prefills them); one
    prompt arrives just after, so it joins from step 2, while they decode. Chunked: the prompt is
    :data:`STALL_STEPS` chunks, so each of their next STALL_STEPS tokens shares its step with a full
    chunk, the most prompt a step may carry whatever the traffic. Whole prompts: it is as long as
    the deployment admits (``context_tokens``), in one step, and they decode one token past it.
    """
    chunk = deployment.prefill_chunk
    steps = STALL_STEPS if chunk else 1
    prompt = chunk * steps if chunk else deployment.context_tokens
    decoders = [Request(0.0, 1, steps + 1, n) for n in range(max(deployment.max_batch - 1, 1))]
    return [*decoders, Request(1e-3, prompt, 1, len(decoders))]


def stall_tpot_ms(plan: Plan, deployment: Deployment, routing: StepRouting) -> float:
    """The decoding sequences' p99 TPOT in the :func:`stall_probe`, every environment warm.

    What the plan's structure (replicas, packing, memory) and the engine's chunk allow, warmth
    aside: the oracle policy (every replica it needs warm and free) on one backbone instance, one
    step loop, so the prompt joins the decoding batch.
    """
    one_loop = replace(deployment, backbone=replace(deployment.backbone, count=1))
    probe = stall_probe(deployment)
    result = simulate_policy("oracle", one_loop, routing, probe, 0.0, plan=plan, timeline=False)
    return float(np.percentile(result.tpot_ms, 99))


def _ping_usd(deployment: Deployment, memory_mb: int, span_s: float) -> float:
    """What keeping one environment of ``memory_mb`` alive by pings costs over the span."""
    model, size = deployment.model, deployment.expert_size()
    speedup = EXPERT_DTYPES[deployment.expert_dtype].compute_speedup
    ping_ms = (
        model.expert_ms(1, size.hidden, size.intermediate, model.vcpus(memory_mb), size.weight_bytes)
        / speedup
    )
    return ping_cost_usd(span_s, memory_mb, KEEP_WARM_PING_S, ping_ms, model.prices)


def memory_for_experts(deployment: Deployment, experts: int) -> int:
    """The smallest Lambda memory size that holds ``experts`` of the deployment's experts."""
    return deployment.model.function_memory_mb(deployment.expert_size().weight_bytes * experts)


def pair_scores(routing: StepRouting, loads: Loads) -> Callable[[int, int], np.ndarray]:
    """Co-activation of two layers' experts, ``[E, E]``: tokens that chose e at the first and e'
    at the second (a recorded routing's decode tokens), else the product of their shares in
    ``loads`` (the routing's)."""
    index = {layer: i for i, layer in enumerate(routing.layers)}
    if isinstance(routing, RecordedRouting):
        rows = [r for r in routing.decode_rows if len(r)]
        chosen = routing.chosen

        @functools.cache  # the same layer pairs come back for every dtype allowed
        def recorded(a: int, b: int) -> np.ndarray:
            counts = np.zeros((routing.num_experts, routing.num_experts))
            for r in rows:
                first, second = r[:, chosen[index[a]]], r[:, chosen[index[b]]]
                for i in range(first.shape[1]):
                    for j in range(second.shape[1]):
                        np.add.at(counts, (first[:, i], second[:, j]), 1.0)
            return counts

        return recorded

    def sampled(a: int, b: int) -> np.ndarray:
        return np.outer(shares(loads.layers[a]), shares(loads.layers[b]))

    return sampled


def layer_coactivation(routing: StepRouting, loads: Loads) -> Callable[[int], np.ndarray]:
    """Co-activation of one layer's experts, ``[E, E]``: tokens that chose both (a recorded
    routing's decode tokens), else the product of their shares in ``loads``."""
    index = {layer: i for i, layer in enumerate(routing.layers)}
    if isinstance(routing, RecordedRouting):
        rows = [r for r in routing.decode_rows if len(r)]
        chosen = routing.chosen

        @functools.cache
        def recorded(layer: int) -> np.ndarray:
            counts = np.zeros((routing.num_experts, routing.num_experts))
            for r in rows:
                picked = r[:, chosen[index[layer]]]
                for i, j in itertools.permutations(range(picked.shape[1]), 2):
                    np.add.at(counts, (picked[:, i], picked[:, j]), 1.0)
            return counts

        return recorded

    def sampled(layer: int) -> np.ndarray:
        share = shares(loads.layers[layer])
        return np.outer(share, share)

    return sampled


def default_memory_options(deployment: Deployment) -> list[int]:
    """The smallest full-vCPU size that holds one expert, and the next one up."""
    smallest = deployment.model.function_memory_mb(deployment.expert_size().weight_bytes)
    index = MEMORY_OPTIONS_MB.index(smallest)
    return list(MEMORY_OPTIONS_MB[index : index + 2])


def size_for_slo(
    policy: str,
    deployment: Deployment,
    routing: StepRouting,
    replay: list[Request],
    duration_s: float,
    slo: Slo,
    *,
    memory_options: list[int] | None = None,
    replica_scales: list[int] | None = None,
    packings: list[int] | None = None,
    groups: list[int] | None = None,
    expert_dtypes: list[str] | None = None,
    prefill_chunks: list[int | None] | None = None,
    keep_warm: bool = True,
    replan_s: float | None = None,
    stall_bound: bool = False,
    every_level: bool = False,
    uniform_levels: bool = False,
    every_level_premium: float | None = None,
    prewarm: dict[str, PrewarmModel] | None = None,
    seed: int = 0,
    progress: bool = False,
) -> Sizing:
    """The cheapest plan of ``policy`` that meets ``slo`` on ``replay`` (see the module docstring).

    Raises:
        SloUnreachable: no provisioned concurrency meets it; the error carries every point tried.
        SimulationError: the policy cannot plan this deployment.
    """
    if policy not in ("moeless", "remoe"):
        raise SimulationError(f"the replica optimiser sizes moeless or remoe plans, not {policy!r}")
    variants = {
        (dtype, chunk): replace(deployment, expert_dtype=dtype, prefill_chunk=chunk)
        for dtype in expert_dtypes or [deployment.expert_dtype]
        for chunk in dict.fromkeys(prefill_chunks or [deployment.prefill_chunk])
    }
    floors = []
    loads = routing.loads()
    scores = pair_scores(routing, loads)
    together = layer_coactivation(routing, loads)
    structures: list[_Structure] = []
    for variant in variants.values():
        memories = memory_options or default_memory_options(variant)
        floors += [lambda_floor_ms(variant, m) for m in memories]
        base = with_concurrency(plan_for_policy(policy, loads, variant), {})
        memory_for = functools.partial(memory_for_experts, variant)
        packed_by = {
            (n, 1): pack_across_layers(base, n, scores, memory_for) for n in packings or DEFAULT_PACKINGS
        } | {
            (1, g): pack_within_layer(base, g, together, lambda layer: loads.layers[layer], memory_for)
            for g in groups or DEFAULT_GROUPS
            if g > 1
        }
        shapes = itertools.product(packed_by, memories, replica_scales or DEFAULT_REPLICA_SCALES)
        seen = set()
        for (per_function, group), memory_option, scale in shapes:
            packed = packed_by[(per_function, group)]
            memory = max(memory_option, max((f.memory_mb for f in packed.functions), default=memory_option))
            if (per_function, group, memory, scale) in seen:  # a packing that needs more memory
                continue
            seen.add((per_function, group, memory, scale))
            plan = with_replicas(with_memory(packed, memory), scale)
            structures.append(_Structure(variant, plan, memory, scale, per_function, group))
    stall_ms = None
    if stall_bound:  # every structure is still simulated: what the bound costs is reported
        for structure in structures:
            structure.stall_ms = stall_tpot_ms(structure.plan, structure.variant, routing)
        stall_ms = min(s.stall_ms for s in structures if s.stall_ms is not None)
    points: list[FrontierPoint] = []
    for structure in structures:
        family = structure.family(
            duration_s, keep_warm, replan_s, policy, routing, replay, prewarm, seed, progress
        )
        if every_level:
            family.every_level(structure.reach())
        else:
            for price in PRICE_GRID:
                family.point(price)
            if uniform_levels:
                family.uniform_levels(structure.reach())
            if every_level_premium is not None:
                family.every_level(structure.reach())
        points += family.points
    sizing = Sizing(
        policy,
        slo,
        choose(points, slo, every_level_premium),
        points,
        min(floors),
        stall_ms,
        every_level,
        every_level_premium,
    )
    if stall_bound:
        sizing.unbounded = choose(points, slo, every_level_premium, bounded=False)
    if sizing.chosen is None:
        raise SloUnreachable(sizing)
    if sizing.chosen.every_level and every_level_premium is not None:
        same = [p for p in points if p.structure == sizing.chosen.structure]
        sizing.premium_paid = sizing.chosen.usd_per_1k / min(_meeting(same, slo), key=_cheapest).usd_per_1k
    chosen_variant = variants[(sizing.chosen.expert_dtype, sizing.chosen.prefill_chunk)]
    sizing.chosen_stall_ms = sizing.chosen.stall_tpot_ms
    if sizing.chosen_stall_ms is None:  # probed anyway, for what the plan says (step 6)
        sizing.chosen_stall_ms = stall_tpot_ms(sizing.chosen.plan, chosen_variant, routing)
    sizing.chosen.plan = _annotated(sizing.chosen, sizing, chosen_variant)
    return sizing


def _cheapest(point: FrontierPoint) -> tuple[float, float]:
    """Sort key: cheapest first, then the lower price of a cold start (fewer environments kept)."""
    return (point.usd_per_1k, point.usd_per_cold_start)


def _meeting(points: list[FrontierPoint], slo: Slo, bounded: bool = True) -> list[FrontierPoint]:
    """The points that meet ``slo`` on the planning traffic, and (``bounded``) its stall bound
    where probed."""
    return [p for p in points if slo.met(p.summary) and (not bounded or slo.stall_met(p.stall_tpot_ms))]


def choose(
    points: list[FrontierPoint], slo: Slo, premium: float | None = None, bounded: bool = True
) -> FrontierPoint | None:
    """The optimiser's choice among ``points`` for ``slo``: each structure's pick (its cheapest
    point that meets it, or with a ``premium`` its every-level point: the module docstring, step
    9), then the cheapest pick. ``bounded=False`` ignores the stall bound (what the traffic alone
    asks for). ``None``: no point meets it."""
    structures: dict[tuple[Any, ...], list[FrontierPoint]] = {}
    for point in points:
        structures.setdefault(point.structure, []).append(point)
    picks = [
        p for group in structures.values() if (p := _structure_pick(group, slo, premium, bounded)) is not None
    ]
    return min(picks, key=_cheapest) if picks else None


def _structure_pick(
    points: list[FrontierPoint], slo: Slo, premium: float | None, bounded: bool = True
) -> FrontierPoint | None:
    """One structure's plan for ``slo``: its cheapest point that meets it, or, with a ``premium``,
    its every-level point where that meets it for at most ``1 + premium`` times as much (the
    module docstring, step 9). ``None``: no point of the structure meets it."""
    feasible = _meeting(points, slo, bounded)
    if not feasible:
        return None
    cheapest = min(feasible, key=_cheapest)
    if premium is None or cheapest.every_level:
        return cheapest
    insured = [p for p in feasible if p.every_level and p.usd_per_1k <= (1 + premium) * cheapest.usd_per_1k]
    if not insured:
        return cheapest
    return min(insured, key=_cheapest)


def reach_of(plan: Plan, deployment: Deployment) -> dict[str, int]:
    """Each function's levels in reach (:func:`levels_in_reach`) on ``deployment``: a step carries
    at most a chunk (whole prompts: one as long as the deployment admits) beside a full decode
    batch, on each of the backbone's step loops."""
    rows = (deployment.prefill_chunk or deployment.context_tokens) + deployment.max_batch
    loops = deployment.hardware(serverful=False).loops
    return levels_in_reach(plan, rows, max_tokens_per_request(deployment.expert_size().hidden), loops)


@dataclass
class _Structure:
    """One candidate's structure: the deployment variant (dtype, chunk), and the plan's packing,
    memory and replicas, nothing provisioned yet; warmth is sized per family."""

    variant: Deployment
    plan: Plan
    memory_mb: int
    replica_scale: int
    packing: int
    group: int
    stall_ms: float | None = None  # the stall probe's p99 TPOT, with the stall bound

    def reach(self) -> dict[str, int]:
        """Each function's levels in reach on this structure's deployment (:func:`reach_of`)."""
        return reach_of(self.plan, self.variant)

    def family(
        self,
        span_s: float,
        keep_warm: bool,
        replan_s: float | None,
        policy: str,
        routing: StepRouting,
        replay: list[Request],
        prewarm: dict[str, PrewarmModel] | None,
        seed: int,
        progress: bool,
    ) -> _Family:
        """Probe the structure on the traffic (after a quiet: the module docstring, step 2)."""
        replan = None
        if replan_s:
            round_usd = _ping_usd(self.variant, self.memory_mb, KEEP_WARM_PING_S)  # one round of pings
            replan = {
                "interval_s": replan_s,
                "ping_usd_per_s": round_usd / KEEP_WARM_PING_S if keep_warm else None,
                "smoothing": 0.5,
                "down_after": 3,
                "memory_s": LONG_MEMORY_S,
                "hold_s": None,
            }

        def run(plan: Plan) -> PolicyResult:
            return simulate_policy(
                policy,
                self.variant,
                routing,
                replay,
                span_s,
                plan=plan,
                prewarm=prewarm,
                seed=seed,
                timeline=False,
                warm_up=False,  # after a quiet (the module docstring, step 2)
                progress=progress,
            )

        ping_usd = _ping_usd(self.variant, self.memory_mb, span_s) if keep_warm else None
        return _Family(self, span_s, run, ping_usd, replan)


class _Family:
    """The plans of one structure, one per price of a cold start, each simulated once."""

    def __init__(
        self,
        structure: _Structure,
        span_s: float,
        run: Callable[[Plan], PolicyResult],
        ping_usd: float | None,
        replan: dict[str, Any] | None = None,
    ) -> None:
        self.structure, self.span_s, self.run = structure, span_s, run
        self.replan = replan
        self.ping_usd = ping_usd
        self.points: list[FrontierPoint] = []
        self._summaries: dict[tuple[Any, ...], dict[str, Any]] = {}

    @functools.cached_property
    def probe(self) -> PolicyResult:
        """The structure with nothing provisioned: what each function's demand is measured on."""
        return self.run(self.structure.plan)

    def point(self, price: float) -> FrontierPoint:
        """The plan that keeps warm each level whose cold starts are worth ``price`` apiece."""
        structure = self.structure
        warmth = {
            name: provisioned_for(demand, self.span_s, structure.memory_mb, price, ping_usd=self.ping_usd)
            for name, demand in self.probe.demand.items()
        }
        return self._judged(price, with_concurrency(structure.plan, warmth))

    def every_level(self, reach: dict[str, int]) -> FrontierPoint:
        """The plan that keeps warm every level of ``reach`` (:func:`levels_in_reach`)."""
        point = self._warm_to(reach)
        point.every_level = True
        return point

    def uniform_levels(self, reach: dict[str, int]) -> list[FrontierPoint]:
        """The brute force's plans on this structure: every function warm to one level, 0 up to
        :data:`MAX_UNIFORM_LEVEL`, each capped at the function's levels in ``reach``."""
        top = min(max(reach.values(), default=0), MAX_UNIFORM_LEVEL)
        return [
            self._warm_to({name: min(level, most) for name, most in reach.items()}, uniform_level=level)
            for level in range(top + 1)
        ]

    def _warm_to(self, levels: dict[str, int], uniform_level: int | None = None) -> FrontierPoint:
        """The plan that keeps ``levels`` of each function warm: provisioned, or, with pings
        allowed, pinged above the levels that provisioning pays for outright."""
        structure = self.structure
        if self.ping_usd is None:  # provisioned only: no probe needed
            warmth = {name: Warmth(level, 0) for name, level in levels.items()}
        else:
            warmth = {}
            for name, level in levels.items():
                demand = self.probe.demand.get(name)
                kept = (
                    provisioned_for(demand, self.span_s, structure.memory_mb, 0.0, ping_usd=self.ping_usd)
                    if demand is not None
                    else Warmth()
                )
                provisioned = min(kept.provisioned, level)
                warmth[name] = Warmth(provisioned, level - provisioned)
        return self._judged(math.inf, with_concurrency(structure.plan, warmth), uniform_level)

    def _judged(self, price: float, sized: Plan, uniform_level: int | None = None) -> FrontierPoint:
        structure = self.structure
        if self.replan is not None:  # the re-planner prices cold starts as the plan was sized
            params = self.replan | {"usd_per_cold_start": None if math.isinf(price) else price}
            sized = replace(sized, params=sized.params | {"replan": params})
        counts = tuple((f.provisioned_concurrency, f.keep_warm) for f in sized.functions)
        key = (counts, price if self.replan is not None else None)
        if key not in self._summaries:  # nothing provisioned and no re-planner is the probe itself
            warm = any(p or k for p, k in counts) or self.replan is not None
            self._summaries[key] = (self.run(sized) if warm else self.probe).summary()
        found = FrontierPoint(
            structure.memory_mb,
            price,
            sized,
            self._summaries[key],
            structure.replica_scale,
            structure.packing,
            expert_dtype=structure.variant.expert_dtype,
            group=structure.group,
            prefill_chunk=structure.variant.prefill_chunk,
            stall_tpot_ms=structure.stall_ms,
            uniform_level=uniform_level,
        )
        self.points.append(found)
        return found


def _annotated(chosen: FrontierPoint, sizing: Sizing, deployment: Deployment) -> Plan:
    """The chosen plan with what it was sized for and how it served, in its params and estimate."""
    summary = chosen.summary
    params = dict(chosen.plan.params) | {
        "warm_up": True,
        "keep_warm_ping_s": KEEP_WARM_PING_S,
        "deployment": deployment.params(),
        "sizing": {
            "slo_tpot_ms_p99": sizing.slo.tpot_ms,
            "slo_ttft_ms_p99": sizing.slo.ttft_ms,
            # JSON has no infinity: null is "every level that saw a cold start" (or, with
            # every_level or a uniform level, not priced level by level)
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
            "stall_bound": sizing.stall_ms is not None,
            "stall_tpot_ms_p99": sizing.chosen_stall_ms,  # the stall probe, with or without the bound
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
                )
            },
        },
    }
    estimate = PlanEstimate(
        cost_per_1k_requests=float(summary["usd_per_1k_requests"]),
        makespan_ms=float(summary["moe_layer_ms_p50"]),
        functions=len(chosen.plan.functions),
        provisioned_concurrency=chosen.provisioned,
        priced_as="simulated on the planning traffic: Lambda + backbone GPU",
        sources=deployment.sources(),
    )
    return replace(chosen.plan, params=params, estimate=estimate)
