"""Soak: concurrent clients against the local endpoint for a fixed time, with faults injected, then
an overload burst. Bounded in clients and time; everything listens on 127.0.0.1 only.

Usage:
    .venv/bin/python benchmarks/soak.py                          # 8 clients, 60 s, all faults
    .venv/bin/python benchmarks/soak.py --clients 4 --seconds 15 --json soak.json

Model: a tiny random Mixtral (4 layers x 8 experts), built once under .moeless/bench/soak; one
function per expert on the local Lambda host. During the load:
  * a killer SIGKILLs a random live function instance every --kill-every seconds;
  * one function (layer 0, expert 0) is throttled: reserved concurrency 0, so every invoke gets
    Lambda's 429 (TooManyRequestsException);
  * one function (the last layer, expert 1) fails every invoke (handler exception);
every answer must be complete and token-identical, under greedy decoding, to the unsplit model's.
Then an overload burst (--burst concurrent requests against a queue of --max-waiting) must be
answered with 200 or 429 + Retry-After, never a hang or a 5xx. Exit status 1 if anything failed.
Writes benchmarks/results/soak.md, or with --json the result as JSON there instead (as the tests
run it: a short soak does not replace the measured one).

The faulty handler is the tests' fault injector (tests/lambda_handlers/faulty_expert.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import httpx
from common import md_table, tiny_mixtral, write_result

from backbone_service.local import running_service
from moeless.contracts.manifest import load_manifest
from moeless.contracts.plan import one_function_per_expert
from moeless.demo.prompts import DEMO_PROMPTS
from moeless.lambda_host.client import lambda_client
from moeless.lambda_host.experts import expert_function_configs
from moeless.lambda_host.host import LambdaHost
from moeless.model.reference import greedy_texts
from moeless.serving.backbone import BackboneConfig

REPO = Path(__file__).resolve().parent.parent
WORKDIR = REPO / ".moeless" / "bench" / "soak"
EXPERT_ROOT = REPO / "functions" / "expert"
FAULTY_ROOT = REPO / "tests" / "lambda_handlers"
MAX_TOKENS = 8


class Killer(threading.Thread):
    """SIGKILLs one random live function instance every ``every_s`` seconds."""

    def __init__(self, host: LambdaHost, names: list[str], every_s: float, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.host, self.names, self.every_s, self.rng = host, names, every_s, rng
        self.kills = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            live = [i["pid"] for name in self.names for i in self.host.pool(name).describe() if i.get("pid")]
            if live:
                try:
                    os.kill(self.rng.choice(live), signal.SIGKILL)
                    self.kills += 1
                except ProcessLookupError:
                    pass


def soak(
    clients: int, seconds: float, kill_every_s: float, burst: int, max_waiting: int, seed: int
) -> dict[str, object]:
    rng = random.Random(seed)
    model_dir, artifacts = tiny_mixtral(WORKDIR, progress=False)
    expected = dict(zip(DEMO_PROMPTS, greedy_texts(model_dir, list(DEMO_PROMPTS), MAX_TOKENS), strict=True))
    manifest = load_manifest(artifacts)
    plan = one_function_per_expert(manifest)
    configs = expert_function_configs(artifacts, plan, EXPERT_ROOT)
    throttled = plan.functions[0].name
    failing = next(f.name for f in plan.functions if f.experts[0] == (manifest.moe_layers[-1], 1))
    configs = [
        replace(
            c,
            task_root=FAULTY_ROOT,
            handler="faulty_expert.handler",
            environment=c.environment | {"FAULT": "raise"},
        )
        if c.name == failing
        else c
        for c in configs
    ]
    latencies: list[float] = []
    outcome = {"ok": 0, "wrong": 0, "incomplete": 0, "status_5xx": 0, "status_other": 0, "errors": 0}
    lock = threading.Lock()

    def start_host() -> LambdaHost:
        host = LambdaHost(configs).start()
        lambda_client(host.endpoint_url).put_function_concurrency(
            FunctionName=throttled, ReservedConcurrentExecutions=0
        )
        return host

    config = BackboneConfig(artifacts, max_batch=8, max_waiting=max_waiting, replan_interval_s=0)
    with running_service(config, 0, start_host) as (server, backbone, host):
        url = f"{server.url}/v1/completions"

        def client(index: int, deadline: float) -> None:
            local = random.Random(seed * 1000 + index)
            with httpx.Client(timeout=120) as http:
                while time.monotonic() < deadline:
                    prompt = local.choice(DEMO_PROMPTS)
                    body = {
                        "model": backbone.model_name,
                        "prompt": prompt,
                        "max_tokens": MAX_TOKENS,
                        "temperature": 0,
                    }
                    started = time.perf_counter()
                    try:
                        response = http.post(url, json=body)
                    except httpx.HTTPError:
                        key = "errors"
                    else:
                        key = _judge(response, expected[prompt])
                    with lock:
                        outcome[key] += 1
                        if key == "ok":
                            latencies.append((time.perf_counter() - started) * 1e3)

        killer = Killer(host, [c.name for c in configs], kill_every_s, rng)
        if kill_every_s > 0:
            killer.start()
        deadline = time.monotonic() + seconds
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(lambda i: client(i, deadline), range(clients)))
        killer.stop.set()
        overload = _overload(url, backbone.model_name, burst)
        stats = {
            name: backbone.stats.get(name) for name in ("retries", "fallbacks", "invoke_errors", "throttles")
        }
        bill = host.meter.snapshot()["totals"]
    served = sum(outcome.values())
    failures = outcome["wrong"] + outcome["incomplete"] + outcome["status_5xx"] + outcome["status_other"]
    failures += outcome["errors"] + overload["hung_or_5xx"]
    return {
        "clients": clients,
        "seconds": seconds,
        "requests": served,
        "outcome": outcome,
        "latency_ms_p50": statistics.median(latencies) if latencies else None,
        "latency_ms_p99": _percentile(latencies, 99),
        "faults": {
            "instances_killed": killer.kills,
            "throttled_function": throttled,
            "failing_function": failing,
            "lambda_throttles": int(bill.get("throttles", 0)),
        },
        "service": stats,
        "overload": overload,
        "failures": failures,
    }


def _judge(response: httpx.Response, expected: str) -> str:
    if response.status_code >= 500:
        return "status_5xx"
    if response.status_code != 200:
        return "status_other"
    choice = response.json()["choices"][0]
    if choice["finish_reason"] not in ("length", "stop"):
        return "incomplete"
    return "ok" if choice["text"] == expected else "wrong"


def _overload(url: str, model: str, burst: int) -> dict[str, int]:
    """``burst`` requests at once: each must end in 200, or 429 with Retry-After, within its timeout."""
    body = {"model": model, "prompt": DEMO_PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0}

    def one(_index: int) -> str:
        try:
            response = httpx.post(url, json=body, timeout=120)
        except httpx.HTTPError:
            return "hung_or_5xx"
        if response.status_code == 200:
            return "ok"
        if response.status_code in (429, 503) and response.headers.get("Retry-After"):
            return "rejected_with_retry_after"
        return "hung_or_5xx"

    with ThreadPoolExecutor(burst) as pool:
        results = list(pool.map(one, range(burst)))
    return {key: results.count(key) for key in ("ok", "rejected_with_retry_after", "hung_or_5xx")} | {
        "sent": burst
    }


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(result: dict) -> str:
    """One paragraph for the README: what was served, what was injected, what failed."""
    outcome, faults, overload, service = (
        result["outcome"],
        result["faults"],
        result["overload"],
        result["service"],
    )
    return (
        f"soak: {result['requests']} requests from {result['clients']} clients in {result['seconds']:.0f} s: "
        f"{outcome['ok']} correct and complete, p50 {result['latency_ms_p50'] or 0:.0f} ms, "
        f"p99 {result['latency_ms_p99'] or 0:.0f} ms; faults: {faults['instances_killed']} instances killed, "
        f"{faults['lambda_throttles']} Lambda throttles, {int(service['invoke_errors'])} function errors -> "
        f"{int(service['retries'])} retries, {int(service['fallbacks'])} in-process fallbacks; "
        f"overload: {overload['sent']} at once -> {overload['ok']} served, "
        f"{overload['rejected_with_retry_after']} 429 with Retry-After, "
        f"{overload['hung_or_5xx']} hung or 5xx; "
        f"failures: {result['failures']}"
    )


COLUMNS = (
    "requests",
    "correct and complete",
    "p50 / p99",
    "instances killed",
    "Lambda throttles",
    "function errors -> retries, in-process fallbacks",
    "overload burst",
    "5xx, hangs, wrong answers",
)


def table(result: dict) -> list[str]:
    """The result as a Markdown table: what was served, what was injected, what failed."""
    faults, overload, service = result["faults"], result["overload"], result["service"]
    p50, p99 = ((result[key] or 0) / 1e3 for key in ("latency_ms_p50", "latency_ms_p99"))
    errors, retries, fallbacks = (int(service[key]) for key in ("invoke_errors", "retries", "fallbacks"))
    burst = (
        f"{overload['sent']} at once -> {overload['ok']} served, "
        f"{overload['rejected_with_retry_after']} x 429 with Retry-After"
    )
    row = (
        result["requests"],
        result["outcome"]["ok"],
        f"{p50:.1f} s / {p99:.1f} s",
        faults["instances_killed"],
        faults["lambda_throttles"],
        f"{errors} -> {retries}, {fallbacks}",
        burst,
        result["failures"],
    )
    return md_table(COLUMNS, [row], "rrrrrrlr")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--kill-every", type=float, default=2.0, help="seconds between instance kills (0: none)"
    )
    parser.add_argument("--burst", type=int, default=48, help="concurrent requests of the overload burst")
    parser.add_argument("--max-waiting", type=int, default=8, help="the service's queue before 429")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the result here as JSON instead of results/soak.md")
    args = parser.parse_args()
    if not 1 <= args.clients <= 64 or not 0 < args.seconds <= 600:
        parser.error("--clients must be 1-64 and --seconds 0-600 (the soak is bounded)")
    result = soak(args.clients, args.seconds, args.kill_every, args.burst, args.max_waiting, args.seed)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    else:
        lines = [
            f"{args.clients} clients for {args.seconds:g} s against the local endpoint, one function per "
            f"expert of a tiny Mixtral; an instance SIGKILLed every {args.kill_every:g} s, one function "
            "throttled (reserved concurrency 0), one failing every invoke; every answer checked complete and "
            f"token-identical to the unsplit model's. Then {args.burst} requests at once against a queue of "
            f"{args.max_waiting}.",
            "",
            *table(result),
        ]
        print("\n".join(lines))
        write_result("soak", "faults and overload against the local endpoint", lines)
    print(f"\n{summary(result)}", file=sys.stderr)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
