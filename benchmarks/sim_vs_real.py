"""The simulator checked against the real thing: one burst pattern through the local stack and through
``moeless.simulation.simulator.Simulator`` with the local constants.

Usage:
    .venv/bin/python benchmarks/sim_vs_real.py                 # 150 s of bursty:0.6:1.8:60
    .venv/bin/python benchmarks/sim_vs_real.py --quick         # 75 s of it
    .venv/bin/python benchmarks/sim_vs_real.py --plan tiered   # with host-tier experts

Model: the demo's tiny Mixtral (4 layers x 8 experts, hidden 128, ``benchmarks/common.py``), one
function per expert (``--plan functions``), or the three experts of each layer that the prompts
route the most tokens to in the backbone host's RAM and the rest as functions (``--plan tiered``),
on the local Lambda host in this process (awslambdaric instances, boto3 invokes), the backbone and
its host experts on this machine's CPU. Pre-warming and re-planning are off on both sides.
In the same run, in this order:

 1. calibration, each figure measured here, none fitted to the answer:
    * the backbone: the split model with in-process experts times a prefill forward and batched
      decode forwards of 1..16 sequences; the experts' own time is subtracted, and the rest is
      fitted as ``a + b x tokens`` per forward (a: per-forward overhead, b: per token);
    * the cold start: an instance of one expert function cold-started a few times on a separate
      host (cold round trip - warm round trip, median);
    * the host tier: the service's dispatcher running 1..4 in-process experts of one row (each
      further expert's time is the host's per-call overhead);
 2. the real run: every arrival of the pattern is a streamed greedy HTTP completion fired at its
    timestamp by its own client thread; per request: arrival, first token, finish, usage; from
    the service's ServingStats: invokes and cold starts on the request path and the raw time of
    every MoE layer's dispatch;
 3. the routing the real run used: ``moeless.prediction.trace.profile`` on the same prompts and
    max_tokens (greedy: the same tokens), replayed per request by ``RecordedRouting``;
 4. the simulation: the same arrivals, each request's real prompt and output length, the plan that
    was served, ``CostModel(aws=False)`` with the cold start of step 1, the backbone of step 1 as a
    ``GpuModel``/``Hardware``, this machine as the ``HostModel`` (2 vCPUs at the cost model's
    per-vCPU figures, the per-call overhead of step 1), the host's idle timeout.

It prints both sides and the simulator's signed relative error; the last line reads
``sim vs real: invokes E%, cold starts E%, layer p50 E%, layer p99 E%, request p50 E%, request p99 E%``.
Writes benchmarks/results/sim_vs_real.md (``--plan tiered``: sim_vs_real_tiered.md).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from common import load_prompts, md_table, tiny_mixtral, write_result

from backbone_service.local import running_service
from moeless.contracts.environment import DEFAULT_DRAFT_CONFIDENCE
from moeless.contracts.manifest import Manifest, load_manifest
from moeless.contracts.plan import Placement, Plan, one_function_per_expert
from moeless.demo.prompts import DEMO_PROMPTS
from moeless.lambda_host import LambdaHost
from moeless.lambda_host.client import lambda_client
from moeless.lambda_host.experts import expert_function_configs, start_expert_host
from moeless.planning.cost_model import CostModel, ExpertShape
from moeless.serving.backbone import BackboneConfig
from moeless.simulation.arrivals import arrival_times
from moeless.simulation.host import HostModel
from moeless.simulation.roofline import Hardware, Roofline
from moeless.simulation.routing import RecordedRouting
from moeless.simulation.simulator import GpuModel, PolicyResult, Request, Simulator
from moeless.simulation.speculation import Acceptance

REPO = Path(__file__).resolve().parent.parent
WORKDIR = REPO / ".moeless" / "bench" / "serve-mixtral"
SHARED_PROMPTS = REPO.parent / "shared" / "data" / "prompts" / "dev.jsonl"
EXPERT_ROOT = REPO / "functions" / "expert"
PATTERN = "bursty:0.6:1.8:60"  # 36 s at 1.08/s, then 30 s at 0.12/s, every minute
MAX_TOKENS = 16
MAX_BATCH = 16
IDLE_TIMEOUT_S = 20.0  # host and simulator: short enough that the quiet half-minutes cool experts down


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


# --- 1. calibration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BackboneFit:
    """The backbone's own time per forward (experts excluded): ``overhead_ms + per_token_ms x tokens``."""

    overhead_ms: float
    per_token_ms: float
    points: list[tuple[str, int, float]]  # (kind, tokens, ms)
    step_ms: float = 0.0  # the engine's own work per step beyond its forwards ...
    sequence_ms: float = 0.0  # ... and per sequence of the step


