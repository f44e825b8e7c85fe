"""The whole-model study: cost per 1k requests and p99 TTFT/TPOT of each policy against the request
rate, for whole models on real arrivals, against the serverful fleet that holds each model.

Usage:
    .venv/bin/python benchmarks/simulate.py                       # the README's study
    .venv/bin/python benchmarks/simulate.py --models mixtral-8x7b --rates 0.1,1 --quick

Models and the routing they replay (every MoE layer; layers the data does not record copy the
nearest recorded one, see each report.md):
  * mixtral-8x7b: Mixtral-8x7B's own routing on C4 (../shared/data/routing/mistral_c4.json);
  * gpt-oss-120b: gpt-oss-20b's recorded routing of all 24 layers (gptoss20b_decode.loads.json),
    each layer's skew carried from 32 onto 128 experts (the family's router, not 120b's own);
  * deepseek-v3: OLMoE's routing on C4 (olmoe_c4.json), carried from 64 onto 256 experts (an
    assumption: no DeepSeek routing is at hand).
Arrivals: the Azure 2023 conversation trace (../shared/data/arrivals/azure2023_conv.csv, 1,155
prompt / 211 output tokens on average), its timestamps rescaled to each rate (burst shape kept),
cut to at least 300 s and at least the trace's first 40 requests (its bursts make a fixed span hold
very different counts; the tables give the rate the window really had). Policies: static (the
cheapest fleet that holds the model), moeless, remoe, oracle, as `moeless simulate` runs them with
its defaults (continuous batching up to 16 sequences, fp32 experts, native GPU dtype).

Each (model, rate) writes OUT/MODEL/RATE/{report.md,results.csv} and is skipped when present, so an
interrupted study resumes. It ends with OUT/study.csv, OUT/cost_vs_rate.png, and a Markdown table
per model with the crossover rate where the fleet becomes cheaper than moeless, written to
benchmarks/results/simulate.md.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from pathlib import Path

from common import md_header, md_row, write_result

REPO = Path(__file__).resolve().parent.parent
ROUTING = REPO.parent / "shared" / "data" / "routing"
ARRIVALS = REPO.parent / "shared" / "data" / "arrivals" / "azure2023_conv.csv"
MODELS = {
    "mixtral-8x7b": (ROUTING / "mistral_c4.json", False),
    "gpt-oss-120b": (ROUTING / "gptoss20b_decode.loads.json", True),
    "deepseek-v3": (ROUTING / "olmoe_c4.json", True),
}
RATES = (0.01, 0.1, 1.0, 10.0)
POLICIES = ("static", "hybrid", "moeless", "remoe", "oracle")


def duration_for(rate: float, quick: bool) -> float:
    """At least 300 s (120 quick), and long enough for the trace's first 40 (10 quick) requests at
    this rate: the trace's own bursts make a fixed span hold very different counts."""
    from moeless.simulation.arrivals import read_arrivals

    times = read_arrivals(ARRIVALS).rescaled(rate).times_s
    count = 10 if quick else 40
    return max(120.0 if quick else 300.0, float(times[min(count, len(times) - 1)]))


