"""The replica optimiser's goals (issue 15), measured on held-out arrivals.

Usage:
    .venv/bin/python benchmarks/slo_plan.py                 # about an hour here
    .venv/bin/python benchmarks/slo_plan.py --rates 0.05 --window 600   # a quick look

For DeepSeek-V3 (routing: OLMoE's on C4, carried onto 256 experts; fp32 experts; batch 16), the
SLO is the goal's own bound: p99 TPOT <= 1.5 x the Lambda floor (MoE layers x (warm invoke +
one token's expert)). At each rate, for each direction (plan on the Azure 2023 code trace, replay
the conversation trace, and the reverse; both rescaled to the rate, the first WINDOW seconds):

1. ``moeless``'s sized plan (pings allowed) and the provisioned-only one (``keep_warm=False``) are
   made on the planning trace, then replayed on the held-out trace: SLO met, $ per 1k requests,
   the fleet's $ for the same requests, p99 TPOT over the floor, cold starts per invoke.
2. The brute-force baseline: the same placement, replicas and memory as the provisioned-only plan
   with every function at one uniform provisioned concurrency (0, 1, 2), replayed on the held-out
   trace; the cheapest that meets the SLO.

Each case is written to OUT/CASE.json and skipped when present (an interrupted run resumes);
the tables are printed at the end and written to OUT/slo_plan.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data"
ARRIVALS = {
    "code": DATA / "arrivals" / "azure2023_code.csv",
    "conv": DATA / "arrivals" / "azure2023_conv.csv",
}
LOADS = DATA / "routing" / "olmoe_c4.json"
MODEL = "deepseek-v3"
UNIFORM_LEVELS = (0, 1, 2)
FLOOR_FACTOR = 1.5


def setting(rate: float, trace: str, window_s: float) -> tuple[Any, Any, list[Any]]:
    from moeless.contracts.loads import load_loads
    from moeless.model.shapes import resolve_model
    from moeless.simulation.arrivals import read_arrivals
    from moeless.simulation.policies import Deployment, requests_for
    from moeless.simulation.routing import SampledRouting

    shape = resolve_model(MODEL)
    loads = load_loads(LOADS)
    layers = list(shape.moe_layers)
    routing = SampledRouting.from_loads(loads, shape.top_k, layers, shape.num_layers, shape.num_experts, 0)
    replay = requests_for(read_arrivals(ARRIVALS[trace]).rescaled(rate).cut(window_s))
    return Deployment.choose(shape), routing, replay


def summary_of(result: Any) -> dict[str, Any]:
    summary = result.summary()
    keys = (
        "requests",
        "completed",
        "usd_per_1k_requests",
        "tpot_ms_p99",
        "ttft_ms_p99",
        "cold_starts",
        "invokes",
    )
    return {key: summary[key] for key in keys}


def one_case(rate: float, plan_on: str, judge_on: str, window_s: float, brute: bool) -> dict[str, Any]:
    from moeless.planning.concurrency import Warmth, with_concurrency
    from moeless.simulation.policies import simulate_policy
    from moeless.simulation.sizing import (
        Slo,
        SloUnreachable,
        default_memory_options,
        lambda_floor_ms,
        size_for_slo,
    )

    deployment, routing, planning = setting(rate, plan_on, window_s)
    _, _, held_out = setting(rate, judge_on, window_s)
    memory = default_memory_options(deployment)[:1]
    floor = lambda_floor_ms(deployment, memory[0])
    slo = Slo(FLOOR_FACTOR * floor)

    def replay(plan: Any) -> dict[str, Any]:
        result = simulate_policy(
            "moeless", deployment, routing, held_out, window_s, plan=plan, warm_up=True, timeline=False
        )
        return summary_of(result)

    case: dict[str, Any] = {"rate": rate, "plan_on": plan_on, "judge_on": judge_on, "window_s": window_s,
                            "floor_ms": floor, "slo_tpot_ms": slo.tpot_ms}  # fmt: skip
    fleet = simulate_policy("static", deployment, routing, held_out, window_s, timeline=False)
    case["fleet"] = summary_of(fleet) | {"label": deployment.fleet.label()}
    for name, keep_warm in (("pinged", True), ("provisioned_only", False)):
        try:
            sizing = size_for_slo("moeless", deployment, routing, planning, window_s, slo,
                                  memory_options=memory, keep_warm=keep_warm)  # fmt: skip
        except SloUnreachable as exc:
            best = exc.sizing.best_latency()
            case[name] = {"reachable": False, "best_planning": best.row(), "held_out": replay(best.plan)}
            continue
        chosen = sizing.chosen
        case[name] = {"reachable": True, "planning": chosen.row(), "held_out": replay(chosen.plan),
                      "replica_scale": chosen.replica_scale}  # fmt: skip
        if name == "provisioned_only" and brute:
            uniform = {}
            for level in UNIFORM_LEVELS:
                plan = with_concurrency(
                    chosen.plan, {f.name: Warmth(level, 0) for f in chosen.plan.functions}
                )
                uniform[str(level)] = replay(plan)
            case["uniform"] = uniform
    return case


def met(summary: dict[str, Any], slo_ms: float) -> bool:
    return summary["completed"] == summary["requests"] and summary["tpot_ms_p99"] <= slo_ms


def table(cases: list[dict[str, Any]]) -> str:
    lines = [
        "| rate | plan on -> judged on | plan | SLO met on held-out | $/1k | x fleet | p99 TPOT / floor "
        "| cold starts / invokes | cheapest uniform level meeting the SLO ($/1k) | plan / brute force |",
        "|---:|---|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for case in cases:
        fleet = case["fleet"]["usd_per_1k_requests"]
        brute = None
        for level, summary in sorted(case.get("uniform", {}).items(), key=lambda kv: int(kv[0])):
            if met(summary, case["slo_tpot_ms"]) and (
                brute is None or summary["usd_per_1k_requests"] < brute[1]
            ):
                brute = (level, summary["usd_per_1k_requests"])
        for name in ("pinged", "provisioned_only"):
            entry = case.get(name)
            if entry is None:
                continue
            held = entry["held_out"]
            cost = held["usd_per_1k_requests"]
            ok = met(held, case["slo_tpot_ms"]) if entry["reachable"] else False
            label = name + ("" if entry["reachable"] else " (SLO unreachable: best plan)")
            brute_text = f"{brute[0]} (${brute[1]:.2f})" if brute else "none"
            ratio = f"{cost / brute[1]:.2f}" if brute else "-"
            lines.append(
                f"| {case['rate']:g} | {case['plan_on']} -> {case['judge_on']} | {label} "
                f"| {'yes' if ok else 'no'} "
                f"| {cost:.2f} | {cost / fleet:.3f} | {held['tpot_ms_p99'] / case['floor_ms']:.2f} "
                f"| {held['cold_starts'] / max(held['invokes'], 1):.4%} | {brute_text} | {ratio} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="0.02,0.05,0.1")
    parser.add_argument("--window", type=float, default=1200.0, help="seconds of each trace replayed")
    parser.add_argument("--brute-rates", default="0.05", help="rates where the uniform sweep runs")
    parser.add_argument("--out", type=Path, default=REPO / ".moeless" / "bench" / "slo")
    args = parser.parse_args()
    if not ARRIVALS["code"].is_file():
        raise SystemExit("needs ../shared/data (the Azure 2023 arrival traces and OLMoE's routing)")
    args.out.mkdir(parents=True, exist_ok=True)
    brute_rates = {float(r) for r in args.brute_rates.split(",") if r}
    cases = []
    for rate in (float(r) for r in args.rates.split(",")):
        directions = (("code", "conv"), ("conv", "code")) if rate in brute_rates else (("code", "conv"),)
        for plan_on, judge_on in directions:
            path = args.out / f"{MODEL}_{rate:g}_{plan_on}_{judge_on}_{args.window:g}.json"
            if not path.is_file():
                print(f"== {MODEL} at {rate:g}/s: plan on {plan_on}, judge on {judge_on}", flush=True)
                case = one_case(rate, plan_on, judge_on, args.window, rate in brute_rates)
                path.write_text(json.dumps(case, indent=1))
            cases.append(json.loads(path.read_text()))
    text = table(cases)
    (args.out / "slo_plan.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