class _TimedExperts:
    """An expert executor that runs onnxruntime in-process and adds up the time it took."""

    def __init__(self, artifacts: Path, manifest: Manifest) -> None:
        from moeless.experts.runtime import OnnxExpertPool

        self.pool = OnnxExpertPool(artifacts, manifest)
        self.seconds = 0.0

    def run(self, layer: int, inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        started = time.perf_counter()
        try:
            return self.pool.run(layer, inputs)
        finally:
            self.seconds += time.perf_counter() - started


def measure_backbone(
    artifacts: Path, manifest: Manifest, prompts: list[str], repeats: int = 15
) -> BackboneFit:
    """Time the split model's forwards on this CPU with in-process experts, minus the experts:
    prefills of a short, the median and the longest prompt, decodes of 1..16 sequences at the
    median prompt's context, in turn (so that the machine's noise hits every case alike)."""
    import copy

    import torch
    from transformers import AutoTokenizer

    from moeless.model.split import load_split_model

    experts = _TimedExperts(artifacts, manifest)
    model = load_split_model(artifacts, experts, manifest)
    tokenizer = AutoTokenizer.from_pretrained(artifacts / "backbone", local_files_only=True)
    lengths = sorted(len(tokenizer(p)["input_ids"]) for p in prompts)
    context = lengths[len(lengths) // 2]
    generator = torch.Generator().manual_seed(0)

    def ids(batch: int, tokens: int) -> Any:
        return torch.randint(2, int(model.config.vocab_size), (batch, tokens), generator=generator)

    cases: list[tuple[str, int, Any, Any]] = [
        ("prefill", n, ids(1, n), None) for n in sorted({8, context, lengths[-1]})
    ]
    for batch in (1, 2, 4, 8, 16):
        with torch.inference_mode():
            past = model(input_ids=ids(batch, context), use_cache=True, logits_to_keep=1).past_key_values
        cases.append(("decode", batch, ids(batch, 1), past))
    samples: dict[int, list[float]] = {n: [] for n in range(len(cases))}
    for _ in range(repeats):
        for n, (_, _, inputs, past) in enumerate(cases):
            cache = copy.deepcopy(past) if past is not None else None
            experts.seconds = 0.0
            started = time.perf_counter()
            with torch.inference_mode():
                model(input_ids=inputs, past_key_values=cache, use_cache=True, logits_to_keep=1)
            samples[n].append((time.perf_counter() - started - experts.seconds) * 1e3)
    points = [(kind, tokens, statistics.median(samples[n])) for n, (kind, tokens, _, _) in enumerate(cases)]
    per_token, overhead = np.polyfit([t for _, t, _ in points], [m for _, _, m in points], 1)
    return BackboneFit(float(overhead), float(max(per_token, 0.0)), points)


@dataclass(frozen=True)
class InvokeFit:
    """The local host's invokes, measured: a cold start's penalty over a warm round trip, and
    ``n`` concurrent warm invokes (one layer's) taking ``single_ms + serial_ms x (n - 1)``."""

    cold_start_ms: float
    single_ms: float
    serial_ms: float
    cold_serial_ms: float  # how much later each further concurrent cold start ends
    spread: float  # sigma of log(ms / median) of the concurrent warm invokes of a layer
    points: list[tuple[int, float]]  # (concurrent invokes, ms)
    cold_points: list[tuple[int, float]]  # (concurrent cold starts, ms)


def measure_invokes(artifacts: Path, plan: Plan, tokens: int = 4, repeats: int = 25) -> InvokeFit:
    """One layer's functions on a separate local host in this process (as the service's), invoked
    by the service's own dispatcher (payload encoding, boto3, the host, decoding: the whole path)."""
    from moeless.serving.dispatch import LambdaDispatcher

    manifest = load_manifest(artifacts)
    layer = plan.functions[0].experts[0][0]
    specs = [f for f in plan.functions if f.experts[0][0] == layer]
    experts = [f.experts[0][1] for f in specs]
    configs = expert_function_configs(artifacts, replace(plan, functions=specs), EXPERT_ROOT)
    rows = np.random.default_rng(0).standard_normal((tokens, manifest.hidden_size), dtype=np.float32)
    with LambdaHost(configs, idle_timeout_s=600) as host:
        client = lambda_client(host.endpoint_url, max_pool_connections=64)
        dispatcher = LambdaDispatcher(artifacts, manifest, plan, client, qualifier=None)

        def timed(count: int) -> float:
            started = time.perf_counter()
            dispatcher.run(layer, dict.fromkeys(experts[:count], rows))
            return (time.perf_counter() - started) * 1e3

        def evict(count: int) -> None:
            for spec in specs[:count]:
                for instance in list(host.pools[spec.name].instances):
                    host.pools[spec.name].evict(instance)
                    instance.process.wait()

        try:
            cold = []
            for _ in range(4):
                evict(1)
                cold.append(timed(1) - statistics.median(timed(1) for _ in range(5)))
            cold_points = []
            for _ in range(2):
                for n in (2, len(specs)):
                    evict(n)
                    cold_points.append((n, timed(n)))
            timed(len(specs))
            points = []
            for _ in range(repeats):  # interleaved, so that the machine's noise hits every n alike
                for n in (1, 2, 4, len(specs)):
                    points.append((n, timed(n)))
        finally:
            dispatcher.close()
    medians = [
        (n, statistics.median(ms for k, ms in points if k == n)) for n in sorted({n for n, _ in points})
    ]
    spread = float(np.std([math.log(ms / dict(medians)[n]) for n, ms in points if n > 1]))
    slope, _ = np.polyfit([n - 1 for n, _ in medians], [ms for _, ms in medians], 1)
    colds = [
        (n, statistics.median(ms for k, ms in cold_points if k == n))
        for n in sorted({n for n, _ in cold_points})
    ]
    (n2, ms2), (n8, ms8) = colds
    cold_slope = (ms8 - ms2) / (n8 - n2)
    return InvokeFit(
        statistics.median(cold),
        medians[0][1],
        float(max(slope, 0.0)),
        float(max(cold_slope, 0.0)),
        spread,
        medians,
        colds,
    )


def measure_host(artifacts: Path, plan: Plan, repeats: int = 200) -> float:
    """The host's per-call overhead, ms: the service's dispatcher running 1..4 of the plan's
    in-process experts of one layer at one row each (its jobs on its threads, as in a step); the
    slope of the median time against the experts."""
    from moeless.serving.dispatch import LambdaDispatcher

    manifest = load_manifest(artifacts)
    layer = manifest.moe_layers[0]
    local = [expert for lay, expert in plan.in_process() if lay == layer] or [0]
    rows = np.random.default_rng(0).standard_normal((1, manifest.hidden_size), dtype=np.float32)
    dispatcher = LambdaDispatcher(artifacts, manifest, plan, client=None, qualifier=None)
    try:
        counts = list(range(1, len(local) + 1))
        samples: dict[int, list[float]] = {n: [] for n in counts}
        for _ in range(repeats):
            for n in counts:
                started = time.perf_counter()
                dispatcher.run(layer, dict.fromkeys(local[:n], rows))
                samples[n].append((time.perf_counter() - started) * 1e3)
    finally:
        dispatcher.close()
    medians = [statistics.median(samples[n]) for n in counts]
    if len(counts) == 1:
        return medians[0]
    slope, _ = np.polyfit(counts, medians, 1)
    return float(max(slope, 0.0))


def tiered_plan(manifest: Manifest, routing: RecordedRouting, per_layer: int = 3) -> Plan:
    """The ``per_layer`` experts of each layer that ``routing`` sends the most tokens to in the
    backbone host's RAM (``host``), the others each in its own function."""
    plan = one_function_per_expert(manifest)
    loads = routing.loads()
    hot = {(layer, int(e)) for layer, load in loads.layers.items() for e in np.argsort(-load)[:per_layer]}
    for placement in plan.experts:
        if (placement.layer, placement.expert) in hot:
            placement.placement, placement.function = Placement.HOST, None
    plan.functions = [f for f in plan.functions if tuple(f.experts[0]) not in hot]
    plan.policy = "tiered"
    return plan


# --- 2. the real run ----------------------------------------------------------------------------


@dataclass
class Served:
    """One real request as the client saw it (seconds since the run's start)."""

    index: int
    arrival_s: float
    sent_s: float = 0.0
    first_token_s: float = float("nan")
    finish_s: float = float("nan")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    text: str = ""


@dataclass
class RealRun:
    requests: list[Served]
    invokes: int
    cold_starts: int
    prewarm_invokes: int
    layer_ms: list[float]
    layer_invokes: list[int]
    layer_cold: list[bool]
    steps: list[tuple[float, int, int, int]]
    step_dispatch: list[float]
    counters: dict[str, float]
    lambda_usd: float = 0.0  # what the local host's meter bills for the run


def client(
    url: str, model: str, times: list[float], prompts: list[str], start: float, max_tokens: int = MAX_TOKENS
) -> list[Served]:
    """Each request in its own thread, sent at ``start + times[n]`` (``time.monotonic``), streamed."""
    records = [Served(n, t) for n, t in enumerate(times)]

    def one(record: Served) -> None:
        body = {
            "model": model,
            "prompt": prompts[record.index],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        record.sent_s = time.monotonic() - start
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as response:
                for line in response.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    for choice in chunk.get("choices") or []:
                        if choice.get("text") and math.isnan(record.first_token_s):
                            record.first_token_s = time.monotonic() - start
                        record.text += choice.get("text") or ""
                        record.finish_reason = choice.get("finish_reason") or record.finish_reason
                    if chunk.get("usage"):
                        record.prompt_tokens = int(chunk["usage"]["prompt_tokens"])
                        record.completion_tokens = int(chunk["usage"]["completion_tokens"])
            record.finish_s = time.monotonic() - start
        except Exception as exc:  # a failed request is reported, not hidden
            record.error = f"{type(exc).__name__}: {exc}"

    threads = []
    for record in records:
        delay = start + record.arrival_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        thread = threading.Thread(target=one, args=(record,), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return records


def fire_requests(
    url: str, model: str, times: np.ndarray, prompts: list[str], max_tokens: int = MAX_TOKENS
) -> list[Served]:
    """Run :func:`client` in a child process: clients are not part of the service, and their
    threads (parsing every streamed chunk) would otherwise share its interpreter lock."""
    start = time.monotonic() + 5.0  # the child's start-up must not delay the first arrival
    times_s = [float(t) for t in times]
    job = {
        "url": url,
        "model": model,
        "times": times_s,
        "prompts": prompts,
        "start": start,
        "max_tokens": max_tokens,
    }
    here = Path(__file__).resolve().parent
    done = subprocess.run(
        [sys.executable, str(here / "sim_vs_real.py"), "--client"],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        check=True,
        cwd=here,
    )
    return [Served(**row) for row in json.loads(done.stdout)]


def real_run(
    artifacts: Path,
    plan: Plan,
    times: np.ndarray,
    prompts: list[str],
    idle_timeout_s: float = IDLE_TIMEOUT_S,
    max_tokens: int = MAX_TOKENS,
    speculate: int = 0,
    draft_model: Path | None = None,
    draft_confidence: float = DEFAULT_DRAFT_CONFIDENCE,
) -> RealRun:
    """Fire a streamed completion at each arrival time through the local service (with ``speculate``
    drafts per sequence: prompt lookup, or ``draft_model``'s); collect everything."""
    plan_path = WORKDIR / f"plan-{plan.policy}.json"
    plan.save(plan_path)
    config = BackboneConfig(
        artifacts,
        plan=plan_path,
        device="cpu",
        max_batch=MAX_BATCH,
        replan_interval_s=0,
        predictor_trace=None,
        speculate=speculate,
        draft_model=draft_model,
        draft_confidence=draft_confidence,
    )

    def start_host() -> LambdaHost:
        return start_expert_host(artifacts, plan, EXPERT_ROOT, idle_timeout_s=idle_timeout_s)

    with ExitStack() as stack:
        server, backbone, host = stack.enter_context(running_service(config, 0, start_host))
        layer_ms: list[float] = []
        observe = backbone.stats.observe_dispatch

        def observe_raw(layer: int, seconds: float) -> None:  # the histogram's buckets are too coarse
            layer_ms.append(seconds * 1e3)
            observe(layer, seconds)

        setattr(backbone.stats, "observe_dispatch", observe_raw)  # noqa: B010 (an instance's method)
        layer_invokes: list[int] = []  # per dispatch: the experts it invoked (host ones not counted)
        on_functions = backbone.dispatcher.replicas
        run = backbone.dispatcher.run

        layer_cold: list[bool] = []  # per dispatch: did it cold-start an instance
        in_step = [0.0]  # dispatch ms of the step in progress

        def run_counted(layer: int, inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
            layer_invokes.append(sum((layer, expert) in on_functions for expert in inputs))
            colds = backbone.stats.get("cold_starts")
            started = time.perf_counter()
            try:
                return run(layer, inputs)
            finally:
                in_step[0] += (time.perf_counter() - started) * 1e3
                layer_cold.append(backbone.stats.get("cold_starts") > colds)

        setattr(backbone.dispatcher, "run", run_counted)  # noqa: B010
        steps: list[tuple[float, int, int, int]] = []  # per engine step: ms, prefills, tokens, sequences
        step_dispatch: list[float] = []  # per engine step: ms in its dispatches
        step = backbone.engine._step

        def step_timed(batch: list[Any]) -> None:
            prefills = [s for s in batch if not s.generated and s.cache is None]
            tokens = sum(len(s.prompt_ids) for s in prefills) + len(batch) - len(prefills)
            in_step[0] = 0.0
            started = time.perf_counter()
            step(batch)
            steps.append(((time.perf_counter() - started) * 1e3, len(prefills), tokens, len(batch)))
            step_dispatch.append(in_step[0])

        setattr(backbone.engine, "_step", step_timed)  # noqa: B010
        before = backbone.stats.snapshot()["counters"]
        assert isinstance(before, dict)

        def billed_usd() -> float:
            return host.meter.snapshot()["totals"].get("cost_usd", 0.0) if host else 0.0

        billed = billed_usd()
        records = fire_requests(server.url, backbone.model_name, times, prompts, max_tokens)
        after = backbone.stats.snapshot()["counters"]
        assert isinstance(after, dict)
        billed = billed_usd() - billed

    def delta(name: str) -> int:
        return int(after.get(name, 0) - before.get(name, 0))

    return RealRun(
        records,
        delta("invokes"),
        delta("cold_starts"),
        delta("prewarm_invokes"),
        layer_ms,
        layer_invokes,
        layer_cold,
        steps,
        step_dispatch,
        {k: after[k] - before.get(k, 0) for k in sorted(after)},
        billed,
    )


def measure_service(artifacts: Path, plan: Plan, fit: BackboneFit) -> tuple[BackboneFit, InvokeFit]:
    """The service's own constants, measured on the whole local stack under a calibration load of
    its own (the demo prompts, 4 closely spaced groups of 1, 2, 4 and 8 requests, after one
    request per prompt has warmed the functions): warm MoE layers' dispatch time against their
    invokes (``single + serial x (n - 1)``, and the spread), and the engine's time per step
    beyond dispatches and its forwards (as ``fit`` prices them) against its sequences."""
    prompts = list(DEMO_PROMPTS)
    times = [0.0] * 4 + [3.0]  # warm-up: most experts get an instance
    for group, start in zip((1, 2, 4, 8), (6.0, 8.0, 10.5, 13.5), strict=True):
        times += [start + 0.05 * n for n in range(group)]
    run = real_run(
        artifacts, plan, np.asarray(times), [prompts[n % len(prompts)] for n in range(len(times))], 600
    )
    warm = [
        (n, ms)
        for n, ms, cold in zip(run.layer_invokes, run.layer_ms, run.layer_cold, strict=False)
        if not cold and n > 0  # (a layer of host experts alone invokes nothing)
    ][len(run.layer_ms) // 4 :]  # the warm-up's layers left out
    counts = sorted({n for n, _ in warm})
    medians = {n: statistics.median(ms for k, ms in warm if k == n) for n in counts}
    weights = [sum(1 for k, _ in warm if k == n) for n in counts]
    slope, intercept = np.polyfit(
        [n - 1 for n in counts], [medians[n] for n in counts], 1, w=np.sqrt(weights)
    )
    spread = float(np.std([math.log(ms / medians[n]) for n, ms in warm]))
    rest = [
        (n, ms - dispatch - (p + (1 if n > p else 0)) * fit.overhead_ms - tokens * fit.per_token_ms)
        for (ms, p, tokens, n), dispatch in zip(run.steps, run.step_dispatch, strict=True)
    ]
    per_sequence, per_step = np.polyfit([n for n, _ in rest], [ms for _, ms in rest], 1)
    service = replace(fit, step_ms=float(max(per_step, 0.0)), sequence_ms=float(max(per_sequence, 0.0)))
    invokes = InvokeFit(
        0.0, float(intercept), float(max(slope, 0.0)), 0.0, spread, sorted(medians.items()), []
    )
    return service, invokes


def calibrate(
    artifacts: Path, manifest: Manifest, prompts: list[str], plan: Plan, calibration_plan: Plan, when: str
) -> tuple[BackboneFit, InvokeFit]:
    """Step 1: the backbone, the invokes (cold on ``calibration_plan``) and the service on ``plan``."""
    fit = measure_backbone(artifacts, manifest, prompts)
    cold = measure_invokes(artifacts, calibration_plan)
    # the service's invokes, on the plan served: a tiered plan's layers of one invoke beside
    # host experts are common, a plan of functions alone has none (top-2: two or more)
    fit, warm = measure_service(artifacts, plan, fit)
    invokes = replace(
        warm,
        cold_start_ms=cold.cold_start_ms,
        cold_serial_ms=cold.cold_serial_ms,
        cold_points=cold.cold_points,
    )
    print(
        f"{when}: backbone (experts excluded) {fit.overhead_ms:.2f} ms per forward + "
        f"{fit.per_token_ms * 1e3:.1f} us per token ["
        + ", ".join(f"{k} {t}: {m:.2f}" for k, t, m in fit.points)
        + f"]; engine beyond forwards {fit.step_ms:.2f} ms per step + {fit.sequence_ms:.2f} ms per "
        f"sequence; invokes: cold start {invokes.cold_start_ms:.0f} ms over a warm round trip, each "
        f"further concurrent one {invokes.cold_serial_ms:.0f} ms later ["
        + ", ".join(f"{n}: {ms:.0f}" for n, ms in invokes.cold_points)
        + f"]; in the service, a warm layer of n invokes {invokes.single_ms:.2f} + "
        f"{invokes.serial_ms:.2f} x (n - 1) ms, spread {invokes.spread:.2f} ["
        + ", ".join(f"{n}: {ms:.2f}" for n, ms in invokes.points)
        + "]",
        flush=True,
    )
    return fit, invokes


# --- 3. and 4. the routing and the simulation ----------------------------------------------------


def recorded_routing(
    model_dir: Path, prompts: list[str], out_dir: Path, max_tokens: int = MAX_TOKENS
) -> RecordedRouting:
    from moeless.prediction.trace import load_trace, profile

    profile(model_dir, prompts, out_dir, max_new_tokens=max_tokens, progress=False)
    return RecordedRouting.from_trace(load_trace(out_dir))


def simulate(
    manifest: Manifest,
    plan: Plan,
    routing: RecordedRouting,
    real: RealRun,
    fit: BackboneFit,
    invokes: InvokeFit,
    duration_s: float,
    host_call_ms: float,
    speculate: int = 0,
    acceptance: Acceptance | None = None,
) -> PolicyResult:
    hidden, inter = manifest.hidden_size, manifest.intermediate_size
    weight_bytes = 3 * hidden * inter * 4.0
    model = CostModel(aws=False)
    # measured here: the cold start (as the model's base; its per-MB session init is kept), the
    # warm round trip of one invoke (as its overhead) and how far apart concurrent invokes leave
    model = replace(
        model,
        cold_start_base_ms=invokes.cold_start_ms - model.cold_start_ms_per_mb * weight_bytes / 1e6,
        invoke_overhead_ms_local=invokes.single_ms - model.invoke_ms(4, hidden) + model.invoke_overhead_ms,
        invoke_serial_ms_local=invokes.serial_ms,
        cold_start_serial_ms_local=invokes.cold_serial_ms,
        invoke_spread_local=invokes.spread,
    )
    # the measured backbone as a roofline: FLOPs at the per-token slope, bytes never the bound
    blocks = manifest.num_layers
    dense_params = 1e6  # any value: the roofline's FLOP rate below is set from it and the slope
    tflops = 2 * dense_params / (fit.per_token_ms * 1e-3 * 1e12 * 0.5) if fit.per_token_ms > 0 else 1e9
    gpu = GpuModel(
        blocks=blocks,
        dense_bytes=0.0,
        dense_params=dense_params,
        kv_bytes_per_token=0.0,
        attention_flops=0.0,
        expert_bytes=0.0,
        expert_params=3 * hidden * inter,
        step_overhead_ms=fit.step_ms,
        sequence_overhead_ms=fit.sequence_ms,
    )
    hardware = Hardware(
        "this machine's CPU",
        0.0,
        Roofline(
            hbm_gbps=1e9, tflops=tflops, compute_efficiency=0.5, block_overhead_ms=fit.overhead_ms / blocks
        ),
    )
    requests = []
    for record in real.requests:
        # a request that stopped at EOS ran one forward more than its completion tokens say
        output = record.completion_tokens + (1 if record.finish_reason == "stop" else 0)
        requests.append(Request(record.arrival_s, record.prompt_tokens, max(1, output), record.index))
    simulator = Simulator(
        plan,
        routing,
        ExpertShape(hidden, inter, weight_bytes),
        model,
        gpu,
        hardware,
        max_batch=MAX_BATCH,
        idle_timeout_s=IDLE_TIMEOUT_S,
        timeline=False,
        host=HostModel(2, 2 * model.mem_gbps_per_vcpu, model.gflops_per_vcpu, host_call_ms),
        speculate=speculate,
        acceptance=acceptance,
    )
    return simulator.run(requests, duration_s)


# --- the report ---------------------------------------------------------------------------------


def signed(sim: float, real: float) -> str:
    if real == 0:
        return "+0.0%" if sim == 0 else "+inf%"
    return f"{(sim - real) / real * 100:+.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="75 s of the pattern instead of 150 s")
    parser.add_argument("--pattern", default=PATTERN, help=f"arrival process (default {PATTERN})")
    parser.add_argument("--duration", type=float, default=None, help="seconds of arrivals")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--plan", choices=("functions", "tiered"), default="functions", help="the plan served (see above)"
    )
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.client:
        job = json.load(sys.stdin)
        rows = client(job["url"], job["model"], job["times"], job["prompts"], job["start"], job["max_tokens"])
        json.dump([asdict(row) for row in rows], sys.stdout)
        return
    import torch

    # one backbone thread (calibration and service alike): on 2 cores shared by the client, the
    # host and the instances, a second torch thread only spins and makes every forward erratic
    torch.set_num_threads(1)
    duration = args.duration or (75.0 if args.quick else 150.0)
    times = arrival_times(args.pattern, duration, np.random.default_rng(args.seed))
    prompts = load_prompts(len(times))
    model_dir, artifacts = tiny_mixtral(WORKDIR)
    manifest = load_manifest(artifacts)
    # 3. (first: the tiered plan is chosen from it) the routing the prompts take, greedy
    routing = recorded_routing(model_dir, prompts, WORKDIR / "sim-vs-real-trace")
    calibration_plan = one_function_per_expert(manifest)  # invokes are calibrated on it
    plan = tiered_plan(manifest, routing) if args.plan == "tiered" else calibration_plan
    print(
        f"arrivals: {args.pattern} for {duration:g} s ({len(times)} requests); prompts: "
        f"{'../shared/data/prompts/dev.jsonl' if SHARED_PROMPTS.is_file() else 'demo prompts'}; "
        f"max_tokens {MAX_TOKENS}, greedy; max batch {MAX_BATCH}; idle timeout {IDLE_TIMEOUT_S:g} s; "
        f"plan {plan.policy} ({len(plan.functions)} functions, {len(plan.in_process())} experts on the "
        "host); no pre-warming, no re-planning",
        flush=True,
    )

    # 1. calibration, before and after the real run (the machine is shared: its load drifts)
    before = calibrate(artifacts, manifest, prompts, plan, calibration_plan, "calibration before")
    host_call_ms = measure_host(artifacts, plan) if plan.in_process() else 0.0
    print(f"host tier: {host_call_ms:.3f} ms per in-process expert call", flush=True)

    # 2. the real run
    wall = time.perf_counter()
    real = real_run(artifacts, plan, times, prompts)
    failed = [r for r in real.requests if r.error or np.isnan(r.finish_s)]
    print(
        f"real run: {time.perf_counter() - wall:.0f} s, {len(real.requests) - len(failed)} requests served, "
        f"{len(failed)} failed; counters {json.dumps({k: int(v) for k, v in real.counters.items()})}",
        flush=True,
    )
    for record in failed[:3]:
        print(f"  request {record.index} failed: {record.error}")
    after = calibrate(artifacts, manifest, prompts, plan, calibration_plan, "calibration after")
    fit = BackboneFit(
        (before[0].overhead_ms + after[0].overhead_ms) / 2,
        (before[0].per_token_ms + after[0].per_token_ms) / 2,
        before[0].points + after[0].points,
        (before[0].step_ms + after[0].step_ms) / 2,
        (before[0].sequence_ms + after[0].sequence_ms) / 2,
    )
    invokes = InvokeFit(
        *(
            (getattr(before[1], name) + getattr(after[1], name)) / 2
            for name in ("cold_start_ms", "single_ms", "serial_ms", "cold_serial_ms", "spread")
        ),
        before[1].points + after[1].points,
        before[1].cold_points + after[1].cold_points,
    )
    print(
        f"simulator's constants (mean of both): backbone {fit.overhead_ms:.2f} ms per forward + "
        f"{fit.per_token_ms * 1e3:.1f} us per token, engine {fit.step_ms:.2f} ms per step + "
        f"{fit.sequence_ms:.2f} ms per sequence; cold start {invokes.cold_start_ms:.0f} ms + "
        f"{invokes.cold_serial_ms:.0f} ms per other one initialising; a layer's n invokes "
        f"{invokes.single_ms:.2f} + {invokes.serial_ms:.2f} x (n - 1) ms, spread {invokes.spread:.2f}"
    )
    step_s = sum(ms for ms, *_ in real.steps) / 1e3
    forwards = sum(p + (1 if n > p else 0) for _, p, _, n in real.steps)
    dense_s = (
        forwards * fit.overhead_ms
        + sum(t for _, _, t, _ in real.steps) * fit.per_token_ms
        + len(real.steps) * fit.step_ms
        + sum(n for *_, n in real.steps) * fit.sequence_ms
    ) / 1e3
    print(
        f"real steps: {len(real.steps)} ({forwards} forwards), {step_s:.1f} s in steps: dispatch "
        f"{sum(real.layer_ms) / 1e3:.1f} s, backbone and engine (as calibrated) {dense_s:.1f} s, rest "
        f"{step_s - sum(real.layer_ms) / 1e3 - dense_s:.1f} s"
    )
    by_count: dict[int, list[float]] = {}
    for n, ms in zip(real.layer_invokes, real.layer_ms, strict=False):
        by_count.setdefault(n, []).append(ms)
    print(
        "real MoE layer ms by invokes (median, count): "
        + ", ".join(f"{n}: {statistics.median(v):.1f} ({len(v)})" for n, v in sorted(by_count.items()))
    )

    # 4. (the routing: above)
    mismatched = [
        r.index for r in real.requests if r.prompt_tokens and routing.lengths[r.index][0] != r.prompt_tokens
    ]
    if mismatched:
        print(f"warning: {len(mismatched)} prompts tokenised differently by the profile ({mismatched[:5]})")
    sim = simulate(manifest, plan, routing, real, fit, invokes, duration, host_call_ms)

    qs = (50, 75, 90, 95, 98, 99, 99.5)
    print("MoE layer ms at " + "/".join(f"p{q:g}" for q in qs))
    print("  real: " + " ".join(f"{pct(real.layer_ms, q):.1f}" for q in qs))
    print("  sim:  " + " ".join(f"{pct(sim.layer_latency_ms, q):.1f}" for q in qs))
    served = [r for r in real.requests if r not in failed]
    real_latency = [(r.finish_s - r.arrival_s) * 1e3 for r in served]
    real_ttft = [(r.first_token_s - r.arrival_s) * 1e3 for r in served if not np.isnan(r.first_token_s)]
    rows = [
        ("invokes", float(real.invokes), float(sim.invokes), "{:.0f}"),
        ("cold starts (request path)", float(real.cold_starts), float(sim.cold_starts), "{:.0f}"),
        ("MoE layer p50 ms", pct(real.layer_ms, 50), pct(sim.layer_latency_ms, 50), "{:.2f}"),
        ("MoE layer p99 ms", pct(real.layer_ms, 99), pct(sim.layer_latency_ms, 99), "{:.2f}"),
        ("request p50 ms", pct(real_latency, 50), pct(sim.request_latency_ms, 50), "{:.0f}"),
        ("request p99 ms", pct(real_latency, 99), pct(sim.request_latency_ms, 99), "{:.0f}"),
    ]
    extra = [
        ("MoE layers (dispatches)", float(len(real.layer_ms)), float(len(sim.layer_latency_ms)), "{:.0f}"),
        ("TTFT p50 ms (info)", pct(real_ttft, 50), pct(sim.ttft_ms, 50), "{:.0f}"),
        ("TTFT p99 ms (info)", pct(real_ttft, 99), pct(sim.ttft_ms, 99), "{:.0f}"),
    ]
    print(f"\n{'':28} {'real':>10} {'simulated':>10} {'error':>8}")
    for name, r, s, fmt in rows + extra:
        print(f"{name:28} {fmt.format(r):>10} {fmt.format(s):>10} {signed(s, r):>8}")
    verdict = "sim vs real: " + ", ".join(
        f"{label} {signed(s, r)}"
        for label, (_, r, s, _) in zip(
            ("invokes", "cold starts", "layer p50", "layer p99", "request p50", "request p99"),
            rows,
            strict=True,
        )
    )
    print(verdict)
    if args.plan == "tiered":
        name, title = "sim_vs_real_tiered", "the simulator against the local stack, host-tier experts"
        served = (
            f"{len(plan.in_process())} experts on the backbone's host (the three of each layer the prompts "
            f"route the most tokens to), {len(plan.functions)} functions; measured host per-call overhead "
            f"{host_call_ms:.3f} ms"
        )
    else:
        name, title = "sim_vs_real", "the simulator against the local stack"
        served = f"one function per expert ({len(plan.functions)} functions)"
    lines = [
        f"Plan: {served}; arrivals {args.pattern} for {duration:g} s ({len(times)} requests), max_tokens "
        f"{MAX_TOKENS}, greedy. Each figure of the simulator's constants is measured in the same run, none "
        "fitted to the answer. Goal: invokes and cold starts within 10%, latencies within 25%.",
        "",
        *md_table(
            ("", "real", "simulated", "error"),
            ((label, fmt.format(r), fmt.format(s), signed(s, r)) for label, r, s, fmt in rows + extra),
        ),
        "",
        verdict,
    ]
    write_result(name, title, lines)


if __name__ == "__main__":
    main()
