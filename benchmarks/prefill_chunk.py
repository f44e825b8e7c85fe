"""Chunked prefill on a whole model: the stall a long prompt puts on decoding, against TTFT and cost.

Usage:
    .venv/bin/python benchmarks/prefill_chunk.py                      # about half a minute here
    .venv/bin/python benchmarks/prefill_chunk.py --trace conv --chunks 0,512

DeepSeek-V3 (routing: OLMoE's on C4, carried onto 256 experts; fp32 experts; batch 16), the
first WINDOW seconds of an Azure 2023 trace rescaled to RATE. For each prefill chunk (0: each
prompt whole in one step, as before chunking), three policies replay the same requests:

* ``oracle``: every function warm and free (the latency bound of the split system);
* ``moeless``: the planner's plan, nothing provisioned, after the deployment's warm-up pass;
* ``static``: the serverful fleet that holds the whole model (chunking the same way).

Printed per row: p99 TPOT over the Lambda floor (MoE layers x (warm invoke + one token's
expert)), p99 TTFT, $ per 1k requests, the ratio to the fleet's $ in the same run, invokes.
What it shows: a chunk bounds the one long step every decoding sequence waits for, but each
chunk re-pays every layer's invokes and the experts' weights, so the backbone prefills fewer
tokens per second and TTFT grows (on Lambda a step's floor is ~1.5 s whatever its tokens).
Writes benchmarks/results/prefill_chunk.md.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any

from common import md_header, md_row, write_result
from slo_plan import ARRIVALS, setting


def row(name: str, chunk: int, summary: dict[str, Any], floor_ms: float, fleet_usd: float) -> str:
    usd = summary["usd_per_1k_requests"]
    tpot, ttft = summary["tpot_ms_p99"] / floor_ms, summary["ttft_ms_p99"] / 1e3
    completed = f"{summary['completed']}/{summary['requests']}"
    cells = (f"{tpot:.2f}", f"{ttft:.1f}", f"{usd:.1f}", f"{usd / fleet_usd:.2f}", f"{summary['invokes']:,}")
    return md_row((chunk or "whole", name, *cells, completed))


def main() -> None:
    from moeless.simulation.policies import simulate_policy
    from moeless.sizing import lambda_floor_ms
    from moeless.sizing.structures import default_memory_options

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", choices=sorted(ARRIVALS), default="code")
    parser.add_argument("--rate", type=float, default=0.05, help="requests per second")
    parser.add_argument("--window", type=float, default=600.0, help="seconds of the trace replayed")
    parser.add_argument("--chunks", default="0,2048,512,256", help="prompt tokens per step; 0: whole")
    args = parser.parse_args()
    deployment, routing, replay = setting(args.rate, args.trace, args.window)
    floor = lambda_floor_ms(deployment, default_memory_options(deployment)[0])
    prompts = sorted(r.prompt_tokens for r in replay)
    lines = [
        f"{len(replay)} requests of the {args.trace} trace at {args.rate:g}/s over {args.window:g} s; "
        f"prompt tokens median {prompts[len(prompts) // 2]}, max {prompts[-1]}; "
        f"Lambda floor {floor:.0f} ms per token. `moeless`: the planner's plan, nothing provisioned, after "
        "the warm-up pass; `oracle`: every function warm; `static`: the fleet; x fleet: $ over the fleet's.",
        "",
        *md_header(("prefill chunk", "policy", "p99 TPOT / floor", "p99 TTFT s", "$/1k", "x fleet", "invokes",
                    "completed"), "llrrrrrr"),
    ]  # fmt: skip
    print("\n".join(lines))
    for chunk in (int(c) for c in args.chunks.split(",")):
        chunked = replace(deployment, prefill_chunk=chunk or None)
        started = time.perf_counter()
        results = {
            name: simulate_policy(
                name, chunked, routing, replay, args.window, timeline=False, warm_up=True
            ).summary()
            for name in ("static", "oracle", "moeless")
        }
        fleet = results["static"]["usd_per_1k_requests"]
        for name, summary in results.items():
            lines.append(row(name, chunk, summary, floor, fleet))
            print(lines[-1], flush=True)
        print(f"chunk {chunk or 'whole'}: {time.perf_counter() - started:.0f} s", flush=True)
    write_result("prefill_chunk", "chunked prefill on Lambda, the stall against TTFT and cost", lines)


if __name__ == "__main__":
    main()
