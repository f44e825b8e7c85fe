"""Replay requests through a serving policy: MoE-layer latency, cold starts and cost.

A discrete-event simulation. Requests arrive by a process (Poisson, bursty on/off, or given
times); each runs a prefill step (its prompt tokens) and then one decode step per output token; a
step passes every MoE layer in turn. At a layer the step's tokens are routed (from the trace's
recorded routing, or sampled from the loads' per-layer shares); each needed expert's tokens are
split evenly over its replicas, and each piece is served where the policy put it:

* a **function** replica: an idle instance of that function (warm), else a new one after a cold
  start; an instance serves one invoke at a time and idles out after ``idle_timeout_s``;
  provisioned instances never idle out and never cold-start. Time = invoke overhead + compute at
  the function's vCPUs (``CostModel``).
* a **worker** (serverful expert parallelism): the GPU worker serves its pieces in turn, so a busy
  worker queues them. Time = GPU compute.
* the **backbone** (Remoe's resident experts): GPU compute, no invoke.

The layer's latency is when its last piece finishes; the step's tokens then move to the next
layer. Events are processed in time order across all requests, so instances and workers are shared
exactly as they would be. Costs: Lambda requests, billed duration (init included on cold starts),
provisioned GB-s for the simulated time, and the GPUs kept up (the backbone for serverless
policies; the W workers for serverful ones), all from :class:`~moeless.planning.cost_model.CostModel`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from moeless.contracts.loads import Loads, shares
from moeless.contracts.plan import Placement, Plan, Policy
from moeless.errors import SimulationError
from moeless.planning.cost_model import CostModel, ExpertShape

IDLE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Request:
    """One request: arrival time and, per step, per layer index, the tokens routed to each expert."""

    arrival_s: float
    steps: list[list[dict[int, int]]]  # steps[s][layer index] -> {expert: tokens}


def arrivals(process: str, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times in [0, duration): ``poisson:RATE``, ``bursty:RATE:PEAK:PERIOD`` (on/off: half of
    each period at PEAK x RATE, the other half at the rate that keeps the mean at RATE, floored at 0),
    or ``timestamps:FILE`` (recorded arrival times in seconds, one per line)."""
    kind, _, spec = process.partition(":")
    if kind == "timestamps" and spec:
        try:
            times = np.sort(np.loadtxt(spec, ndmin=1, dtype=float))
        except (OSError, ValueError) as exc:
            raise SimulationError(f"arrival timestamps {spec!r}: {exc}") from None
        times = times - times.min() if len(times) else times
        return times[times < duration_s]
    values = [float(v) for v in spec.split(":") if v]
    if kind == "poisson" and len(values) == 1:
        rate = values[0]
        count = rng.poisson(rate * duration_s)
        return np.sort(rng.uniform(0, duration_s, count))
    if kind == "bursty" and len(values) == 3:
        rate, peak, period = values
        high, low = rate * peak, max(0.0, rate * (2 - peak))
        bursts: list[float] = []
        for start in np.arange(0, duration_s, period):
            for offset, level in ((0.0, high), (period / 2, low)):
                span = min(period / 2, max(0.0, duration_s - start - offset))
                count = rng.poisson(level * span)
                bursts.extend(start + offset + rng.uniform(0, span, count))
        return np.sort(np.asarray(bursts))
    raise SimulationError(
        f"arrival process {process!r}: use poisson:RATE, bursty:RATE:PEAK:PERIOD or timestamps:FILE"
    )


def sample_requests(
    loads: Loads,
    times: np.ndarray,
    top_k: int,
    prompt_tokens: int,
    output_tokens: int,
    rng: np.random.Generator,
) -> list[Request]:
    """Requests whose tokens pick ``top_k`` distinct experts per layer with the loads' shares."""
    layer_shares = [shares(counts) for counts in loads.layers.values()]

    def route(tokens: int) -> list[dict[int, int]]:
        routed = []
        for p in layer_shares:
            keys = np.log(np.maximum(p, 1e-300)) + rng.gumbel(size=(tokens, len(p)))  # Gumbel top-k
            chosen = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k].ravel()
            counts = np.bincount(chosen, minlength=len(p))
            routed.append({int(e): int(c) for e, c in enumerate(counts) if c})
        return routed

    return [
        Request(float(t), [route(prompt_tokens)] + [route(1) for _ in range(output_tokens)]) for t in times
    ]