def run_one(model: str, rate: float, out: Path, quick: bool) -> Path:
    """One `moeless simulate` run (its own process, as a user runs it); returns its results.csv."""
    loads, resample = MODELS[model]
    folder = out / model / f"{rate:g}"
    results = folder / "results.csv"
    if results.is_file():
        return results
    command = [
        str(Path(sys.executable).parent / "moeless"), "simulate", "--loads", str(loads), "--model", model,
        "--arrivals", str(ARRIVALS), "--rate", str(rate), "--duration", str(duration_for(rate, quick)),
        "--policies", ",".join(POLICIES), "--no-plots", "-o", str(folder),
    ]  # fmt: skip
    if resample:
        command.append("--resample-experts")
    print(f"== {model} at {rate:g} requests/s", flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return results


def crossover(rates: list[float], ours: list[float], fleet: list[float]) -> str:
    from moeless.simulation.policies import crossover_rate

    rate = crossover_rate(rates, ours, fleet)
    return "never in this range" if rate is None else f"{rate:.3g}/s"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES))
    parser.add_argument("--quick", action="store_true", help="Shorter runs (120 s, 10 requests at least).")
    parser.add_argument("-o", "--output", type=Path, default=REPO / ".moeless" / "bench" / "study")
    args = parser.parse_args()
    if not ARRIVALS.is_file():
        sys.exit(f"needs {ARRIVALS} (the project's shared data)")
    models = [m for m in args.models.split(",") if m]
    rates = sorted(float(r) for r in args.rates.split(",") if r)
    rows = []
    for model in models:
        for rate in rates:
            for row in csv.DictReader(run_one(model, rate, args.output, args.quick).open()):
                rows.append({"model": model, "rate": rate} | row)
    with open(args.output / "study.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, models, args.output / "cost_vs_rate.png")
    lines = [
        "Arrivals: the Azure 2023 conversation trace rescaled to each rate, each run at least "
        f"{120 if args.quick else 300} s and the trace's first {10 if args.quick else 40} requests (the rate "
        "in brackets is the one the window really had). $ per 1k requests (per completed request where a "
        "policy could not keep up), p99 TTFT and TPOT in ms, cold starts on the request path. Routing, "
        "policies and defaults: the module docstring.",
    ]
    for model in models:
        mine = [r for r in rows if r["model"] == model]
        # the serverless policies' backbone; the hybrid policy's node is another instance
        backbone = next(r["backbone"] for r in mine if r["backbone"] and r["policy"] != "hybrid")
        hybrid = next((f"; hybrid node {r['backbone']}" for r in mine if r["policy"] == "hybrid"), "")
        lines += [
            "",
            f"## {model}",
            "",
            f"fleet {mine[0]['fleet']}; backbone {backbone}{hybrid}",
            "",
            *md_header(("rate /s (the window's)", "policy", "$ per 1k requests", "vs static", "TTFT p99 ms",
                        "TPOT p99 ms", "cold starts"), "rlrrrrr"),
        ]  # fmt: skip
        series: dict[str, list[float]] = {}
        for rate in rates:
            at = {r["policy"]: r for r in mine if r["rate"] == rate}
            static = float(at["static"]["usd_per_1k_requests"])
            for policy, r in at.items():
                usd = float(r["usd_per_1k_requests"])
                series.setdefault(policy, []).append(usd)
                real = int(r["requests"]) / duration_for(rate, args.quick)
                lines.append(md_row((
                    f"{rate:g} ({real:.2g})", policy, f"{usd:.4g}", f"{usd / static:.2f}x",
                    f"{float(r['ttft_ms_p99']):.0f}", f"{float(r['tpot_ms_p99']):.0f}", r["cold_starts"],
                )))  # fmt: skip
        if "moeless" in series and len(series["moeless"]) == len(rates):
            cross = crossover(rates, series["moeless"], series["static"])
            lines += ["", f"The fleet is cheaper than moeless from {cross}."]
    print("\n".join(lines))
    print(f"\n{args.output / 'study.csv'}, {args.output / 'cost_vs_rate.png'}")
    write_result("simulate", "the whole-model study, cost and latency per policy against the rate", lines)


def plot(rows: list[dict], models: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        for policy in POLICIES:
            points = sorted(
                (r["rate"], float(r["usd_per_1k_requests"]))
                for r in rows
                if r["model"] == model and r["policy"] == policy
            )
            if points:  # one colour per policy in every panel, whichever policies a panel has
                ax.plot(
                    *zip(*points, strict=True), marker="o", label=policy, color=f"C{POLICIES.index(policy)}"
                )
        ax.set(xscale="log", yscale="log", title=model, xlabel="requests / s", ylabel="$ per 1k requests")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
