"""Every level in reach kept warm (``plan --warm-every-level``), judged on held-out arrivals.

Usage:
    .venv/bin/python benchmarks/every_level.py     # about 50 minutes here, after benchmarks/slo_plan.py

The plans ``benchmarks/slo_plan.py`` sizes for a TPOT bound keep warm the levels the planning
trace used, at the cheapest price of a cold start that meets the bound there; held out, a
provisioned-only plan meets new levels cold (DeepSeek-V3 at 0.05/s, sized on code, judged on
conversations: 453 cold starts, p99 TPOT 6.14x the floor against 1.5x). Here each of its 1.5x
plans with chunks of 256 (the ``_stall`` case where one was written, else the plain one) is sized
again with every level in reach warm (provisioned, or with pings allowed pinged above what
provisioning pays for) and replayed on the same held-out trace after a quiet. The structure is
the one the case chose (x4 replicas, 4 layers' experts per function, 1,769 MB): under the stall
bound x1 replicas cannot meet 1.5x (2.59x the floor decoding beside a chunk), and one layer per
function needs four times the environments. The brute force (every function at one uniform
provisioned level, on that structure) is the case's own.

Each case is written to OUT/every_level_CASE.json and skipped when present; the table is printed
and written to benchmarks/results/every_level.md.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import write_result
from slo_plan import ARRIVALS, MODEL, REPO, cheapest_met, met, requests_of, setting, summary_of

FACTOR = "1.5"
MODES = ("pinged", "provisioned_only")


def case_file(out: Path, rate: float, plan_on: str, judge_on: str, window: float) -> Path | None:
    """The slo_plan case this one builds on: with the stall bound where it was run, else without."""
    stem = f"{MODEL}_{rate:g}_{plan_on}_{judge_on}_{window:g}_chunks256"
    for suffix in ("_stall", ""):
        path = out / f"{stem}{suffix}.json"
        if path.is_file():
            return path
    return None


def every_level_case(case: dict[str, Any]) -> dict[str, Any]:
    """Size each mode's 1.5x plan again with every level in reach warm; replay it held out."""
    from moeless.simulation.policies import simulate_policy
    from moeless.sizing import DEFAULT_SEARCH, Slo, SloUnreachable, size_for_slo

    window = case["window_s"]
    deployment, routing, planning = setting(case["rate"], case["plan_on"], window)
    held_out = requests_of(case["rate"], case["judge_on"], window)
    entry = case["slos"][FACTOR]
    result: dict[str, Any] = {}
    for mode in MODES:
        row = entry[mode]["planning"]
        chunk = int(row["prefill_chunk"]) or None
        try:
            search = DEFAULT_SEARCH.with_overrides(
                memory_mb=(row["memory_mb"],), replica_scales=(row["replica_scale"],),
                packings=(row["packing"],), prefill_chunks=(chunk,), keep_warm=mode == "pinged",
                warm_every_level=True, every_level_premium=None,
            )  # fmt: skip
            sizing = size_for_slo(
                "moeless", deployment, routing, planning, window, Slo(entry["slo_tpot_ms"]), search
            )
        except SloUnreachable as exc:
            result[mode] = {"reachable": False, "planning": exc.sizing.best_latency().row()}
            continue
        chosen = sizing.chosen
        assert chosen is not None
        chunked = replace(deployment, prefill_chunk=chunk)
        replayed = simulate_policy(
            "moeless", chunked, routing, held_out, window, plan=chosen.plan, warm_up=False, timeline=False
        )
        result[mode] = {"reachable": True, "planning": chosen.row(), "held_out": summary_of(replayed)}
    return result


def table(rows: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    lines = [
        "| rate | plan on -> judged on | mode "
        "| sized on the trace: warm, met held out, p99 TPOT / floor, $/1k "
        "| every level: warm, planning $/1k (x the trace-sized) | met held out | p99 TPOT / floor "
        "| cold starts / invokes | $/1k | x fleet | plan / brute force | same info: level met, plan / it |",
        "|---:|---|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for case, every in rows:
        entry = case["slos"][FACTOR]
        slo_ms, floor = entry["slo_tpot_ms"], case["floor_ms"]
        fleet = case["fleet"]["usd_per_1k_requests"]
        brute = cheapest_met(entry.get("uniform", {}), slo_ms)
        same_info = cheapest_met(entry.get("uniform_planning", {}), slo_ms)
        for mode in MODES:
            sized, ours = entry[mode], every[mode]
            warm = f"{sized['planning']['provisioned']}, {sized['planning']['keep_warm']}"
            was = sized["held_out"]
            before = (
                f"{warm}, {'yes' if met(was, slo_ms) else 'no'}, "
                f"{was['tpot_ms_p99'] / floor:.2f}, {was['usd_per_1k_requests']:.2f}"
            )
            head = f"| {case['rate']:g} | {case['plan_on']} -> {case['judge_on']} | {mode} | {before} "
            if not ours["reachable"]:
                lines.append(head + "| refused on the planning trace | - | - | - | - | - | - | - |")
                continue
            row, held = ours["planning"], ours["held_out"]
            cost = held["usd_per_1k_requests"]
            planning_ratio = row["usd_per_1k_requests"] / sized["planning"]["usd_per_1k_requests"]
            ratio = f"{cost / brute[1]:.2f}" if brute else "none meets"
            alike = "none meets on the planning trace"
            if same_info is not None:
                level = entry["uniform"][same_info[0]]
                verdict = "met" if met(level, slo_ms) else "missed"
                alike = f"{same_info[0]} {verdict}, {cost / level['usd_per_1k_requests']:.2f}"
            lines.append(
                head + f"| {row['provisioned']}, {row['keep_warm']}: {row['usd_per_1k_requests']:.2f} "
                f"({planning_ratio:.3f}) | {'yes' if met(held, slo_ms) else 'no'} "
                f"| {held['tpot_ms_p99'] / floor:.2f} | {held['cold_starts'] / max(held['invokes'], 1):.3%} "
                f"| {cost:.2f} | {cost / fleet:.3f} | {ratio} | {alike} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="0.02,0.05,0.1")
    parser.add_argument("--window", type=float, default=1200.0)
    parser.add_argument("--out", type=Path, default=REPO / ".moeless" / "bench" / "slo")
    args = parser.parse_args()
    if not ARRIVALS["code"].is_file():
        raise SystemExit("needs ../shared/data (the Azure 2023 arrival traces and OLMoE's routing)")
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        for plan_on, judge_on in (("code", "conv"), ("conv", "code")):
            source = case_file(args.out, rate, plan_on, judge_on, args.window)
            if source is None:
                print(f"skipped {rate:g} {plan_on} -> {judge_on}: no slo_plan.py case with chunks of 256")
                continue
            case = json.loads(source.read_text())
            path = args.out / f"every_level_{source.name}"
            if not path.is_file():
                print(f"== {MODEL} at {rate:g}/s: plan on {plan_on}, judge on {judge_on}", flush=True)
                path.write_text(json.dumps(every_level_case(case), indent=1))
            rows.append((case, json.loads(path.read_text())))
    text = table(rows)
    print(text)
    intro = (
        "DeepSeek-V3 as in slo_plan.py, chunks of 256: each case's 1.5x plan sized again with every level "
        "in reach warm, on the structure the case chose, replayed on the same held-out trace after a quiet."
    )
    write_result("every_level", "every level in reach warm, judged on held-out traffic", [intro, "", text])


if __name__ == "__main__":
    main()
