"""The choice among simulated plans, and the answer the optimiser gives.

Each structure's pick is its cheapest point that meets the SLO, or, with a premium, its
every-level point where that meets it for at most ``1 + premium`` times as much; the cheapest pick
wins (docs/planner.md, steps 4 and 9). Under the stall bound only structures whose stall probe is
within the TPOT bound are picked; the choice without it is kept too, to say what the bound costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from moeless.errors import SimulationError
from moeless.simulation.report import ms
from moeless.sizing.family import FrontierPoint
from moeless.sizing.fitting import LeftOut, least_needed
from moeless.sizing.slo import Slo


@dataclass(frozen=True)
class Sizing:
    """The optimiser's answer: the chosen point (``None``: unreachable) and every point simulated.

    ``best_stall_tpot_ms`` is the lowest stall probe of any structure; ``unbounded`` the choice
    the planning traffic alone asks for (without the stall bound; ``None``: none meets it);
    ``premium_paid`` what the chosen every-level plan costs over its structure's cheapest (``None``:
    not insured)."""

    policy: str
    slo: Slo
    chosen: FrontierPoint | None
    points: tuple[FrontierPoint, ...]
    floor_ms: float  # the Lambda floor of TPOT: layers x (invoke overhead + slowest piece)
    stall_bound: bool
    best_stall_tpot_ms: float | None
    every_level_premium: float | None
    unbounded: FrontierPoint | None = None
    premium_paid: float | None = None
    simulated: int = 0  # distinct warm plans simulated (beside the probes)
    skipped: int = 0  # distinct plans not simulated: their lower bound proved they could not be chosen
    left_out: tuple[LeftOut, ...] = ()  # distinct plans the account's quotas cannot hold, not judged

    def best_latency(self) -> FrontierPoint:
        """The point with the lowest p99 TPOT (what an unreachable SLO can have instead), among
        those that completed the most requests: an overloaded plan that finished none has no
        latency to speak of, not the best one. Runs that stopped once they missed the SLO come
        last (their figures cover only what they served until then)."""
        return min(self.points, key=lambda p: (bool(p.summary.get("gave_up")), *fastest_completing(p)))


def fastest_completing(point: FrontierPoint) -> tuple[int, float, float]:
    """Sort key: most requests completed first, then lowest p99 TPOT (none measured: last), then
    cheapest."""
    tpot = point.summary["tpot_ms_p99"]
    return (-int(point.summary["completed"]), math.inf if tpot is None else tpot, point.usd_per_1k)


def cheapest(point: FrontierPoint) -> tuple[float, float]:
    """Sort key: cheapest first, then the lower price of a cold start (fewer environments kept)."""
    return (point.usd_per_1k, point.usd_per_cold_start)


def meeting(points: list[FrontierPoint], slo: Slo, bounded: bool = True) -> list[FrontierPoint]:
    """The points that meet ``slo`` on the planning traffic, and (``bounded``) whose structure's
    stall probe is within its TPOT bound."""
    return [
        p
        for p in points
        if slo.met(p.summary) and (not bounded or p.stall_tpot_ms is None or p.stall_tpot_ms <= slo.tpot_ms)
    ]


def choose(
    points: list[FrontierPoint], slo: Slo, premium: float | None = None, bounded: bool = True
) -> FrontierPoint | None:
    """The optimiser's choice among ``points`` for ``slo``: each structure's pick, then the
    cheapest pick. ``bounded=False`` ignores the stall bound. ``None``: no point meets it."""
    by_structure: dict[tuple[object, ...], list[FrontierPoint]] = {}
    for point in points:
        by_structure.setdefault(point.structure.key, []).append(point)
    picks = [p for group in by_structure.values() if (p := structure_pick(group, slo, premium, bounded))]
    return min(picks, key=cheapest) if picks else None


def structure_pick(
    points: list[FrontierPoint], slo: Slo, premium: float | None, bounded: bool = True
) -> FrontierPoint | None:
    """One structure's plan for ``slo``: its cheapest point that meets it, or, with a ``premium``,
    its every-level point where that meets it for at most ``1 + premium`` times as much. ``None``:
    no point of the structure meets it."""
    feasible = meeting(points, slo, bounded)
    if not feasible:
        return None
    least = min(feasible, key=cheapest)
    if premium is None or least.every_level:
        return least
    insured = [p for p in feasible if p.every_level and p.usd_per_1k <= (1 + premium) * least.usd_per_1k]
    return min(insured, key=cheapest) if insured else least


def premium_paid(sizing_points: list[FrontierPoint], chosen: FrontierPoint, slo: Slo) -> float:
    """What the chosen every-level plan costs over its structure's cheapest plan that meets ``slo``."""
    same = [p for p in sizing_points if p.structure.key == chosen.structure.key]
    return chosen.usd_per_1k / min(meeting(same, slo), key=cheapest).usd_per_1k


