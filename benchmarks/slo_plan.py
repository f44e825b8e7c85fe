"""The replica optimiser's goals (issue 15), measured on held-out arrivals.

Usage:
    .venv/bin/python benchmarks/slo_plan.py                 # about 40 minutes here
    .venv/bin/python benchmarks/slo_plan.py --rates 0.05 --window 600   # a quick look
    .venv/bin/python benchmarks/slo_plan.py --rates 0.05 --directions conv:code --prefill-chunks 0,256
    .venv/bin/python benchmarks/slo_plan.py --rates 0.05 --directions conv:code --prefill-chunks 256
    .venv/bin/python benchmarks/slo_plan.py --rates 0.02,0.1 --full-rates 0.02,0.1 --prefill-chunks 256 # 3 h
    .venv/bin/python benchmarks/slo_plan.py --rates 0.02,0.05 --full-rates 0.02,0.05 --directions conv:code \
        --prefill-chunks 256 --stall-bound    # about 30 minutes

For DeepSeek-V3 (routing: OLMoE's on C4, carried onto 256 experts; fp32 experts; batch 16), the
SLOs bound p99 TPOT: the goal's own 1.5 x the Lambda floor (MoE layers x (warm invoke + one
token's expert)), 3 x, and "reach": 1.25 x the best p99 TPOT any plan reaches on the planning
trace (always reachable there; the held-out trace may differ). At each rate, for each direction
(plan on the Azure 2023 code trace, replay the conversation trace, and the reverse; both rescaled
to the rate, the first WINDOW seconds):

1. ``moeless``'s sized plan (pings allowed) and the provisioned-only one (``keep_warm=False``) are
   made on the planning trace, then replayed on the held-out trace: SLO met, $ per 1k requests,
   the fleet's $ for the same requests, p99 TPOT over the floor, cold starts per invoke.
2. The brute-force baseline: the same placement, replicas and memory as the provisioned-only plan
   with every function at one uniform provisioned concurrency, replayed on the held-out trace;
   the cheapest that meets the SLO. The levels: 0, 1, 2 and every level up to the most any
   function can have in use at once (``reach_of``: 4 with x4 replicas and chunks of 256, where
   the top level keeps every level in reach warm); where that top is above MAX_SWEPT (whole
   prompts), 0, 1, 2 and the top alone. Where the SLO is out of reach on the planning trace,
   ``plan`` refuses it: the fastest plan is replayed for what it shows, with no ratio.
3. The same uniform levels on the planning trace: the optimiser against the brute force on the
   traffic it planned on, where no shift between traces plays a part (a case file that lacks a
   level, on either trace, gets it on the next run). The cheapest level there is the brute force
   sized with what the optimiser knows; its held-out replay (from step 2) gives the last column:
   whether that level meets the SLO held out, and each plan's held-out cost over its. Step 2's
   brute force instead picks its level knowing the held-out trace.

Every replay on the held-out trace starts after a quiet, as the optimiser judges on the planning
trace: nothing warm but what the plan keeps warm (not the deployment's one-off warm-up pass).

With ``--stall-bound`` every plan also meets the optimiser's stall bound (p99 TPOT within the SLO
for a full batch decoding beside a prefill chunk, every environment warm: ``plan``'s default;
without the flag the plans are sized as ``plan --no-stall-bound``, as the README's tables before it
were measured); its cases are written apart (``_stall``). With ``--uniform-levels`` each
structure's family also holds the brute force's plans (``plan --uniform-levels``); its cases are
written apart too (``_uniform``). With ``--every-level-premium P`` each structure's every-level
plan is judged too and taken where it costs at most 1 + P times the structure's cheapest
(``plan``'s default, 0.1; without the flag it is not judged, as the README's tables before it were
measured); cases ``_premiumP``.

With ``--prefill-chunks`` the optimiser also chooses the engine's prefill chunk (0: whole prompts,
the default and the only choice without it); each plan is replayed with the chunk it was sized
with, the uniform levels too.

Each case is written to OUT/CASE.json and skipped when present (an interrupted run resumes);
the table is printed at the end and written to benchmarks/results/slo_plan.md.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import write_result

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data"
ARRIVALS = {
    "code": DATA / "arrivals" / "azure2023_code.csv",
    "conv": DATA / "arrivals" / "azure2023_conv.csv",
}
LOADS = DATA / "routing" / "olmoe_c4.json"
MODEL = "deepseek-v3"
UNIFORM_LEVELS = (0, 1, 2)
MAX_SWEPT = 8  # above this many levels in reach, only the top one is swept beyond UNIFORM_LEVELS
REACH_MARGIN = 1.25


def setting(rate: float, trace: str, window_s: float) -> tuple[Any, Any, list[Any]]:
    """The deployment, the routing and the requests of ``trace`` (:func:`requests_of`)."""
    from moeless.contracts.loads import load_loads
    from moeless.model.shapes import resolve_model
    from moeless.simulation.policies import Deployment
    from moeless.simulation.routing import SampledRouting

    shape = resolve_model(MODEL)
    loads = load_loads(LOADS)
    layers = list(shape.moe_layers)
    routing = SampledRouting.from_loads(loads, shape.top_k, layers, shape.num_layers, shape.num_experts, 0)
    return Deployment.choose(shape), routing, requests_of(rate, trace, window_s)


def requests_of(rate: float, trace: str, window_s: float) -> list[Any]:
    """The first ``window_s`` seconds of ``trace``'s arrivals rescaled to ``rate`` requests/s."""
    from moeless.simulation.arrivals import read_arrivals
    from moeless.simulation.policies import requests_for

    return requests_for(read_arrivals(ARRIVALS[trace]).rescaled(rate).cut(window_s))