@dataclass
class _Function:
    memory_mb: int
    provisioned: int
    free_at: list[float] = field(default_factory=list)  # per instance: when it is next idle
    provisioned_free_at: list[float] = field(default_factory=list)
    warming: list[float] = field(default_factory=list)  # pre-warmed instances: when their init ends


@dataclass(frozen=True)
class PrewarmModel:
    """A predictor's effect: each function a step will need was predicted (and pre-warmed) with
    probability ``hit_rate``, ``lead`` ahead: ``"request"`` (at arrival, every layer: SPS) or
    ``"layer"`` (at layer l, for layer l+1: the layer-aware predictor at d = 1)."""

    hit_rate: float
    lead: str
    seed: int = 0

    @classmethod
    def from_eval(cls, result: dict[str, Any]) -> PrewarmModel:
        """The model of a measured predictor: the JSON of ``moeless predict eval`` or
        ``eval-routing``. A token-level method (``distance`` ahead, at a layer) pre-warms with its
        mean hit rate, a load-level one (at arrival) with its set recall (the share of a request's
        experts it foresees)."""
        if not isinstance(result, dict) or not isinstance(result.get("mean"), dict):
            raise ValueError('not a predictor evaluation: no "mean" metrics')
        method = result.get("method")
        if method in ("freq", "sps", "kernel"):
            return cls(hit_rate=float(result["mean"]["set_recall"]), lead="request")
        if method in ("gate", "layer", "table", "crosslayer", "oracle"):
            return cls(hit_rate=float(result["mean"]["hit_rate"]), lead="layer")
        raise ValueError(f"unknown predictor method {method!r} in the evaluation")


