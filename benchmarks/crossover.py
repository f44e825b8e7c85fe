"""Where serverless experts pay: the fleet, the hybrid node, moeless on Lambda alone and the tiered
plan the optimiser picks, each at its cheapest that meets a TPOT SLO, across request rates.

Usage (needs the project's data, ../shared/data):
    .venv/bin/python benchmarks/crossover.py                              # every model, rate, SLO
    .venv/bin/python benchmarks/crossover.py --models mixtral-8x7b --rates 0.01,0.2
    .venv/bin/python benchmarks/crossover.py --report                     # tables from the cases

For each model (its routing: Mixtral-8x7B's recorded on C4; gpt-oss-120b carried from gpt-oss-20b's
recorded loads onto its 128 experts; DeepSeek-V3 carried from OLMoE's on C4 onto its 256), experts
in int8 (what hybrid-node users run: a quantised checkpoint; fp32 would price every option by
weights nobody serves), chunked prefill of 256 tokens, batch 16; each direction of the Azure 2023
traces (plan on the code trace, judge on the conversation trace, and the reverse), each rescaled
to each rate; for each TPOT SLO (1.5x and 3x the Lambda floor, and half of it, which only the
backbone's tiers can reach):

1. ``plan --slo-tpot-ms`` on the planning trace (``size_for_slos`` with the default search, the
   structures probed once for the three SLOs: every tier, the fleet and the hybrid node among the
   candidates): the chosen plan, and for each of the
   fleet, the hybrid node and Lambda alone its cheapest plan that meets the SLO there (else its
   fastest);
2. each of the four replayed on the held-out trace after a quiet: $ per 1k requests, p99 TPOT,
   whether it meets the SLO;
3. per row: which option is cheapest among those that meet the SLO held out, and the chosen plan's
   cost over it (the goal: at most 1.1x).

The window replayed at a rate ends with the ``WINDOW_REQUESTS``-th arrival of whichever trace takes
longer to reach it (the traces are bursty: a fixed window holds 6 requests of one and 40 of the
other), so every case judges about as many requests. Each
case (model, direction, rate) is written to OUT/CASE.json and skipped when present (an interrupted
run resumes). The tables and one plot per model ($ per 1k requests against the rate, a line per
option, held out, at the 3x SLO) go to benchmarks/results/crossover.md and crossover-MODEL.png.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from common import REPO, RESULTS, SHARED, commit, write_result

ARRIVALS = {
    "code": SHARED / "arrivals" / "azure2023_code.csv",
    "conv": SHARED / "arrivals" / "azure2023_conv.csv",
}
MODELS = {
    "mixtral-8x7b": SHARED / "routing" / "mistral_c4.json",
    "gpt-oss-120b": SHARED / "routing" / "gptoss20b_decode.loads.json",
    "deepseek-v3": SHARED / "routing" / "olmoe_c4.json",
}
RATES = (0.002, 0.01, 0.05, 0.2, 1.0)
SLOS = {"0.5x": 0.5, "1.5x": 1.5, "3x": 3.0}  # x the Lambda floor
DIRECTIONS = (("code", "conv"), ("conv", "code"))
WINDOW_REQUESTS = 40
OPTIONS = ("fleet", "hybrid", "lambda", "chosen")
EXPERT_DTYPE = "int8"
PREFILL_CHUNK = 256


def window_s(rate: float) -> float:
    """Seconds that hold ``WINDOW_REQUESTS`` arrivals of each trace rescaled to ``rate``."""
    from moeless.simulation.arrivals import read_arrivals

    ends = []
    for path in ARRIVALS.values():
        times = read_arrivals(path).rescaled(rate).times_s
        ends.append(float(times[min(WINDOW_REQUESTS, len(times)) - 1]) + 1.0)
    return max(ends)


def setting(model: str, rate: float, trace: str) -> tuple[Any, Any, list[Any], float]:
    """The deployment, the routing, ``trace``'s requests at ``rate`` and the window."""
    from moeless.contracts.loads import load_loads
    from moeless.model.shapes import resolve_model
    from moeless.simulation.arrivals import read_arrivals
    from moeless.simulation.policies import Deployment, requests_for
    from moeless.simulation.routing import SampledRouting

    shape = resolve_model(model)
    loads = load_loads(MODELS[model])
    layers = list(shape.moe_layers)
    routing = SampledRouting.from_loads(loads, shape.top_k, layers, shape.num_layers, shape.num_experts, 0)
    deployment = Deployment.choose(shape, EXPERT_DTYPE, prefill_chunk=PREFILL_CHUNK)
    span = window_s(rate)
    return deployment, routing, requests_for(read_arrivals(ARRIVALS[trace]).rescaled(rate).cut(span)), span


