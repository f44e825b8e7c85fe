"""What ``plan`` says of a sizing beside the plan: how the chosen warmth was decided, what the
stall probe says of the chosen structure, the drafts per forward chosen, and what the account's
quotas left out."""

from __future__ import annotations

from moeless.planning.quotas import MEMORY_QUOTA
from moeless.sizing.choice import Sizing, choose
from moeless.sizing.family import FrontierPoint


def warmth(chosen: FrontierPoint, paid: float | None, premium: float | None) -> str:
    """How the chosen point's warmth was decided, as ``plan`` states it (``paid``: what keeping
    every level warm cost over its structure's cheapest plan)."""
    if chosen.every_level and paid is not None:
        return (
            f"every level a step can use, for {paid:.3f}x the cheapest plan of its structure: "
            f"every_level_premium {premium:g}"
        )
    if chosen.every_level:
        return "every level a step can use"
    if chosen.uniform_level is not None:
        return f"every function warm to level {chosen.uniform_level}"
    return f"cold start priced at ${chosen.usd_per_cold_start:g}"


def stall_lines(sizing: Sizing) -> list[str]:
    """What the stall probe says of the chosen structure: under the bound, what the planning
    traffic alone would have taken instead; without it, a warning where it is over the SLO."""
    chosen = sizing.chosen
    if chosen is None or chosen.stall_tpot_ms is None:
        return []
    stall_ms = chosen.stall_tpot_ms
    line = f"p99 TPOT {stall_ms:.1f} ms decoding beside a prefill, every environment warm"
    if sizing.stall_bound:
        alone = sizing.unbounded
        if alone is None or alone.plan is chosen.plan or alone.structure.key == chosen.structure.key:
            return [f"  stall bound: {line} (the planning traffic alone asks for the same structure)"]
        return [
            f"  stall bound: {line}",
            f'  without it ("stall_bound": false in --search): replicas x{alone.replica_scale}, '
            f"{alone.memory_mb} MB, {alone.packing} layers' experts per function, ${alone.usd_per_1k:.2f} "
            f"per 1k requests on this traffic, decoding at {alone.stall_tpot_ms:.1f} ms beside a prefill; "
            f"the bound costs {chosen.usd_per_1k / alone.usd_per_1k:.2f}x here",
        ]
    if stall_ms <= sizing.slo.tpot_ms:
        return [f"  stall probe: {line}, within the SLO"]
    return [
        f"  warning: stall probe {line}, over the SLO: traffic whose prompts overlap decoding more "
        "than this traffic's will miss it whatever is kept warm; the stall bound (the default; "
        '"stall_bound": true) sizes replicas for it'
    ]


def left_out_lines(sizing: Sizing) -> list[str]:
    """How many candidates the account's quotas left out, one line per quota (a candidate short
    of both counts in both), with the least increase that admits one."""
    lines = []
    for quota in dict.fromkeys(s.quota for needs in sizing.left_out for s in needs):
        short = [s for needs in sizing.left_out for s in needs if s.quota == quota]
        one, have = len(short) == 1, short[0].have
        needs_more = (
            f"{'its' if one else 'their'} functions need more than the account's {have:,} MB"
            if quota == MEMORY_QUOTA
            else f"{'it needs' if one else 'they need'} more than the account's {have:,} concurrent "
            "executions"
        )
        least = min(s.more for s in short)
        lines.append(
            f"  {len(short)} candidate{'' if one else 's'} left out: {needs_more} (the least by {least:,})"
        )
    return lines


def cheapest_by_tier(sizing: Sizing) -> dict[str, FrontierPoint | None]:
    """Each tier judged (``lambda``, ``host N%``, ``hybrid``, ``fleet``): what the optimiser would
    choose were it that tier alone (its cheapest point that meets the SLO on the planning traffic,
    within the stall bound where the sizing has it; ``None``: none of its points does)."""
    by_tier: dict[str, list[FrontierPoint]] = {}
    for point in sizing.points:
        by_tier.setdefault(point.structure.tier, []).append(point)
    return {
        tier: choose(points, sizing.slo, sizing.every_level_premium, bounded=sizing.stall_bound)
        for tier, points in by_tier.items()
    }


def alternative_lines(sizing: Sizing) -> list[str]:
    """What the chosen plan is against what a user would otherwise run: the fleet that holds the
    model, the hybrid node, and moeless with every expert on Lambda, each at its cheapest that
    meets the SLO on the same traffic (or missing it), and the cost ratio to the cheapest."""
    chosen = sizing.chosen
    if chosen is None:
        return []
    by_tier = cheapest_by_tier(sizing)
    names = {"fleet": "GPU fleet", "hybrid": "hybrid node", "lambda": "all experts on Lambda"}
    parts, costs = [], []
    for tier, name in names.items():
        if tier not in by_tier:
            continue
        point = by_tier[tier]
        if point is None:
            parts.append(f"{name}: misses the SLO")
            continue
        costs.append(point.usd_per_1k)
        parts.append(f"{name} ({point.structure.variant.backbone.label()}): ${point.usd_per_1k:.2f}")
    if not parts:
        return []
    lines = [f"  alternatives, per 1k requests on this traffic: {'; '.join(parts)}"]
    if costs:
        ratio = chosen.usd_per_1k / min(costs)
        lines.append(f"  the plan ({chosen.structure.tier}) costs {ratio:.2f}x the cheapest of them")
    else:
        lines.append("  none of them meets the SLO on this traffic")
    return lines


def tier_line(chosen: FrontierPoint) -> str:
    """Where the chosen plan puts the experts, and on what backbones."""
    from collections import Counter

    plan, structure = chosen.plan, chosen.structure
    tiers = Counter(str(p.placement) for p in plan.experts)
    offloading = sum(p.offload_rows is not None for p in plan.experts)
    parts = [f"{tiers[t]} {t}" for t in ("gpu", "host", "function") if tiers[t]]
    if offloading:
        parts.append(f"{offloading} host experts also functions from {structure.offload_rows} rows a layer")
    backbone = structure.variant.backbone
    return (
        f"tier {structure.tier}: experts {', '.join(parts)}; backbone {backbone.label()} "
        f"(${backbone.hourly_usd:.2f}/h)"
    )


def speculation_lines(sizing: Sizing) -> list[str]:
    """The drafts per forward chosen, where the deployment has a drafter, and the cheapest plan
    of each k judged (as :func:`cheapest_by_tier`, per k)."""
    chosen = sizing.chosen
    acceptance = None if chosen is None else chosen.structure.variant.draft_acceptance
    if chosen is None or acceptance is None:
        return []
    by_k: dict[int, list[FrontierPoint]] = {}
    for point in sizing.points:
        by_k.setdefault(point.speculate, []).append(point)
    parts = []
    for k, points in sorted(by_k.items()):
        pick = choose(points, sizing.slo, sizing.every_level_premium, bounded=sizing.stall_bound)
        parts.append(f"k={k}: " + ("misses the SLO" if pick is None else f"${pick.usd_per_1k:.2f}"))
    variant = chosen.structure.variant
    return [
        f"  speculation: k={variant.speculate} drafts per forward, {variant.tokens_per_forward:.2f} "
        f"tokens per forward ({acceptance.describe()})",
        f"  cheapest per 1k requests by drafts per forward: {'; '.join(parts)}",
    ]
