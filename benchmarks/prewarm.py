"""Cold starts on the request path, with and without SPS pre-warming, on a stream of real prompts.

Usage:
    .venv/bin/python benchmarks/prewarm.py [--requests 24]

The trained tiny Mixtral (`moeless model train` defaults, on ../shared/data/text) is packaged and
served with every expert a function on the local host. Requests arrive in bursts of 4; after a
burst is answered the stream pauses until every idle instance has been reaped (2 s), so each
burst meets cold functions. One sequence runs at a time (max batch 1), so queued requests give
the pre-warmer lead time. Similar-Prompt Search learns from a trace of 800 other prompts
(profiled once, cached) and online from each finished request. Prompts: entries
800+ of ../shared/data/prompts/dev.jsonl (not in the trace), else the demo prompts repeated.
Writes benchmarks/results/prewarm.md.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

from common import bench_model, md_header, md_row, write_result

from moeless.contracts.manifest import load_manifest
from moeless.contracts.plan import one_function_per_expert
from moeless.demo.prompts import DEMO_PROMPTS
from moeless.lambda_host.experts import start_expert_host
from moeless.model.packaging import package
from moeless.prediction.trace import profile, read_prompts
from moeless.serving.backbone import Backbone, BackboneConfig
from moeless.serving.generation import SamplingParams

REPO = Path(__file__).resolve().parent.parent
SHARED_PROMPTS = REPO.parent / "shared" / "data" / "prompts" / "dev.jsonl"
IDLE_S, BURST = 2.0, 4


def run(artifacts: Path, trace: Path | None, prompts: list[str]) -> dict[str, float]:
    plan = one_function_per_expert(load_manifest(artifacts))
    host = start_expert_host(artifacts, plan, REPO / "functions" / "expert", idle_timeout_s=IDLE_S)
    config = BackboneConfig(
        artifacts,
        lambda_endpoint=host.endpoint_url,
        max_batch=1,
        predictor_trace=trace,
        prewarm_idle_s=IDLE_S,
        replan_interval_s=0,
    )
    backbone = Backbone(config)
    latencies: list[float] = []
    try:
        for start in range(0, len(prompts), BURST):
            threads = []
            for prompt in prompts[start : start + BURST]:

                def one(prompt: str = prompt) -> None:
                    began, done = time.perf_counter(), threading.Event()
                    backbone.engine.submit(
                        backbone.encode(prompt),
                        SamplingParams(8, temperature=0),
                        lambda e: done.set() if e.kind != "text" else None,
                        prompt,
                    )
                    done.wait()
                    latencies.append(time.perf_counter() - began)

                threads.append(threading.Thread(target=one))
                threads[-1].start()
            for thread in threads:
                thread.join()
            time.sleep(IDLE_S + 1.5)  # every instance idles out before the next burst
        counters = backbone.stats.snapshot()["counters"]
    finally:
        backbone.close()
        host.stop()
    return {
        "cold_on_path": counters.get("cold_starts", 0),
        "invokes": counters.get("invokes", 0),
        "prewarm_invokes": counters.get("prewarm_invokes", 0),
        "p50_s": statistics.median(latencies),
        "p99_s": max(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=24)
    args = parser.parse_args()
    model = bench_model()
    artifacts = REPO / ".moeless" / "bench" / f"{model.name}-artifacts"
    package(model, artifacts, progress=False)  # resumes: a no-op once packaged
    if SHARED_PROMPTS.is_file():
        history = read_prompts(SHARED_PROMPTS, 800)
        stream = read_prompts(SHARED_PROMPTS, 800 + args.requests)[800:]
    else:
        history, stream = (
            list(DEMO_PROMPTS),
            [DEMO_PROMPTS[i % len(DEMO_PROMPTS)] for i in range(args.requests)],
        )
    trace = REPO / ".moeless" / "bench" / f"trace-{model.name}-{len(history)}"
    if not (trace / "meta.json").is_file():
        profile(model, history, trace, max_new_tokens=16, hidden_sample_rate=0.5)
    lines = [
        f"{len(stream)} requests in bursts of {BURST}, every instance reaped ({IDLE_S:g} s idle) between "
        f"bursts, one sequence at a time; SPS learns from {len(history)} other prompts. Latency is "
        "end to end per request.",
        "",
        *md_header(("", "cold starts on the request path", "invokes", "warm-up invokes", "p50 s", "max s")),
    ]
    print("\n".join(lines))
    for label, source in (("no pre-warm", None), ("SPS pre-warm", trace)):
        r = run(artifacts, source, stream)
        counts = (f"{r[key]:.0f}" for key in ("cold_on_path", "invokes", "prewarm_invokes"))
        lines.append(md_row((label, *counts, f"{r['p50_s']:.2f}", f"{r['p99_s']:.2f}")))
        print(lines[-1], flush=True)
    write_result("prewarm", "cold starts on the request path with and without SPS pre-warming", lines)


if __name__ == "__main__":
    main()