@dataclass
class PolicyResult:
    """What one policy cost and how it served."""

    policy: str
    layer_latency_ms: list[float] = field(default_factory=list)
    request_latency_ms: list[float] = field(default_factory=list)
    tokens_served: dict[tuple[int, int], int] = field(default_factory=dict)
    invokes: int = 0
    cold_starts: int = 0
    usd: dict[str, float] = field(default_factory=dict)
    duration_s: float = 0.0
    requests: int = 0
    provisioned: int = 0
    replans: int = 0
    prewarms: int = 0
    waited_for_warmup: int = 0
    # timelines for the plots: (start, end) of every busy instance or worker interval, and
    # (time, replica id, tokens) of every piece served
    busy: list[tuple[float, float]] = field(default_factory=list)
    pieces: list[tuple[float, str, int]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        def pct(values: list[float], q: float) -> float:
            return float(np.percentile(values, q)) if values else 0.0

        total = sum(self.usd.values())
        per_1k = 1000 * total / max(self.requests, 1)
        return {
            "policy": self.policy,
            "requests": self.requests,
            "moe_layer_ms_p50": pct(self.layer_latency_ms, 50),
            "moe_layer_ms_p95": pct(self.layer_latency_ms, 95),
            "moe_layer_ms_p99": pct(self.layer_latency_ms, 99),
            "request_ms_p50": pct(self.request_latency_ms, 50),
            "request_ms_p95": pct(self.request_latency_ms, 95),
            "request_ms_p99": pct(self.request_latency_ms, 99),
            "cold_starts": self.cold_starts,
            "invokes": self.invokes,
            "replans": self.replans,
            "prewarms": self.prewarms,
            "usd_per_1k_requests": per_1k,
            "usd_per_1k_by_component": {k: 1000 * v / max(self.requests, 1) for k, v in self.usd.items()},
            "cost_x_p99_latency": per_1k * pct(self.request_latency_ms, 99) / 1000,
        }


class Simulator:
    """Replays ``requests`` through one policy's plan.

    Args:
        plan: where each expert's replicas run; ``plan.policy == Policy.STATIC`` means serverful workers.
        layers: the model's layer ids, in the order of the requests' layer indices.
        size: the experts' shape (compute time and cold start from the cost model).
        model: latency and price inputs.
        oracle: knows each step's loads: every replica it needs is warm and free (the bound).
        serverful: the plan's workers are always-on GPUs (default: for the ``static`` policy).
        replan: called every ``replan_s`` simulated seconds with the loads seen in that window; its
            plan replaces the current one (instances of functions it keeps stay; provisioned
            instances it adds are ready after a cold start).
    """

    def __init__(
        self,
        plan: Plan,
        layers: list[int],
        size: ExpertShape,
        model: CostModel,
        oracle: bool = False,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        backbone_ms_per_layer: float = 0.05,
        serverful: bool | None = None,
        replan: Callable[[Loads], Plan] | None = None,
        replan_s: float = 60.0,
        prewarm: PrewarmModel | None = None,
    ) -> None:
        self.plan = plan
        self.layers = layers
        self.size = size
        self.model = model
        self.oracle = oracle
        self.idle_timeout_s = idle_timeout_s
        self.backbone_ms_per_layer = backbone_ms_per_layer
        self.serverful = plan.policy == Policy.STATIC if serverful is None else serverful
        self.placement = {(p.layer, p.expert): p for p in plan.experts}
        specs = {f.name: f for f in plan.functions}
        self.functions = {
            name: _Function(
                spec.memory_mb, spec.provisioned_concurrency, [], [0.0] * spec.provisioned_concurrency
            )
            for name, spec in specs.items()
        }
        self.replica_functions = plan.replica_functions()
        self.workers_free_at = [0.0] * (plan.workers or 1)
        self.replan = replan
        self.replan_s = replan_s
        self.prewarm = prewarm
        self._prewarm_rng = np.random.default_rng(prewarm.seed if prewarm else 0)
        self.replans = 0
        self._provisioned_usd = 0.0
        self._provisioned_since = 0.0

    def _provisioned_rate(self) -> float:
        if self.serverful:
            return 0.0
        return sum(
            self.model.provisioned_usd_per_s(f.memory_mb, f.provisioned) for f in self.functions.values()
        )

    def _apply(self, plan: Plan, now: float) -> None:
        """Switch to ``plan`` at ``now``: keep the instances of functions it keeps."""
        self._provisioned_usd += self._provisioned_rate() * (now - self._provisioned_since)
        self._provisioned_since = now
        ready = now + self.model.cold_start_ms(self.size.weight_bytes) / 1e3
        functions = {}
        for spec in plan.functions:
            function = self.functions.get(spec.name) or _Function(spec.memory_mb, 0, [], [])
            function.memory_mb = spec.memory_mb
            extra = spec.provisioned_concurrency - len(function.provisioned_free_at)
            function.provisioned_free_at = function.provisioned_free_at[: spec.provisioned_concurrency] + [
                ready
            ] * max(0, extra)
            function.provisioned = spec.provisioned_concurrency
            functions[spec.name] = function
        self.plan = plan
        self.functions = functions
        self.placement = {(p.layer, p.expert): p for p in plan.experts}
        self.replica_functions = plan.replica_functions()
        self.replans += 1

    def run(self, requests: list[Request], duration_s: float, progress: bool = False) -> PolicyResult:
        result = PolicyResult(
            "oracle" if self.oracle else self.plan.policy,
            duration_s=duration_s,
            requests=len(requests),
            provisioned=0 if self.serverful else sum(f.provisioned for f in self.functions.values()),
        )
        usd = dict.fromkeys(("requests", "duration", "provisioned", "gpu"), 0.0)
        # events: (time_s, request index, step, layer index)
        events = [(r.arrival_s, i, 0, 0) for i, r in enumerate(requests)]
        heapq.heapify(events)
        finished_at = [0.0] * len(requests)
        total = sum(len(r.steps) for r in requests) * len(self.layers)
        bar = tqdm(
            total=total,
            desc=f"simulating {result.policy}",
            unit="layer",
            disable=not progress,
            mininterval=0.5,
        )
        experts = 1 + max(expert for _, expert in self.placement)
        window = {layer: np.zeros(experts) for layer in self.layers}
        next_replan = self.replan_s
        while events:
            now, i, step, layer_index = heapq.heappop(events)
            bar.update()
            if self.replan is not None and now >= next_replan:
                if any(counts.sum() for counts in window.values()):
                    self._apply(self.replan(Loads({k: v.copy() for k, v in window.items()})), now)
                window = {layer: np.zeros(experts) for layer in self.layers}
                next_replan = now + self.replan_s
            request = requests[i]
            routing = request.steps[step][layer_index]
            if self.prewarm is not None and not self.serverful and not self.oracle:
                if self.prewarm.lead == "request" and step == 0 and layer_index == 0:
                    for s in request.steps:
                        for index, future in enumerate(s):
                            self._prewarm(now, self.layers[index], future, result, usd)
                elif self.prewarm.lead == "layer" and layer_index + 1 < len(self.layers):
                    self._prewarm(
                        now, self.layers[layer_index + 1], request.steps[step][layer_index + 1], result, usd
                    )
            latency_ms = self._layer(now, self.layers[layer_index], routing, result, usd)
            result.layer_latency_ms.append(latency_ms)
            for expert, tokens in routing.items():
                key = (self.layers[layer_index], expert)
                result.tokens_served[key] = result.tokens_served.get(key, 0) + tokens
                window[key[0]][expert] += tokens
            done = now + (latency_ms + self.backbone_ms_per_layer) / 1e3
            if layer_index + 1 < len(self.layers):
                heapq.heappush(events, (done, i, step, layer_index + 1))
            elif step + 1 < len(request.steps):
                heapq.heappush(events, (done, i, step + 1, 0))
            else:
                finished_at[i] = done
        bar.close()
        result.replans = self.replans
        result.request_latency_ms = [(finished_at[i] - r.arrival_s) * 1e3 for i, r in enumerate(requests)]
        span = max([duration_s, *finished_at])
        if self.serverful:
            usd["gpu"] = (self.plan.workers or 1) * self.model.gpu.hourly_usd / 3600 * span
        else:
            usd["gpu"] = self.model.gpu.hourly_usd / 3600 * span  # the backbone's GPU
            usd["provisioned"] = self._provisioned_usd + self._provisioned_rate() * (
                span - self._provisioned_since
            )
        result.usd = usd
        return result

    def _compute_ms(self, tokens: float, memory_mb: int | None) -> float:
        size = self.size
        if memory_mb is None:  # a GPU: serverful worker or the backbone
            return self.model.backbone_expert_ms(tokens, size.hidden, size.intermediate, size.weight_bytes)
        return self.model.expert_ms(
            tokens, size.hidden, size.intermediate, self.model.vcpus(memory_mb), size.weight_bytes
        )

    def _layer(
        self, now: float, layer: int, routing: dict[int, int], result: PolicyResult, usd: dict[str, float]
    ) -> float:
        slowest = 0.0
        for expert, tokens in routing.items():
            placement = self.placement[(layer, expert)]
            replicas = max(1, placement.replicas)
            pieces = [tokens // replicas + (1 if k < tokens % replicas else 0) for k in range(replicas)]
            pieces = [n for n in pieces if n]
            if placement.placement == Placement.BACKBONE:
                slowest = max(slowest, self._compute_ms(tokens, None))
            elif self.serverful:
                for k, (n, worker) in enumerate(
                    zip(pieces, placement.workers or [0] * len(pieces), strict=False)
                ):
                    start = max(now, self.workers_free_at[worker])
                    end = start + self._compute_ms(n, None) / 1e3
                    self.workers_free_at[worker] = end
                    slowest = max(slowest, (end - now) * 1e3)
                    result.busy.append((start, end))
                    result.pieces.append((now, f"{layer}/{expert}/{k}", n))
            else:
                names = self.replica_functions[(layer, expert)]
                for k, n in enumerate(pieces):
                    slowest = max(slowest, self._invoke(now, names[k % len(names)], n, result, usd))
                    result.pieces.append((now, f"{layer}/{expert}/{k}", n))
        return slowest

    def _prewarm(
        self, now: float, layer: int, routing: dict[int, int], result: PolicyResult, usd: dict[str, float]
    ) -> None:
        """Pre-warm the functions of the predicted part of ``routing`` that have no idle instance."""
        for expert in routing:
            if self.prewarm is None or self._prewarm_rng.random() >= self.prewarm.hit_rate:
                continue
            placement = self.placement[(layer, expert)]
            if placement.placement == Placement.BACKBONE:
                continue
            for name in self.replica_functions.get((layer, expert), []):
                function = self.functions[name]
                function.warming = [t for t in function.warming if now - t <= self.idle_timeout_s]
                idle = any(t <= now for t in function.provisioned_free_at) or any(
                    t <= now and now - t <= self.idle_timeout_s for t in function.free_at
                )
                if idle or function.warming:
                    continue
                cold_ms = self.model.cold_start_ms(self.size.weight_bytes)
                function.warming.append(now + cold_ms / 1e3)
                result.prewarms += 1
                usd["requests"] += self.model.prices.per_request
                usd["duration"] += (
                    math.ceil(cold_ms) / 1e3 * function.memory_mb / 1024 * self.model.prices.per_gb_second
                )

    def _invoke(
        self, now: float, name: str, tokens: int, result: PolicyResult, usd: dict[str, float]
    ) -> float:
        function = self.functions[name]
        compute = self._compute_ms(tokens, function.memory_mb)
        busy_ms = self.model.invoke_overhead_ms + compute
        result.invokes += 1
        usd["requests"] += self.model.prices.per_request
        provisioned = False
        cold_ms = 0.0
        if self.oracle:
            start = now
        else:
            free = [k for k, t in enumerate(function.provisioned_free_at) if t <= now]
            if free:
                provisioned = True
                function.provisioned_free_at[free[0]] = now + busy_ms / 1e3
                start = now
            else:
                # instances idle longer than the timeout are gone; of the idle rest, reuse the latest
                function.free_at = [t for t in function.free_at if t > now or now - t <= self.idle_timeout_s]
                idle = [k for k, t in enumerate(function.free_at) if t <= now]
                if idle:
                    k = max(idle, key=lambda j: function.free_at[j])
                    start = now
                elif function.warming and now - min(function.warming) <= self.idle_timeout_s:
                    # a pre-warmed instance: wait for its init rather than starting another
                    ready = min(function.warming)
                    function.warming.remove(ready)
                    result.waited_for_warmup += 1
                    function.free_at.append(0.0)
                    k = len(function.free_at) - 1
                    start = max(now, ready)
                else:
                    cold_ms = self.model.cold_start_ms(self.size.weight_bytes)
                    result.cold_starts += 1
                    function.free_at.append(0.0)
                    k = len(function.free_at) - 1
                    start = now + cold_ms / 1e3
                function.free_at[k] = start + busy_ms / 1e3
        rate = (
            self.model.prices.provisioned_duration_per_gb_second
            if provisioned
            else self.model.prices.per_gb_second
        )
        billed = math.ceil(compute + cold_ms)
        usd["duration"] += billed / 1e3 * function.memory_mb / 1024 * rate
        result.busy.append((start, start + busy_ms / 1e3))
        return (start - now) * 1e3 + busy_ms


def requests_from_trace(trace: Any, times: np.ndarray) -> list[Request]:
    """The trace's requests with their recorded routing, re-timed to ``times`` (cycled if fewer)."""
    layers = len(trace.layers)
    by_request: dict[int, np.ndarray] = {}
    for request in np.unique(trace.request):
        by_request[int(request)] = np.flatnonzero(trace.request == request)
    ids = sorted(by_request)
    replay = []
    for n, arrival in enumerate(times):
        rows = by_request[ids[n % len(ids)]]
        prefill = rows[trace.phase[rows] == 0]
        decode = rows[trace.phase[rows] == 1]
        steps = [_routing(trace, prefill, layers)] + [
            _routing(trace, np.array([row]), layers) for row in decode
        ]
        replay.append(Request(float(arrival), steps))
    return replay


def _routing(trace: Any, rows: np.ndarray, layers: int) -> list[dict[int, int]]:
    routed = []
    for index in range(layers):
        counts = np.bincount(trace.experts[index][rows].ravel().astype(np.int64), minlength=trace.num_experts)
        routed.append({int(e): int(c) for e, c in enumerate(counts) if c})
    return routed


def write_report(results: list[PolicyResult], out_dir: Any, header: list[str], sources: list[str]) -> None:
    """``report.md`` and ``results.csv`` in ``out_dir``."""
    import csv
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r.summary() for r in results]
    components = sorted({k for row in rows for k in row["usd_per_1k_by_component"]})
    columns = [k for k in rows[0] if k != "usd_per_1k_by_component"] + [f"usd_per_1k_{c}" for c in components]
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        for row in rows:
            flat = {k: v for k, v in row.items() if k != "usd_per_1k_by_component"}
            writer.writerow(
                flat | {f"usd_per_1k_{c}": row["usd_per_1k_by_component"].get(c, 0.0) for c in components}
            )
    lines = [
        "# Simulation report",
        "",
        *header,
        "",
        "| policy | MoE layer p50 / p95 / p99 ms | request p50 / p99 ms | cold starts | invokes | "
        "$ per 1k requests | $ x p99 s | " + " | ".join(f"$ {c}" for c in components) + " |",
        "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(components),
    ]
    for row in rows:
        parts = " | ".join(f"{row['usd_per_1k_by_component'].get(c, 0.0):.4f}" for c in components)
        lines.append(
            f"| {row['policy']} | {row['moe_layer_ms_p50']:.1f} / {row['moe_layer_ms_p95']:.1f} / "
            f"{row['moe_layer_ms_p99']:.1f} | {row['request_ms_p50']:.0f} / {row['request_ms_p99']:.0f} | "
            f"{row['cold_starts']} | {row['invokes']} | {row['usd_per_1k_requests']:.4f} | "
            f"{row['cost_x_p99_latency']:.3f} | {parts} |"
        )
    lines += ["", "## Constants and their sources", "", *(f"- {s}" for s in sources)]
    (out / "report.md").write_text("\n".join(lines) + "\n")


# The predictors' measured accuracy (benchmarks/predictors.py, README): the layer-aware predictor's
# hit rate at d = 1 for moeless, SPS's request-level set recall for remoe. The defaults only:
# ``moeless simulate --prewarm-eval POLICY=EVAL.json`` replaces them by a measured evaluation.
PREDICTORS = {
    "moeless": PrewarmModel(hit_rate=0.890, lead="layer"),
    "remoe": PrewarmModel(hit_rate=0.639, lead="request"),
}

# policy -> (planner policy, its options given W workers and E experts, serverful, oracle)
POLICIES = {
    "static": ("static", lambda w, e: {"workers": w}, True, False),
    "static-replicated": (
        "moeless",
        lambda w, e: {"workers": w, "slots": math.ceil(1.25 * e / w) * w},
        True,
        False,
    ),
    "moeless": ("moeless", lambda w, e: {"workers": w, "slots": math.ceil(1.25 * e / w) * w}, False, False),
    "remoe": ("remoe", lambda w, e: {"memory_gb": 12.0}, False, False),
    "oracle": ("moeless", lambda w, e: {"workers": w, "slots": math.ceil(1.25 * e / w) * w}, False, True),
}


def simulate_policy(
    name: str,
    loads: Loads,
    top_k: int,
    shape: Any,
    workers: int,
    replay: list[Request],
    duration_s: float,
    model: CostModel,
    progress: bool = False,
    replan_s: float | None = None,
    predictors: bool = True,
    prewarm: dict[str, PrewarmModel] | None = None,
) -> PolicyResult:
    """Plan ``name`` for ``loads`` and replay the requests through it.

    With ``replan_s`` the serverless policies re-plan from the loads of each window of that length;
    with ``predictors`` moeless and remoe pre-warm what their predictor foresees (``prewarm``, a
    policy -> model map measured by ``predict eval``; ``PREDICTORS`` where it names none).

    ``static`` and ``static-replicated`` (load-aware replication, 1.25E slots) are serverful GPU
    fleets of ``workers``; ``moeless`` puts the same replication on functions; ``remoe`` plans
    backbone vs functions within 12 GB; ``oracle`` is moeless's plan with every replica warm.
    """
    from moeless.planning.planner import PlanRequest, make_plan
    from moeless.planning.remoe import Workload

    if name not in POLICIES:
        raise SimulationError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    planner_policy, options, serverful, oracle = POLICIES[name]
    request = PlanRequest(
        planner_policy, workload=Workload(top_k=top_k), **options(workers, loads.num_experts)
    )
    plan = make_plan(loads, request, shape=shape)

    def replan(window: Loads) -> Plan:
        return make_plan(window, request, shape=shape)

    use_replan = replan_s is not None and not serverful and not oracle
    result = Simulator(
        plan,
        sorted(loads.layers),
        shape,
        model,
        oracle=oracle,
        serverful=serverful,
        replan=replan if use_replan else None,
        replan_s=replan_s or 60.0,
        prewarm=(PREDICTORS | (prewarm or {})).get(name) if predictors else None,
    ).run(replay, duration_s, progress)
    result.policy = name
    return result