def summary_of(result: Any) -> dict[str, Any]:
    summary = result.summary()
    keys = ("requests", "completed", "usd_per_1k_requests", "tpot_ms_p99", "ttft_ms_p99", "cold_starts",
            "invokes", "one_off_usd")  # fmt: skip
    return {key: summary[key] for key in keys}


def pick(points: list[Any], slo_ms: float, premium: float | None = None) -> tuple[Any, bool]:
    """The optimiser's choice for the SLO on the planning traffic (``choose``: the cheapest point
    meeting it and the stall bound, where the points were probed for it, or with a ``premium`` an
    every-level one), else the fastest (unreachable)."""
    from moeless.sizing import Slo, choose
    from moeless.sizing.choice import fastest_completing

    chosen = choose(points, Slo(slo_ms), premium, bounded=True)
    if chosen is not None:
        return chosen, True
    return min(points, key=fastest_completing), False


def one_case(
    rate: float,
    plan_on: str,
    judge_on: str,
    window_s: float,
    factors: list[float],
    full: bool,
    chunks: list[int | None],
    stall_bound: bool = False,
    uniform_levels: bool = False,
    premium: float | None = None,
) -> dict[str, Any]:
    """One rate and direction: the frontier of each mode on the planning trace (every grid point,
    so each SLO's choice is the one ``plan --slo-tpot-ms`` makes), each SLO's choice replayed on
    the held-out trace, and with ``full`` the provisioned-only mode too (``sweep_uniform`` adds
    its uniform levels)."""
    from moeless.simulation.policies import simulate_policy
    from moeless.sizing import DEFAULT_SEARCH, Slo, lambda_floor_ms, size_for_slo
    from moeless.sizing.choice import fastest_completing
    from moeless.sizing.structures import default_memory_options

    deployment, routing, planning = setting(rate, plan_on, window_s)
    held_out = requests_of(rate, judge_on, window_s)
    memory = default_memory_options(deployment)[:1]
    floor = lambda_floor_ms(deployment, memory[0])

    def replay(plan: Any, chunk: int | None) -> dict[str, Any]:
        """The plan on the held-out trace after a quiet, as the optimiser judges."""
        chunked = replace(deployment, prefill_chunk=chunk)
        result = simulate_policy(
            "moeless", chunked, routing, held_out, window_s, plan=plan, warm_up=False, timeline=False
        )
        return summary_of(result)

    case: dict[str, Any] = {"rate": rate, "plan_on": plan_on, "judge_on": judge_on, "window_s": window_s,
                            "floor_ms": floor, "stall_bound": stall_bound, "uniform_levels": uniform_levels,
                            "every_level_premium": premium, "slos": {}}  # fmt: skip
    fleet = simulate_policy("static", deployment, routing, held_out, window_s, timeline=False)
    case["fleet"] = summary_of(fleet) | {"label": deployment.fleet.label()}
    modes = (("pinged", True), ("provisioned_only", False)) if full else (("pinged", True),)
    frontiers = {}
    for name, keep_warm in modes:
        # every point judged (exhaustive): each SLO's choice is then made from the whole frontier
        search = DEFAULT_SEARCH.with_overrides(
            memory_mb=tuple(memory), keep_warm=keep_warm, prefill_chunks=tuple(chunks),
            stall_bound=stall_bound, uniform_levels=uniform_levels, every_level_premium=premium,
            exhaustive=True,
        )  # fmt: skip
        sizing = size_for_slo("moeless", deployment, routing, planning, window_s, Slo(float("inf")), search)
        frontiers[name] = sizing.points
        case[f"frontier_{name}"] = [p.row() for p in sizing.points]
    replayed: dict[int, dict[str, Any]] = {}
    # the SLOs: multiples of the floor, and 1.25x the best p99 TPOT any plan reaches on the
    # planning trace ("reach": always reachable there, the held-out trace may differ)
    best = min((p for points in frontiers.values() for p in points), key=fastest_completing)
    best_ms = best.summary["tpot_ms_p99"]
    bounds = {f"{factor:g}": factor * floor for factor in factors} | {"reach": REACH_MARGIN * best_ms}
    for label, slo_ms in bounds.items():
        entry: dict[str, Any] = {"slo_tpot_ms": slo_ms}
        for name, points in frontiers.items():
            chosen, reachable = pick(points, slo_ms, premium)
            if id(chosen.plan) not in replayed:
                replayed[id(chosen.plan)] = replay(chosen.plan, chosen.prefill_chunk)
            entry[name] = {
                "reachable": reachable,
                "planning": chosen.row(),
                "held_out": replayed[id(chosen.plan)],
            }
        case["slos"][label] = entry
    return case