def one_case(model: str, rate: float, plan_on: str, judge_on: str) -> dict[str, Any]:
    from moeless.simulation.policies import simulate_policy
    from moeless.sizing import DEFAULT_SEARCH, Slo, size_for_slos
    from moeless.sizing.choice import fastest_completing
    from moeless.sizing.report import cheapest_by_tier
    from moeless.sizing.structures import default_memory_options
    from moeless.sizing.tiers import lambda_floor_ms

    deployment, routing, planning, span = setting(model, rate, plan_on)
    held_out = setting(model, rate, judge_on)[2]
    floor = lambda_floor_ms(deployment, default_memory_options(deployment)[0])
    case: dict[str, Any] = {
        "model": model, "rate": rate, "plan_on": plan_on, "judge_on": judge_on, "window_s": span,
        "floor_ms": floor, "requests": len(held_out), "slos": {},
    }  # fmt: skip
    replayed: dict[int, dict[str, Any]] = {}

    def replay(point: Any) -> dict[str, Any]:
        if id(point.plan) not in replayed:
            variant = point.structure.variant
            result = simulate_policy(
                "moeless", variant, routing, held_out, span, plan=point.plan, warm_up=False, timeline=False
            )
            summary = result.summary()
            replayed[id(point.plan)] = {
                key: summary[key]
                for key in ("usd_per_1k_requests", "tpot_ms_p99", "ttft_ms_p99", "completed")
            }
        return replayed[id(point.plan)]

    started = time.perf_counter()
    slos = {label: Slo(factor * floor) for label, factor in SLOS.items()}
    sizings = size_for_slos("moeless", deployment, routing, planning, span, [*slos.values()], DEFAULT_SEARCH)
    case["sizing_seconds"] = time.perf_counter() - started
    for (label, slo), sizing in zip(slos.items(), sizings, strict=True):
        by_tier = cheapest_by_tier(sizing)
        entry: dict[str, Any] = {"slo_tpot_ms": slo.tpot_ms}
        for option in OPTIONS:
            if option == "chosen":
                point = sizing.chosen
            else:
                point = by_tier.get(option) or min(
                    (p for p in sizing.points if p.structure.tier == option),
                    key=fastest_completing,
                    default=None,
                )
            if point is None:
                entry[option] = None
                continue
            held = replay(point)
            tpot = held["tpot_ms_p99"]
            entry[option] = {
                "tier": point.structure.tier,
                "backbone": point.structure.variant.backbone.label(),
                "functions": len(point.plan.functions),
                "planning_usd_per_1k": point.usd_per_1k,
                "planning_meets": slo.met(point.summary),
                "held_out": held,
                "meets": tpot is not None and tpot <= slo.tpot_ms and held["completed"] == len(held_out),
            }
        case["slos"][label] = entry
        print(f"  {model} {plan_on}->{judge_on} {rate:g}/s {label}: {_row_text(entry)}", flush=True)
    return case


