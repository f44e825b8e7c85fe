"""What extra replicas buy: p99 TPOT of DeepSeek-V3 with every environment warm (the oracle), as the
planner's replicas are multiplied.

Usage:
    .venv/bin/python benchmarks/prefill_replicas.py        # under a minute here

A prefill runs as one step of the batch and stalls every decoding sequence; splitting each
expert's prefill rows over more concurrent environments shortens that step. Setting: OLMoE's C4
routing carried onto 256 experts, the Azure 2023 conversation trace at 0.05 requests/s, first
1,200 s; the ratio is to the Lambda floor (MoE layers x (warm invoke + one token's expert)).
Writes benchmarks/results/prefill_replicas.md.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from common import md_header, md_row, write_result

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
SCALES = (1, 4, 16)


def main() -> None:
    from moeless.contracts.loads import load_loads
    from moeless.model.shapes import resolve_model
    from moeless.simulation.arrivals import read_arrivals
    from moeless.simulation.policies import Deployment, plan_for_policy, requests_for, simulate_policy
    from moeless.simulation.routing import SampledRouting
    from moeless.sizing import lambda_floor_ms

    if not (DATA / "arrivals").is_dir():
        raise SystemExit("needs ../shared/data (the Azure 2023 arrival traces and OLMoE's routing)")
    shape = resolve_model("deepseek-v3")
    routing = SampledRouting.from_loads(
        load_loads(DATA / "routing" / "olmoe_c4.json"),
        shape.top_k,
        list(shape.moe_layers),
        shape.num_layers,
        shape.num_experts,
        0,
    )
    replay = requests_for(read_arrivals(DATA / "arrivals" / "azure2023_conv.csv").rescaled(0.05).cut(1200))
    deployment = Deployment.choose(shape)
    plan = plan_for_policy("moeless", routing.loads(), deployment)
    floor = lambda_floor_ms(deployment, plan.functions[0].memory_mb)
    lines = [
        f"DeepSeek-V3, {len(replay)} requests of the conversation trace at 0.05/s over 1,200 s, every "
        f"environment warm (the oracle); Lambda floor {floor:.0f} ms.",
        "",
        *md_header(("replicas", "TPOT p50 / floor", "TPOT p99 / floor", "TTFT p99 ms")),
    ]
    print("\n".join(lines))
    for scale in SCALES:
        scaled = replace(plan, experts=[replace(e, replicas=e.replicas * scale) for e in plan.experts])
        summary = simulate_policy(
            "oracle", deployment, routing, replay, 1200, plan=scaled, timeline=False
        ).summary()
        tpot = (f"{summary[key] / floor:.2f}" for key in ("tpot_ms_p50", "tpot_ms_p99"))
        lines.append(md_row((f"x{scale}", *tpot, f"{summary['ttft_ms_p99']:.0f}")))
        print(lines[-1], flush=True)
    write_result("prefill_replicas", "what extra replicas buy a prefill, every environment warm", lines)


if __name__ == "__main__":
    main()
