"""Serving throughput and latency: the split service (experts on the local Lambda host) vs the unsplit model.

Usage:
    .venv/bin/python benchmarks/serve.py             # 1, 4 and 16 concurrent clients
    .venv/bin/python benchmarks/serve.py --quick     # 1 and 4 clients, fewer requests
    .venv/bin/python benchmarks/serve.py --device cuda   # the GPU path (both backbones on the GPU)
    .venv/bin/python benchmarks/serve.py --host-process  # the local Lambda host in its own process
    .venv/bin/python benchmarks/serve.py --plans layer      # only the plan that groups each layer's experts

Model: the demo's tiny Mixtral (4 layers x 8 experts, hidden 128), built once under .moeless/bench/.
For each number of concurrent clients, in the same run:
  * service: clients stream greedy completions from ``POST /v1/completions`` (uvicorn, real sockets);
    every routed expert runs in an awslambdaric process of the local host, invoked through boto3
    (the host's HTTP servers run in this process, sharing its interpreter lock with the service,
    unless ``--host-process`` runs them in a ``moeless functions up`` child, as Lambda is remote;
    on these 2 cores that was not faster: 0.39-0.42 against 0.46 at 16 clients, measured before
    the numpy grouping and the fixed user agent); each plan of
    ``--plans`` (``expert``: one function per expert; ``layer``: each layer's experts in one
    function, a step's rows for them in one bundled invoke) is served in turn;
  * baseline: the same continuous-batching engine (batched decode) over the unsplit checkpoint
    in-process (torch experts, no HTTP), driven by the same number of concurrent requests.
Both backbones run on ``--device`` (``auto``: CUDA when present, else CPU).
It prints output tokens/s, p50/p99 time per output token (TPOT: gap between tokens after the first),
p50 time to first token, the ratio service/baseline, and the service's mean per-layer dispatch time
(one MoE layer's experts for all sequences of a step: encode, invoke, wait, decode).
Prompts: ../shared/data/prompts/dev.jsonl when it exists, else the project's demo prompts.
Writes benchmarks/results/serve.md.
"""

from __future__ import annotations

import argparse
import json
import queue
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
from common import load_prompts, md_header, md_row, tiny_mixtral, write_result

from backbone_service.local import running_service
from moeless.contracts.manifest import load_manifest
from moeless.contracts.plan import load_plan, one_function_per_expert
from moeless.lambda_host.experts import start_expert_host
from moeless.model.reference import eos_token_ids
from moeless.planning.packing import pack_within_layer
from moeless.serving.backbone import Backbone, BackboneConfig, resolve_device
from moeless.serving.generation import GenerationEngine, SamplingParams

REPO = Path(__file__).resolve().parent.parent
WORKDIR = REPO / ".moeless" / "bench" / "serve-mixtral"
SHARED_PROMPTS = REPO.parent / "shared" / "data" / "prompts" / "dev.jsonl"
EXPERT_ROOT = REPO / "functions" / "expert"
MAX_TOKENS = 24


def summarise(records: list[tuple[float, list[float]]], wall_s: float) -> dict[str, float]:
    """records: (submit time, token arrival times) per request."""
    tokens = sum(len(times) for _, times in records)
    tpot = [(times[-1] - times[0]) / (len(times) - 1) * 1e3 for _, times in records if len(times) > 1]
    ttft = [(times[0] - start) * 1e3 for start, times in records if times]
    ordered = sorted(tpot)
    return {
        "tokens_per_s": tokens / wall_s,
        "tpot_p50": statistics.median(ordered),
        "tpot_p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "ttft_p50": statistics.median(ttft),
    }


def run_clients(clients: int, prompts: list[str], one_request) -> tuple[list, float]:
    """``clients`` threads, each sending its share of ``prompts`` one after another."""
    records: list[tuple[float, list[float]]] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        for prompt in prompts[index::clients]:
            record = one_request(prompt)
            with lock:
                records.append(record)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return records, time.perf_counter() - started


def service_request(url: str, model: str, connections: int = 16):
    """One streamed completion, on a keep-alive connection made beforehand (as an SDK client keeps
    one), so that no client's set-up is timed."""
    clients: queue.SimpleQueue[httpx.Client] = queue.SimpleQueue()
    for _ in range(connections):
        clients.put(httpx.Client(timeout=300))

    def one(prompt: str) -> tuple[float, list[float]]:
        body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
        http = clients.get()
        start, times = time.perf_counter(), []
        try:
            with http.stream("POST", f"{url}/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {") and '"text": ""' not in line:
                        times.append(time.perf_counter())
        finally:
            clients.put(http)
        return start, times

    return one


def engine_request(engine: GenerationEngine, tokenizer):
    def one(prompt: str) -> tuple[float, list[float]]:
        start, times, done = time.perf_counter(), [], threading.Event()

        def on_event(event) -> None:
            if event.kind == "text" and event.text:
                times.append(time.perf_counter())
            elif event.kind != "text":
                done.set()

        ids = tokenizer(prompt)["input_ids"]
        engine.submit(ids, SamplingParams(MAX_TOKENS, temperature=0.0), on_event)
        done.wait()
        return start, times

    return one


PLANS = {
    "expert": "one function per expert (an invoke per needed expert and layer)",
    "layer": "a layer's experts in one function (one bundled invoke per layer)",
}