def _row_text(entry: dict[str, Any]) -> str:
    parts = []
    for option in OPTIONS:
        got = entry.get(option)
        if got is None:
            parts.append(f"{option} -")
            continue
        usd = got["held_out"]["usd_per_1k_requests"]
        parts.append(f"{option} ${usd:.2f}{'' if got['meets'] else ' (misses)'}")
    return "; ".join(parts)


def verdict(entry: dict[str, Any]) -> tuple[str, float | None, float | None]:
    """(the cheapest option that meets the SLO held out, its $ per 1k, the chosen plan's cost over
    the cheapest of fleet, hybrid and Lambda alone that meets it, or None)."""
    meeting = {
        o: entry[o]["held_out"]["usd_per_1k_requests"] for o in OPTIONS if entry.get(o) and entry[o]["meets"]
    }
    if not meeting:
        return "none", None, None
    winner = min(meeting, key=lambda o: meeting[o])
    alternatives = [meeting[o] for o in ("fleet", "hybrid", "lambda") if o in meeting]
    chosen = entry.get("chosen")
    ratio = None
    if alternatives and chosen is not None:
        ratio = chosen["held_out"]["usd_per_1k_requests"] / min(alternatives)
    return winner, meeting[winner], ratio


def report(cases: list[dict[str, Any]]) -> list[str]:
    """The result file's body: how the cases were measured, a table and a plot per model, and
    where functions pay."""
    run = sorted({(c["model"], c["rate"]) for c in cases})
    measured = ", ".join(
        f"{model} at {', '.join(f'{r:g}' for m, r in run if m == model)}"
        for model in dict.fromkeys(m for m, _ in run)
    )
    recorded = sorted({c["commit"] for c in cases if "commit" in c})
    commits = ", ".join(recorded) if recorded else "unrecorded"
    commits += " (some cases unrecorded)" if recorded and any("commit" not in c for c in cases) else ""
    lines = [
        f"Cases measured by `PYTHONHASHSEED=0 .venv/bin/python benchmarks/crossover.py --models M --rates R` "
        f"for {measured} (both directions), at commit {commits}; the tables read their case files. Setting: "
        f"the module docstring (int8 experts, prefill chunk {PREFILL_CHUNK}, batch 16; SLOs on p99 TPOT as "
        "multiples of the Lambda floor). $ per 1k requests on the held-out trace; `(misses)`: misses the "
        "SLO there; ratio: the chosen plan's cost over the cheapest of fleet, hybrid and Lambda alone that "
        "meets the SLO held out (goal: at most 1.1).",
        "",
    ]
    for model in dict.fromkeys(c["model"] for c in cases):
        mine = sorted((c for c in cases if c["model"] == model), key=lambda c: (c["plan_on"], c["rate"]))
        lines += [
            f"## {model} (Lambda floor {mine[0]['floor_ms']:.0f} ms)",
            "",
            "| plan on -> judged on | rate /s | SLO | fleet | hybrid | Lambda alone "
            "| chosen (tier, backbone) | cheapest that meets | ratio |",
            "|---|---:|---|---:|---:|---:|---|---|---:|",
        ]
        for case in mine:
            for label, entry in case["slos"].items():
                cells = []
                for option in ("fleet", "hybrid", "lambda"):
                    got = entry.get(option)
                    cells.append(_cell(got))
                chosen = entry.get("chosen")
                where = f" ({chosen['tier']}, {chosen['backbone']})" if chosen else ""
                winner, _, ratio = verdict(entry)
                ratio_text = "" if ratio is None else f"{ratio:.2f}"
                lines.append(
                    f"| {case['plan_on']} -> {case['judge_on']} | {case['rate']:g} | {label} "
                    f"({entry['slo_tpot_ms']:.0f} ms) | {' | '.join(cells)} | {_cell(chosen)}{where} | "
                    f"{winner} | {ratio_text} |"
                )
        lines.append("")
        lines.append(f"![{model}](crossover-{model}.png)")
        lines.append("")
    lines += ["## Where functions pay", "", *_where_functions_pay(cases)]
    return lines


