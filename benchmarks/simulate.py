"""The simulator on real data: which policy pays off, at a low, a medium and a bursty rate.

Usage:
    .venv/bin/python benchmarks/simulate.py [--duration 300]

Two workloads, both with Mixtral-8x7B-sized experts (4096 x 14336, 705 MB fp32):
  * trace: the trained tiny MoE's routing of 800 real prompts (benchmarks/predictors.py's cached
    trace; its 4 layers' recorded routing replayed);
  * routing: Mixtral-8x7B's own routing statistics on C4 (../shared/data/routing/mistral_c4.json,
    layers 0/7/15), tokens sampled from them, 128 prompt + 64 output tokens per request.
Rates: poisson 0.2/s (low), poisson 2/s (medium), bursty 1/s mean with 1.8x peaks in 60 s cycles.
Policies: static (4 always-on g5.xlarge GPU workers), static-replicated (the same fleet with
load-aware replication, 1.25E slots), moeless (that replication on functions), remoe
(backbone-resident vs functions, 12 GB), oracle (moeless's plan with every replica warm). The
serverless policies pre-warm from their predictors; with --replan S they also re-plan every S
seconds from the loads they saw.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from moeless.contracts.loads import load_loads
from moeless.planning.cost_model import CostModel, ExpertShape
from moeless.prediction.trace import load_trace
from moeless.simulation.simulator import (
    POLICIES,
    arrivals,
    requests_from_trace,
    sample_requests,
    simulate_policy,
)

REPO = Path(__file__).resolve().parent.parent
ROUTING = REPO.parent / "shared" / "data" / "routing" / "mistral_c4.json"
RATES = {"low": "poisson:0.2", "medium": "poisson:2", "bursty": "bursty:1:1.8:60"}
MIXTRAL = ExpertShape(4096, 14336, 3 * 4096 * 14336 * 4)
WORKERS = 4


def workloads(duration: float, seed: int):
    traces = sorted((REPO / ".moeless" / "bench").glob("trace-trained-mixtral-*-800"))
    for rate_name, process in RATES.items():
        if traces:
            trace = load_trace(traces[-1])
            times = arrivals(process, duration, np.random.default_rng(seed))
            yield (
                "trace",
                rate_name,
                trace.loads(),
                int(trace.meta["top_k"]),
                requests_from_trace(trace, times),
            )
        if ROUTING.is_file():
            loads = load_loads(ROUTING)
            rng = np.random.default_rng(seed)
            times = arrivals(process, duration, rng)
            yield "routing", rate_name, loads, 2, sample_requests(loads, times, 2, 128, 64, rng)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replan", type=float, default=None, help="re-plan interval in seconds [never]")
    args = parser.parse_args()
    model = CostModel()
    print(
        f"{'workload':<8} {'rate':<7} {'policy':<17} | {'requests':>8} | {'$ / 1k req':>10} | "
        f"{'MoE layer p50 / p99 ms':>22} | {'request p99 s':>13} | {'cold':>5}"
    )
    for source, rate, loads, top_k, replay in workloads(args.duration, args.seed):
        for policy in POLICIES:
            s = simulate_policy(
                policy, loads, top_k, MIXTRAL, WORKERS, replay, args.duration, model, replan_s=args.replan
            ).summary()
            print(
                f"{source:<8} {rate:<7} {policy:<17} | {s['requests']:>8} | "
                f"{s['usd_per_1k_requests']:10.3f} | "
                f"{s['moe_layer_ms_p50']:9.1f} / {s['moe_layer_ms_p99']:9.1f} | "
                f"{s['request_ms_p99'] / 1e3:13.1f} | {s['cold_starts']:>5}"
            )


if __name__ == "__main__":
    main()