def sweep_uniform(case: dict[str, Any]) -> bool:
    """Add the uniform levels (the module doc, step 2) missing from each provisioned-only choice of
    ``case``, in place: replayed on the held-out trace (``uniform``) and on the planning trace
    (``uniform_planning``), each on the choice's structure, after a quiet. Whether anything was
    added (a case file written before a level was swept gets it on the next run)."""
    import functools

    from moeless.planning.concurrency import Warmth, with_concurrency, with_memory, with_replicas
    from moeless.planning.packing import pack_across_layers
    from moeless.simulation.policies import plan_for_policy, simulate_policy
    from moeless.sizing.structures import coactivation, memory_for_experts, reach_of

    window = case["window_s"]
    deployment, routing, planning = setting(case["rate"], case["plan_on"], window)
    traces = {"uniform": requests_of(case["rate"], case["judge_on"], window), "uniform_planning": planning}
    loads = routing.loads()
    swept: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    built: dict[tuple[Any, ...], tuple[Any, Any, list[int]]] = {}  # shape -> variant, plan, levels
    added = False
    for entry in case["slos"].values():
        if "provisioned_only" not in entry:
            continue
        row = entry["provisioned_only"]["planning"]
        shape = (row["packing"], row["replica_scale"], row["memory_mb"], row["prefill_chunk"] or None)
        if shape not in built:
            packing, scale, memory, chunk = shape
            variant = replace(deployment, prefill_chunk=chunk)
            base = with_concurrency(plan_for_policy("moeless", loads, variant), {})
            memory_for = functools.partial(memory_for_experts, variant)
            packed = pack_across_layers(base, packing, coactivation(routing, loads), memory_for)
            structure = with_replicas(with_memory(packed, memory), scale)
            top = max(reach_of(structure, variant).values())
            levels = sorted(set(UNIFORM_LEVELS) | (set(range(top + 1)) if top <= MAX_SWEPT else {top}))
            built[shape] = (variant, structure, levels)
        variant, plan, levels = built[shape]
        for key, trace in traces.items():
            done = swept.setdefault(shape, {}).setdefault(key, {}) | entry.get(key, {})
            for level in levels:
                if str(level) not in done:
                    print(f"   uniform level {level} of {shape} on {key}", flush=True)
                    uniform = with_concurrency(plan, {f.name: Warmth(level, 0) for f in plan.functions})
                    result = simulate_policy("moeless", variant, routing, trace, window, plan=uniform,
                                             warm_up=False, timeline=False)  # fmt: skip
                    done[str(level)] = summary_of(result)
            swept[shape][key] = done
            if entry.get(key) != done:
                entry[key] = dict(sorted(done.items(), key=lambda pair: int(pair[0])))
                added = True
    return added


