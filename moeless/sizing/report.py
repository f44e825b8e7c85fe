"""What ``plan`` says of a sizing beside the plan: how the chosen warmth was decided, and what the
stall probe says of the chosen structure."""

from __future__ import annotations

from moeless.sizing.choice import Sizing
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