class SloUnreachable(SimulationError):
    """No plan meets the SLO; carries the sizing with its best reachable latency."""

    def __init__(self, sizing: Sizing) -> None:
        super().__init__(why_unreachable(sizing))
        self.sizing = sizing


def why_unreachable(sizing: Sizing) -> str:
    """The refusal: the best latency reached, or, where only the stall bound stands in the way,
    why and what the planning traffic alone would take; and what the account's quotas left out."""
    why = _why_missed(sizing)
    if sizing.left_out:
        least = "; ".join(str(s) for s in least_needed(sizing.left_out))
        why += (
            f". {len(sizing.left_out)} candidates the account cannot hold were not judged; the one "
            f"that needs least: {least}"
        )
    return why


def _why_missed(sizing: Sizing) -> str:
    """Why no plan judged meets the SLO."""
    slo, stall_ms = sizing.slo, sizing.best_stall_tpot_ms
    chunked = any(p.prefill_chunk for p in sizing.points)
    shorter = (
        "a smaller prefill chunk or more replicas shorten that step"
        if chunked
        else "whole prompts: a prefill chunk (--prefill-chunk) bounds that step, more replicas shorten it"
    )
    beyond = (
        f"no replicas, packing or memory tried decode faster than {stall_ms:.1f} ms per token beside a "
        f"prefill ({shorter})"
        if sizing.stall_bound and stall_ms is not None and stall_ms > slo.tpot_ms
        else ""
    )
    if (alone := sizing.unbounded) is not None:
        return (
            f"{sizing.policy} cannot meet {slo.describe()} within the stall bound: "
            + (beyond or "the replicas, packing and memory within it miss it on this traffic")
            + f". Sized on this traffic's own overlaps of prefill and decoding (no stall bound: "
            f'"stall_bound": false in --search) it is met here by replicas x{alone.replica_scale}, '
            f"{alone.memory_mb} MB, ${alone.usd_per_1k:.2f} per 1k requests, which decode at "
            f"{alone.stall_tpot_ms:.1f} ms per token beside a prefill"
        )
    best = sizing.best_latency().summary
    if best.get("gave_up"):
        return (
            f"{sizing.policy} cannot meet {slo.describe()} on this traffic at any provisioned "
            f"concurrency: in every plan tried, more requests than a p99 tolerates missed it (each "
            f"run stopped there; the Lambda floor of TPOT is {sizing.floor_ms:.1f} ms; --frontier "
            "runs every plan to its end and shows what each reaches)"
            + (f"; under the stall bound {beyond}" if beyond else "")
        )
    return (
        f"{sizing.policy} cannot meet {slo.describe()} on this traffic at any provisioned "
        f"concurrency: the best reached is p99 TPOT {ms(best['tpot_ms_p99'])} ms, p99 TTFT "
        f"{ms(best['ttft_ms_p99'])} ms ({best['completed']}/{best['requests']} requests completed; "
        f"the Lambda floor of TPOT is {sizing.floor_ms:.1f} ms)"
        + (f"; under the stall bound {beyond}" if beyond else "")
    )