def cheapest_met(sweep: dict[str, dict[str, Any]], slo_ms: float) -> tuple[str, float] | None:
    """The cheapest uniform level of ``sweep`` that meets the SLO, with its $ per 1k requests."""
    passing = [(level, s["usd_per_1k_requests"]) for level, s in sweep.items() if met(s, slo_ms)]
    return min(passing, key=lambda pair: pair[1]) if passing else None


def met(summary: dict[str, Any], slo_ms: float) -> bool:
    return summary["completed"] == summary["requests"] and summary["tpot_ms_p99"] <= slo_ms


def table(cases: list[dict[str, Any]]) -> str:
    lines = [
        "| rate | plan on -> judged on | SLO: p99 TPOT (x floor) "
        "| plan (packing, replicas, provisioned, pinged) "
        "| reachable on planning | met on held-out "
        "| $/1k | x fleet | p99 TPOT / floor | cold starts / invokes | one-off $ "
        "| cheapest uniform level meeting the SLO ($/1k) | plan / brute force "
        "| on the planning trace: cheapest uniform level, plan / it "
        "| that level held out: met, plan / it |",
        "|---:|---|---:|---|---|---|---:|---:|---:|---:|---:|---|---:|---|---|",
    ]
    for case in cases:
        fleet = case["fleet"]["usd_per_1k_requests"]
        bounded = " (stall bound)" if case.get("stall_bound") else ""
        bounded += " (uniform levels)" if case.get("uniform_levels") else ""
        if case.get("every_level_premium") is not None:
            bounded += f" (premium {case['every_level_premium']:g})"
        for factor, entry in case["slos"].items():
            slo_ms = entry["slo_tpot_ms"]
            brute = cheapest_met(entry.get("uniform", {}), slo_ms)
            on_planning = cheapest_met(entry.get("uniform_planning", {}), slo_ms)
            for name in ("pinged", "provisioned_only"):
                if name not in entry:
                    continue
                held = entry[name]["held_out"]
                cost = held["usd_per_1k_requests"]
                brute_text = (
                    f"{brute[0]} (${brute[1]:.2f})" if brute else ("none" if "uniform" in entry else "-")
                )
                reachable = "yes" if entry[name]["reachable"] else "no"
                # an SLO out of reach on the planning trace has no plan (``plan`` refuses it): the
                # fastest plan replayed is no sizing to hold against the brute force
                ratio = f"{cost / brute[1]:.2f}" if brute and entry[name]["reachable"] else "-"
                row = entry[name]["planning"]
                own = sized_alike = "-"
                if "uniform_planning" in entry and on_planning is None:
                    own = sized_alike = "none meets"
                elif on_planning is not None:
                    own = f"{on_planning[0]}: {row['usd_per_1k_requests'] / on_planning[1]:.2f}"
                    alike = entry["uniform"][on_planning[0]]
                    verdict = "met" if met(alike, slo_ms) else "missed"
                    held_ratio = cost / alike["usd_per_1k_requests"]
                    sized_alike = f"{verdict}, {held_ratio:.2f}" if entry[name]["reachable"] else verdict
                warmth = f"{row['provisioned']}, {row['keep_warm']}"
                if row.get("prefill_chunk"):
                    warmth += f", chunk {row['prefill_chunk']}"
                if row.get("every_level"):
                    warmth += ", every level"
                shape = f"{name} ({row['packing']}, x{row['replica_scale']}, {warmth})"
                lines.append(
                    f"| {case['rate']:g} | {case['plan_on']} -> {case['judge_on']}{bounded} "
                    f"| {factor} ({slo_ms / case['floor_ms']:.2f}x) "
                    f"| {shape} | {reachable} | {'yes' if met(held, slo_ms) else 'no'} "
                    f"| {cost:.2f} | {cost / fleet:.3f} | {held['tpot_ms_p99'] / case['floor_ms']:.2f} "
                    f"| {held['cold_starts'] / max(held['invokes'], 1):.3%} | {held['one_off_usd']:.2f} "
                    f"| {brute_text} | {ratio} | {own} | {sized_alike} |"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="0.02,0.05,0.1")
    parser.add_argument("--window", type=float, default=1200.0, help="seconds of each trace replayed")
    parser.add_argument(
        "--full-rates", default="0.05", help="rates run both ways, provisioned-only and swept"
    )
    parser.add_argument("--factors", default="1.5,3", help="SLOs: p99 TPOT bounds as multiples of the floor")
    parser.add_argument("--directions", default="", help="plan:judge pairs, e.g. conv:code [all]")
    parser.add_argument("--prefill-chunks", default="0", help="chunks the optimiser may choose; 0: whole")
    parser.add_argument("--stall-bound", action="store_true", help="plans also meet the stall bound")
    parser.add_argument("--uniform-levels", action="store_true", help="families hold the uniform levels")
    parser.add_argument(
        "--every-level-premium", type=float, help="every level warm where within 1 + this (plan: 0.1)"
    )
    parser.add_argument("--out", type=Path, default=REPO / ".moeless" / "bench" / "slo")
    args = parser.parse_args()
    if not ARRIVALS["code"].is_file():
        raise SystemExit("needs ../shared/data (the Azure 2023 arrival traces and OLMoE's routing)")
    args.out.mkdir(parents=True, exist_ok=True)
    full_rates = {float(r) for r in args.full_rates.split(",") if r}
    factors = [float(f) for f in args.factors.split(",")]
    chunks = [int(c) or None for c in args.prefill_chunks.split(",")]
    wanted = {tuple(d.split(":")) for d in args.directions.split(",") if d}
    suffix = "" if chunks == [None] else "_chunks" + "-".join(str(c or 0) for c in chunks)
    suffix += "_stall" if args.stall_bound else ""
    suffix += "_uniform" if args.uniform_levels else ""
    suffix += f"_premium{args.every_level_premium:g}" if args.every_level_premium is not None else ""
    cases = []
    for rate in (float(r) for r in args.rates.split(",")):
        full = rate in full_rates
        directions = (("code", "conv"), ("conv", "code")) if full else (("code", "conv"),)
        for plan_on, judge_on in directions:
            if wanted and (plan_on, judge_on) not in wanted:
                continue
            path = args.out / f"{MODEL}_{rate:g}_{plan_on}_{judge_on}_{args.window:g}{suffix}.json"
            if not path.is_file():
                print(f"== {MODEL} at {rate:g}/s: plan on {plan_on}, judge on {judge_on}", flush=True)
                case = one_case(rate, plan_on, judge_on, args.window, factors, full, chunks, args.stall_bound,
                                args.uniform_levels, args.every_level_premium)  # fmt: skip
                path.write_text(json.dumps(case, indent=1))
            case = json.loads(path.read_text())
            if full and sweep_uniform(case):
                path.write_text(json.dumps(case, indent=1))
            cases.append(case)
    text = table(cases)
    print(text)
    intro = (
        f"DeepSeek-V3 ({LOADS.name} carried onto 256 experts, fp32 experts, batch 16); each plan sized on "
        f"one Azure 2023 trace and replayed on the other after a quiet, both rescaled to the rate, the first "
        f'{args.window:g} s. SLOs bound p99 TPOT as multiples of the Lambda floor; "reach": 1.25x the best '
        "any plan reaches on the planning trace. The brute force: every function at one uniform provisioned "
        "level (the module docstring)."
    )
    write_result("slo_plan", "SLO-sized plans judged on held-out traffic", [intro, "", text])


if __name__ == "__main__":
    main()
