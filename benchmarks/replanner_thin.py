"""The forecasting re-planner at thin traffic: does it keep what a static plan keeps?

Usage:
    .venv/bin/python benchmarks/replanner_thin.py                    # about 30 minutes here
    .venv/bin/python benchmarks/replanner_thin.py --replay-window 7200   # two hours held out (~60 min)
    .venv/bin/python benchmarks/replanner_thin.py --replay-window 7200 --variants floor   # ~35 min
    .venv/bin/python benchmarks/replanner_thin.py --in-loop          # + sizing with it (~90 min more)

DeepSeek-V3 as in ``slo_plan.py`` (OLMoE's routing on 256 experts, fp32 experts, batch 16,
prefill chunks of 256 tokens). A provisioned-only plan is sized for p99 TPOT <= SLO x the Lambda
floor on the first WINDOW seconds of the Azure 2023 code trace at RATE requests/s, then replayed
on the conversation trace (held out, its first REPLAY-WINDOW seconds at the same rate), after a
quiet as the optimiser judges (nothing warm but what the plan keeps warm):

- ``static``: the plan as sized (the baseline of every ratio);
- ``+ short memory``: the same plan with a re-planner every 60 s whose forecast is the newest
  window and an exponentially weighted mean (weight 0.5), free to go below the plan at once;
- ``+ long memory, 30-minute hold``: the forecaster as shipped (a 30-minute half-life long
  memory), the plan a floor only until one long memory is watched, as shipped before;
- ``+ long memory, plan as floor``: as shipped (``ForecastReplanner``'s defaults): the plan a floor
  for good, the re-planner adding to it what the traffic asks for;
- with ``--in-loop``: a plan sized with the shipped re-planner in the optimiser's loop
  (``plan --replan-interval 60``) for the same SLO, if any meets it.

``--variants`` picks some of ``short,hold,floor`` (static, the baseline, always runs). Every
re-planner prices a cold start as the plan was sized. Needs ``../shared/data``. Writes
benchmarks/results/replanner_thin.md.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from typing import Any

from common import md_header, md_row, write_result
from slo_plan import requests_of, setting, summary_of

from moeless.planning.concurrency import LONG_MEMORY_S

CHUNK = 256


# variant -> (label, the long memory's half-life, how long the plan is a floor; None: for good)
VARIANTS = {
    "short": ("+ short memory", None, 0.0),
    "hold": ("+ long memory, 30-minute hold", LONG_MEMORY_S, LONG_MEMORY_S),
    "floor": ("+ long memory, plan as floor", LONG_MEMORY_S, None),
}


COLUMNS = ("plan", "provisioned at start", "met", "completed", "$/1k", "x static", "p99 TPOT / floor",
           "cold starts", "cold / invokes", "re-plans")  # fmt: skip


def with_replanner(plan: Any, usd_per_cold_start: float, memory_s: float | None, hold_s: float | None) -> Any:
    """``plan`` carrying a re-planner every 60 s, provisioned concurrency only."""
    price = None if math.isinf(usd_per_cold_start) else usd_per_cold_start
    replan = {"interval_s": 60.0, "usd_per_cold_start": price, "ping_usd_per_s": None, "smoothing": 0.5,
              "down_after": 3, "memory_s": memory_s, "hold_s": hold_s}  # fmt: skip
    return replace(plan, params=plan.params | {"replan": replan})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=0.05, help="requests/s of both traces")
    parser.add_argument("--slo", type=float, default=1.5, help="p99 TPOT bound, in Lambda floors")
    parser.add_argument("--window", type=float, default=1200.0, help="seconds of code planned on")
    parser.add_argument("--replay-window", type=float, default=1200.0, help="seconds of conversations")
    parser.add_argument("--in-loop", action="store_true", help="also size with the re-planner in the loop")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="re-planners replayed beside static")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if unknown := set(variants) - set(VARIANTS):
        parser.error(f"unknown variants {sorted(unknown)}; known: {','.join(VARIANTS)}")

    from moeless.simulation.policies import simulate_policy
    from moeless.sizing import DEFAULT_SEARCH, Slo, SloUnreachable, lambda_floor_ms, size_for_slo
    from moeless.sizing.structures import default_memory_options

    deployment, routing, planning = setting(args.rate, "code", args.window)
    deployment = replace(deployment, prefill_chunk=CHUNK)
    held_out = requests_of(args.rate, "conv", args.replay_window)
    memory = default_memory_options(deployment)[:1]
    floor = lambda_floor_ms(deployment, memory[0])
    slo = Slo(args.slo * floor)
    print(f"sizing the provisioned-only plan for {slo.describe()} ({args.slo:g}x the floor) on code ...")
    # plan's defaults, provisioned only and one memory size (what this benchmark studies)
    search = DEFAULT_SEARCH.with_overrides(memory_mb=tuple(memory), keep_warm=False)
    sized = size_for_slo("moeless", deployment, routing, planning, args.window, slo, search)
    price = sized.chosen.usd_per_cold_start
    plans = {"static": sized.chosen.plan}
    for variant in variants:
        label, memory_s, hold_s = VARIANTS[variant]
        plans[label] = with_replanner(sized.chosen.plan, price, memory_s, hold_s)
    if args.in_loop:
        try:
            looped = size_for_slo("moeless", deployment, routing, planning, args.window, slo,
                                  search.with_overrides(replan_s=60.0))  # fmt: skip
            plans["sized with it in the loop"] = looped.chosen.plan
        except SloUnreachable as exc:
            print(f"sized with the re-planner in the loop: {exc}")
    rows = {}
    for label, plan in plans.items():
        print(f"replaying {label} on {len(held_out)} conversation requests ...")
        result = simulate_policy("moeless", deployment, routing, held_out, args.replay_window, plan=plan,
                                 warm_up=False, timeline=False)  # fmt: skip
        provisioned = sum(f.provisioned_concurrency for f in plan.functions)
        rows[label] = summary_of(result) | {"replans": result.replans, "provisioned": provisioned}
    base = rows["static"]["usd_per_1k_requests"]
    lines = [
        f"DeepSeek-V3, chunks of {CHUNK}, {args.rate:g} req/s; the provisioned-only plan sized for "
        f"{args.slo:g}x the Lambda floor on {args.window:g} s of code (a cold start priced ${price:g}), "
        f"replayed on {args.replay_window:g} s of conversations after a quiet.",
        "",
        *md_header(COLUMNS, "lrlrrrrrrr"),
    ]
    for label, row in rows.items():
        cost, met = row["usd_per_1k_requests"], "yes" if slo.met(row) else "no"
        lines.append(md_row((
            label, row["provisioned"], met, f"{row['completed']}/{row['requests']}", f"{cost:.2f}",
            f"{cost / base:.2f}", f"{row['tpot_ms_p99'] / floor:.2f}", row["cold_starts"],
            f"{row['cold_starts'] / max(row['invokes'], 1):.3%}", row["replans"],
        )))  # fmt: skip
    print("\n".join(lines))
    write_result("replanner_thin", "the forecasting re-planner at thin traffic", lines)


if __name__ == "__main__":
    main()