def _cell(got: dict[str, Any] | None) -> str:
    if got is None:
        return "-"
    usd = got["held_out"]["usd_per_1k_requests"]
    return f"{usd:.2f}{'' if got['meets'] else ' (misses)'}"


def _where_functions_pay(cases: list[dict[str, Any]]) -> list[str]:
    """Per model and SLO, the rates at which the cheapest option that meets it held out uses
    functions (Lambda alone, or a chosen tier with functions)."""
    lines = []
    for model in dict.fromkeys(c["model"] for c in cases):
        for label in SLOS:
            pays, not_pays = [], []
            for case in (c for c in cases if c["model"] == model):
                entry = case["slos"].get(label)
                if entry is None:
                    continue
                winner, _, _ = verdict(entry)
                uses = winner == "lambda" or (winner == "chosen" and entry["chosen"]["functions"] > 0)
                (pays if uses else not_pays).append(f"{case['rate']:g} ({case['plan_on']})")
            lines.append(
                f"- {model}, SLO {label} the floor: functions pay at "
                f"{', '.join(pays) or 'no rate'}; not at {', '.join(not_pays) or 'any rate'}"
            )
    return lines


def plot(cases: list[dict[str, Any]], model: str, label: str = "3x") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for plan_on, style in zip(("code", "conv"), ("-", "--"), strict=True):
        mine = sorted(
            (c for c in cases if c["model"] == model and c["plan_on"] == plan_on), key=lambda c: c["rate"]
        )
        for option in OPTIONS:
            points = [
                (c["rate"], c["slos"][label][option]["held_out"]["usd_per_1k_requests"])
                for c in mine
                if label in c["slos"] and c["slos"][label].get(option) and c["slos"][label][option]["meets"]
            ]
            if points:
                axes.plot(
                    *zip(*points, strict=True),
                    style,
                    marker="o",
                    color=f"C{OPTIONS.index(option)}",
                    label=f"{option} (planned on {plan_on})",
                )
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("requests/s")
    axes.set_ylabel("$ per 1k requests (held out, meeting the SLO)")
    axes.set_title(f"{model}: p99 TPOT at most {label} the Lambda floor")
    axes.legend(fontsize=7)
    figure.tight_layout()
    path = RESULTS / f"crossover-{model}.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES))
    parser.add_argument("--directions", default="", help="plan:judge pairs, e.g. code:conv [both]")
    parser.add_argument("--report", action="store_true", help="only write the tables from the cases")
    parser.add_argument("--out", type=Path, default=REPO / ".moeless" / "bench" / "crossover")
    args = parser.parse_args()
    if not ARRIVALS["code"].is_file():
        raise SystemExit(f"needs the project's data: {ARRIVALS['code']} is missing")
    models = [m for m in args.models.split(",") if m]
    rates = [float(r) for r in args.rates.split(",") if r]
    directions = [tuple(d.split(":")) for d in args.directions.split(",") if d] or list(DIRECTIONS)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for model in models:
            for plan_on, judge_on in directions:
                for rate in rates:
                    path = args.out / f"{model}_{plan_on}-{judge_on}_{rate:g}.json"
                    if path.exists():
                        continue
                    started = time.perf_counter()
                    case = one_case(model, rate, plan_on, judge_on)
                    case["seconds"] = time.perf_counter() - started
                    case["commit"] = commit()
                    path.write_text(json.dumps(case, indent=1, default=_json))
    cases = [json.loads(p.read_text()) for p in sorted(args.out.glob("*.json"))]
    cases = [c for c in cases if c["model"] in models]
    RESULTS.mkdir(parents=True, exist_ok=True)
    for model in dict.fromkeys(c["model"] for c in cases):
        plot(cases, model)
    lines = report(cases)
    print("\n".join(lines))
    write_result("crossover", "where serverless experts pay", lines)


def _json(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return None
    raise TypeError(f"{type(value).__name__} is not JSON")


if __name__ == "__main__":
    main()