def plan_of(kind: str, artifacts: Path, folder: Path) -> Path:
    """The plan file of ``kind`` (see ``PLANS``) for the package."""
    manifest = load_manifest(artifacts)
    plan = one_function_per_expert(manifest)
    if kind == "layer":
        experts = manifest.num_experts
        plan = pack_within_layer(
            plan,
            experts,
            lambda _: np.zeros((experts, experts)),
            lambda _: np.ones(experts),
            lambda _: plan.functions[0].memory_mb,
        )
    folder.mkdir(parents=True, exist_ok=True)
    plan.save(folder / f"plan-{kind}.json")
    return folder / f"plan-{kind}.json"


@contextmanager
def host_process(artifacts: Path, plan: Path) -> Iterator[str]:
    """The Lambda API URL of the plan's functions on a local host in a ``moeless functions up``
    child process (off the service's interpreter lock)."""
    command = [
        sys.executable,
        "-c",
        "from cli.main import cli; cli()",
        "functions",
        "up",
        str(artifacts),
        "--plan",
        str(plan),
    ]
    process = subprocess.Popen(
        [*command, "--port", "0", "--quiet"], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        found = next((m for line in process.stdout if (m := re.search(r"Lambda API: (\S+)", line))), None)
        if found is None:
            raise RuntimeError(f"`moeless functions up` exited ({process.wait()}) before serving")
        yield found[1]
    finally:
        process.terminate()
        process.communicate(timeout=60)


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--host-process", action="store_true", help="run the Lambda host in its own process")
    parser.add_argument(
        "--plans", default="expert,layer", help=f"comma-separated, of: {', '.join(PLANS)} (default both)"
    )
    args = parser.parse_args()
    plans = args.plans.split(",")
    if unknown := set(plans) - set(PLANS):
        parser.error(f"unknown plan(s) {', '.join(sorted(unknown))}; choose from {', '.join(PLANS)}")
    device = resolve_device(args.device)
    levels = (1, 4) if args.quick else (1, 4, 16)
    per_level = 8 if args.quick else 32
    model_dir, artifacts = tiny_mixtral(WORKDIR, progress=True)
    prompts = load_prompts(per_level)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    unsplit = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    baseline = GenerationEngine(unsplit, tokenizer, None, eos_token_ids(unsplit), max_batch=16)
    host = "in its own process" if args.host_process else "in-process"
    lines = [
        f"Prompts: {'../shared/data/prompts/dev.jsonl' if SHARED_PROMPTS.is_file() else 'demo prompts'}, "
        f"{per_level} requests per level, max_tokens {MAX_TOKENS}, greedy, backbones on {device}, "
        f"Lambda host {host}. Tokens/s of output; TPOT: time per output token after the first; "
        "ratio: service tok/s over unsplit tok/s; dispatch: one MoE layer's experts for all sequences "
        "of a step.",
        "",
        *md_header(("plan", "clients", "service tok/s", "TPOT p50 / p99 ms", "TTFT p50 ms", "unsplit tok/s",
                    "TPOT p50 / p99 ms", "ratio", "dispatch ms per layer"), "lrrrrrrrr"),
    ]  # fmt: skip
    print("\n".join(lines))
    counters = []
    try:
        for kind in plans:
            plan_path = plan_of(kind, artifacts, WORKDIR)
            config = BackboneConfig(
                artifacts, plan=plan_path, device=device, max_batch=16, replan_interval_s=0
            )
            with ExitStack() as stack:
                start_host = None
                if args.host_process:
                    endpoint = stack.enter_context(host_process(artifacts, plan_path))
                    config = replace(config, lambda_endpoint=endpoint)
                else:
                    plan = load_plan(plan_path, load_manifest(artifacts))
                    start_host = lambda plan=plan: start_expert_host(artifacts, plan, EXPERT_ROOT)  # noqa: E731
                server, backbone, _ = stack.enter_context(running_service(config, 0, start_host))
                lines += measure(server.url, backbone, baseline, tokenizer, prompts, levels, PLANS[kind])
                counts = {k: int(v) for k, v in sorted(backbone.stats.snapshot()["counters"].items())}
                counters.append(f"- {PLANS[kind]}: `{json.dumps(counts)}`")
    finally:
        baseline.stop()
    counters = ["", "Service counters:", "", *counters]
    print("\n".join(counters))
    write_result(
        "serve", "the split service on the local Lambda host against the unsplit model", lines + counters
    )


def measure(
    url: str,
    backbone: Backbone,
    baseline: GenerationEngine,
    tokenizer,
    prompts: list[str],
    levels: tuple[int, ...],
    plan: str,
) -> list[str]:
    """Both systems at each number of concurrent clients, the service first: a Markdown row per level."""
    ask = service_request(url, backbone.model_name)
    run_clients(16, load_prompts(16), ask)  # warm-up: start the instances 16 clients need
    rows = []
    for clients in levels:
        before = backbone.stats.snapshot()["dispatch"]
        service, wall = run_clients(clients, prompts, ask)
        served = summarise(service, wall)
        after = backbone.stats.snapshot()["dispatch"]
        count = sum(h["count"] for h in after.values()) - sum(h["count"] for h in before.values())
        total = sum(h["sum"] for h in after.values()) - sum(h["sum"] for h in before.values())
        local, wall = run_clients(clients, prompts, engine_request(baseline, tokenizer))
        base = summarise(local, wall)
        rows.append(
            md_row((
                plan if not rows else "", clients, f"{served['tokens_per_s']:.1f}",
                f"{served['tpot_p50']:.1f} / {served['tpot_p99']:.1f}", f"{served['ttft_p50']:.0f}",
                f"{base['tokens_per_s']:.1f}", f"{base['tpot_p50']:.1f} / {base['tpot_p99']:.1f}",
                f"{served['tokens_per_s'] / base['tokens_per_s']:.2f}", f"{total / max(count, 1) * 1e3:.2f}",
            ))
        )  # fmt: skip
        print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    main()
