"""Replay requests through a serving policy on the whole model: latency, cold starts and cost.

A discrete-event simulation of the serving path (``moeless/serving/generation.py``): a backbone
runs **continuous batching** in steps. At a step boundary waiting requests join, up to
``max_batch`` in flight; a new sequence's step is its prefill (all its prompt tokens, or with
``prefill_chunk`` the next chunk of them: the step's new sequences share that many prompt tokens in
the order they joined, and one whose share is 0 waits), the others decode one token each; a
sequence whose prefill completed produced its first token and decodes from the next step. A step
crosses every MoE layer of the model in turn; at each, the step's tokens of all its sequences are
routed (:mod:`moeless.simulation.routing`), and each needed expert's tokens are split
evenly over its replicas and cut into payload-sized pieces, each piece one invoke, except that
pieces of several experts bound for one function travel in one bundled invoke (what the dispatcher
does: :func:`~moeless.planning.packing.bundle_slices`). Each invoke is served where the policy put
its experts:

* a **function** replica: an idle instance of that function (warm), else a pre-warmed one still
  initialising, else a new one after a cold start; an instance serves one invoke at a time and
  idles out after ``idle_timeout_s``; provisioned instances never idle out. Time = invoke overhead
  + payload transfer + compute at the function's vCPUs (:class:`~moeless.planning.cost_model.CostModel`).
  The k-th invoke of a layer leaves ``k x invoke_serial_ms`` after the first, and a cold start
  takes ``cold_start_serial_ms`` longer for every other one still initialising: both 0 on AWS,
  measured on the local host, whose client, servers and instances share one machine's cores;
  there, the machine's momentary load also scales each layer's invoke overheads by a lognormal
  factor of spread ``invoke_spread`` (0 on AWS).
* the backbone's **GPU** (``gpu`` tier): the roofline of the experts it touched, at HBM speed;
* the backbone's **host** (``host`` tier): its vCPUs and RAM, each distinct expert read once, no
  invoke (:class:`~moeless.simulation.host.HostModel`); a resident expert with ``offload_rows``
  goes to its functions in a layer of at least that many rows (the step's tokens: a prefill
  chunk's step, not a decode batch's);
* **serverful** (``static``): the whole model on a GPU fleet; the layer's experts cost the
  roofline of the experts the step touched, no invokes.

Each block also pays the backbone's dense part on the GPU (:mod:`moeless.simulation.roofline`),
once per forward of the step as the engine runs them: each prefill alone, then one batched decode.
A layer ends when its last piece does; then the step moves on. Events are processed in time
order across the backbone's step loops, so function instances are shared as they would be.

With **speculation** (``speculate`` = k drafts and their :class:`~moeless.simulation.speculation.Acceptance`),
the batched decode verifies each sequence's drafts as the engine does: a decoding sequence has
room for k (fewer near its end), its drafter fills a drawn number of them (``carry``), and its
token and those drafts route as rows (its next positions) through every MoE layer, in the same
invokes; the dense forward computes every sequence as wide as the widest. The sequence then
generates 1 + the drafts accepted (a draw). Drafting itself is free here: an MTP head or a prompt
lookup costs a fraction of one forward's dense part, nothing beside a round trip to Lambda per MoE
layer.

With ``account_concurrency``, the environments running at once (on demand, initialising ones
included) and the provisioned ones together stay within the account's limit, as Lambda keeps
them: an invoke beyond it is throttled (429), retried as the dispatcher retries (its attempts
and backoff), then served by the backbone's host as the dispatcher's fallback.

Costs: Lambda requests, billed duration (init included on cold starts), provisioned GB-s for the
simulated time, and the GPUs kept up for the span (the backbone instances for serverless
policies, the whole fleet for ``static``).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from tqdm import tqdm

from moeless.contracts.environment import IDLE_TIMEOUT_S, KEEP_WARM_PING_S
from moeless.contracts.loads import Loads
from moeless.contracts.payload import max_tokens_per_request
from moeless.contracts.plan import Placement, Plan
from moeless.planning.concurrency import ForecastReplanner, LevelClock, LevelDemand, Warmth, with_concurrency
from moeless.planning.cost_model import CostModel, ExpertShape
from moeless.planning.packing import Slice, bundle_slices
from moeless.serving.generation import prefill_shares
from moeless.simulation.host import HostModel
from moeless.simulation.roofline import Hardware
from moeless.simulation.routing import StepRouting
from moeless.simulation.speculation import Acceptance


@dataclass(frozen=True)
class Request:
    """One request: when it arrives, its prompt and output lengths, and whose routing it replays."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    source: int = 0


@dataclass(frozen=True)
class GpuModel:
    """What the GPU side computes per step: the model's dense part and, where the GPU holds
    experts, the experts' size there. Bytes are at the GPU's weight dtype."""

    blocks: int  # transformer blocks
    dense_bytes: float
    dense_params: float  # the dense part's parameters that multiply (2 FLOPs each per token)
    kv_bytes_per_token: float
    attention_flops: float  # per new token per context token, whole model
    expert_bytes: float  # one routed expert on the GPU
    expert_params: float
    # the engine's own work per step beyond its forwards (batch rebuild, sampling, detokenising,
    # streaming), and per sequence of the step: 0 unless measured (benchmarks/sim_vs_real.py)
    step_overhead_ms: float = 0.0
    sequence_overhead_ms: float = 0.0


@dataclass(frozen=True)
class PrewarmModel:
    """A predictor's effect: each function a step will need was predicted (and pre-warmed) with
    probability ``hit_rate``, ``lead`` ahead: ``"request"`` (as a request joins, every layer: SPS,
    kernel) or ``"layer"`` (at layer l, for layer l+1: the layer-aware predictor at d = 1)."""

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


@dataclass(frozen=True)
class GiveUp:
    """Stop a run once it certainly misses a p99 bound on TPOT (and TTFT), in ms.

    A request's TPOT is at least what it has taken per token so far (its last token is still to
    come), and its TTFT at least how long it has waited; once more requests are over a bound than
    a p99 tolerates, the run cannot meet it whatever follows. numpy's p99 of n values
    interpolates above the one at rank floor(0.99 (n - 1)), so it exceeds the bound once
    ``n - rank`` values do; one more is asked for against rounding.
    """

    tpot_ms: float
    ttft_ms: float | None = None

    @staticmethod
    def over_p99(values: int) -> int:
        """How many of ``values`` over a bound put their p99 over it."""
        return values - math.floor(0.99 * max(values - 1, 0)) + 1


@dataclass
class PolicyResult:
    """What one policy cost and how it served."""

    policy: str
    layer_latency_ms: list[float] = field(default_factory=list)
    request_latency_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float] = field(default_factory=list)
    tokens_served: dict[tuple[int, int], int] = field(default_factory=dict)
    invokes: int = 0
    cold_starts: int = 0
    throttles: int = 0  # invokes refused beyond the account's concurrency (each retry counted)
    fallbacks: int = 0  # pieces the host served after their retries were throttled
    usd: dict[str, float] = field(default_factory=dict)
    duration_s: float = 0.0
    requests: int = 0
    completed: int = 0
    provisioned: int = 0
    replans: int = 0
    prewarms: int = 0
    waited_for_warmup: int = 0
    warm_up_invokes: int = 0
    keep_warm_pings: int = 0
    # once per deployment, not per request: the warm-up pass and the first init of every kept
    # environment before traffic (what a deploy pays once; not in usd_per_1k_requests)
    one_off_usd: float = 0.0
    steps: int = 0
    layers_simulated: int = 0
    fleet: str = ""
    backbone: str = ""
    # timelines for the plots: (start, end) of every busy instance interval, and (time, replica id,
    # tokens) of every piece served; empty when the simulator runs without ``timeline``
    busy: list[tuple[float, float]] = field(default_factory=list)
    pieces: list[tuple[float, str, int]] = field(default_factory=list)
    # what each function saw, by concurrency level (level j: the invoke found j - 1 of the
    # function's environments busy): what the replica optimiser sizes provisioned concurrency from
    demand: dict[str, LevelDemand] = field(default_factory=dict)
    # the run stopped once it certainly missed its bounds (:class:`GiveUp`): figures are partial
    gave_up: bool = False
    # decoding sequences' verification forwards (each its token and its drafts, in one step's
    # forward) and the tokens they generated: their ratio is tokens per forward (1 without drafts)
    verifications: int = 0
    decoded_tokens: int = 0
    # Lambda requests and duration billed by the steps that prefill nothing (their pre-warms too):
    # the decode bill, apart from the steps where decode rows ride along a prefill chunk's invokes
    decode_step_usd: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The run's figures; a percentile over no values (nothing completed, or no request
        decoded a second token) is ``None``, never 0."""

        def pct(values: list[float], q: float) -> float | None:
            return float(np.percentile(values, q)) if values else None

        total = sum(self.usd.values())
        served = max(self.completed, 1)
        per_1k = 1000 * total / served
        return {
            "policy": self.policy,
            "requests": self.requests,
            "completed": self.completed,
            "layers_simulated": self.layers_simulated,
            "usd_per_1k_requests": per_1k,
            "ttft_ms_p50": pct(self.ttft_ms, 50),
            "ttft_ms_p99": pct(self.ttft_ms, 99),
            "tpot_ms_p50": pct(self.tpot_ms, 50),
            "tpot_ms_p99": pct(self.tpot_ms, 99),
            "request_ms_p50": pct(self.request_latency_ms, 50),
            "request_ms_p99": pct(self.request_latency_ms, 99),
            "moe_layer_ms_p50": pct(self.layer_latency_ms, 50),
            "moe_layer_ms_p99": pct(self.layer_latency_ms, 99),
            "cold_starts": self.cold_starts,
            "invokes": self.invokes,
            "throttles": self.throttles,
            "fallbacks": self.fallbacks,
            "steps": self.steps,
            "replans": self.replans,
            "prewarms": self.prewarms,
            "one_off_usd": self.one_off_usd,
            "tokens_per_forward": self.decoded_tokens / self.verifications if self.verifications else None,
            "usd_per_1k_decode_steps": 1000 * self.decode_step_usd / served,
            "gave_up": self.gave_up,
            "fleet": self.fleet,
            "backbone": self.backbone,
            "usd_per_1k_by_component": {k: 1000 * v / served for k, v in self.usd.items()},
        }


@dataclass
class _Function:
    memory_mb: int
    provisioned: int
    keep_warm: int = 0  # on-demand instances the pings keep alive (they never idle out)
    hosted: int = 1  # experts it hosts (a packed function loads them all on a cold start)
    free_at: list[float] = field(default_factory=list)  # per instance: when it is next idle
    provisioned_free_at: list[float] = field(default_factory=list)
    provisioned_since: list[float] = field(default_factory=list)  # when each was enabled (billing)
    warming: list[float] = field(default_factory=list)  # pre-warmed instances: when their init ends


@dataclass
class _Sequence:
    index: int  # into the run's requests
    generated: int = 0
    prefilled: int = 0  # prompt tokens computed so far
    first_token_s: float = 0.0


@dataclass
class _Step:
    """One step of a loop in progress: its sequences (each prefilling one with the prompt tokens
    it computes in this step), their routed counts, its per-block GPU time, and the drafts each
    decoding sequence verifies."""

    prefilling: list[tuple[_Sequence, int]]
    decoding: list[_Sequence]
    counts: np.ndarray  # [MoE layers, experts]
    dense_ms_per_layer: float
    tokens: int
    drafts: list[int] = field(default_factory=list)  # per decoding sequence: the drafts it carries


def _any_idle(free_at: list[float], now: float) -> bool:
    """Whether any of these instances is free at ``now``."""
    for t in free_at:  # noqa: SIM110 (a loop: any() over a generator costs more, once per invoke)
        if t <= now:
            return True
    return False


class _Judge:
    """Counts the requests certainly over a :class:`GiveUp`'s bounds as a run goes, and whether
    the prompts still to prefill can no longer be done by the horizon (every request must
    complete): at most ``chunk`` prompt tokens per step on each of ``loops`` step loops, each step
    at least ``step_floor_s`` (0: not known, not judged)."""

    def __init__(
        self,
        give_up: GiveUp,
        requests: list[Request],
        chunk: int | None = None,
        loops: int = 1,
        step_floor_s: float = 0.0,
        horizon_s: float = math.inf,
    ) -> None:
        self.give_up = give_up
        self.over_tpot: set[int] = set()
        self.over_ttft: set[int] = set()
        decoding = sum(r.output_tokens > 1 for r in requests)
        self.tpot_needed = GiveUp.over_p99(decoding) if decoding else math.inf
        self.ttft_needed = GiveUp.over_p99(len(requests))
        self.prompt_left = sum(r.prompt_tokens for r in requests)
        self.prefill_s_per_token = step_floor_s / (chunk * loops) if chunk else 0.0
        self.horizon_s = horizon_s
        self.late = False

    def step(
        self,
        now: float,
        stepped: list[_Sequence],
        active: list[_Sequence],
        waiting: deque[int],
        requests: list[Request],
        finished_at: list[float],
    ) -> None:
        """After a step that ended at ``now``: its sequences' TPOT so far (a finished one's is
        final), and with a TTFT bound every request still without its first token."""
        bound = self.give_up.tpot_ms
        for sequence in stepped:
            request = requests[sequence.index]
            if request.output_tokens > 1 and sequence.index not in self.over_tpot:
                end = finished_at[sequence.index]
                taken = (now if math.isnan(end) else end) - sequence.first_token_s
                if taken * 1e3 / (request.output_tokens - 1) > bound:
                    self.over_tpot.add(sequence.index)
        ttft = self.give_up.ttft_ms
        if ttft is not None:
            for sequence in stepped:  # a first token just now: its TTFT is final
                first_ms = (sequence.first_token_s - requests[sequence.index].arrival_s) * 1e3
                if sequence.generated == 1 and first_ms > ttft:
                    self.over_ttft.add(sequence.index)
            for index in [s.index for s in active if s.generated == 0] + list(waiting):
                if (now - requests[index].arrival_s) * 1e3 > ttft:
                    self.over_ttft.add(index)

    def prefilled(self, now: float, tokens: int) -> None:
        """A step that ended at ``now`` computed ``tokens`` prompt tokens."""
        self.prompt_left -= tokens
        self.late = now + self.prompt_left * self.prefill_s_per_token > self.horizon_s

    def missed(self) -> bool:
        return self.late or len(self.over_tpot) >= self.tpot_needed or len(self.over_ttft) >= self.ttft_needed


class Simulator:
    """Replays requests through one policy's plan on the whole model.

    Args:
        plan: where each expert's replicas run (ignored for placement when ``serverful``).
        routing: the step routing over the model's MoE layers (``routing.layers`` are the plan's).
        size: one routed expert as a function serves it (bytes at the expert dtype).
        model: Lambda latency and price inputs.
        gpu: the GPU side's sizes (dense part, KV, experts at the GPU dtype).
        hardware: the backbone instance (serverless) or the fleet (``serverful``).
        serverful: the whole model on ``hardware``; no functions.
        oracle: knows each step's loads: every replica it needs is warm and free (the bound).
        compute_speedup: the expert dtype's CPU speed relative to fp32 (``EXPERT_DTYPES``).
        replan: called every ``replan_s`` simulated seconds with the loads seen in that window; its
            plan replaces the current one (instances of functions it keeps stay; provisioned
            instances it adds are ready ``CostModel.provisioning_delay_s`` later, and each one
            removed is billed up to the next 5-minute step since it was enabled).
        reprovision: instead, every ``replan_s`` seconds the forecasting re-planner re-sizes each
            function's provisioned and kept-warm environments from the window's demand by level
            (the code the serving path runs), applied the same way.
        prefill_chunk: prompt tokens a step computes, across its new sequences (chunked prefill,
            so that a long prompt does not stall the decoding batch for a whole prefill); ``None``:
            each new sequence's whole prompt in one step.
        timeline: keep every busy interval and piece for the plots (costly on whole models).
        warm_up: the deployment's warm-up pass ran just before the first request: every function
            without provisioned concurrency has one warm environment at time 0 (its invoke and init
            are billed), which idles out like any other.
        ping_s: a function's ``keep_warm`` environments get a warm-up invoke this often
            (:data:`KEEP_WARM_PING_S`, under the idle timeout), so they never idle out; each ping
            is billed as one request of one token, and the pinged environments start at time 0
            (their inits billed).
        record_demand: keep what each function saw by level (``PolicyResult.demand``); a run that
            only needs its summary skips it (the forecasting re-planner always keeps it).
        host: the backbone host that runs ``host``-tier experts (and throttled pieces); ``None``:
            this machine's 2 vCPUs at the cost model's per-vCPU figures.
        account_concurrency: the account's concurrent executions (``None``: no limit).
        retries: (attempts, first backoff in s) of a throttled invoke, as the dispatcher retries.
        speculate: drafts each decoding sequence verifies per step (0: none), kept as ``acceptance``
            draws them (see the module docstring).
    """

    def __init__(
        self,
        plan: Plan,
        routing: StepRouting,
        size: ExpertShape,
        model: CostModel,
        gpu: GpuModel,
        hardware: Hardware,
        *,
        serverful: bool = False,
        oracle: bool = False,
        max_batch: int = 16,
        prefill_chunk: int | None = None,
        compute_speedup: float = 1.0,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        replan: Callable[[Loads], Plan] | None = None,
        reprovision: ForecastReplanner | None = None,
        replan_s: float = 60.0,
        prewarm: PrewarmModel | None = None,
        seed: int = 0,
        timeline: bool = True,
        warm_up: bool = False,
        ping_s: float = KEEP_WARM_PING_S,
        record_demand: bool = True,
        host: HostModel | None = None,
        account_concurrency: int | None = None,
        retries: tuple[int, float] = (3, 0.02),
        speculate: int = 0,
        acceptance: Acceptance | None = None,
    ) -> None:
        assert speculate >= 0 and (acceptance is not None or not speculate), "drafts need an acceptance"
        self.plan = plan
        self.routing = routing
        self.layers = list(routing.layers)
        self.size = size
        self.model = model
        self.gpu = gpu
        self.hardware = hardware
        self.serverful = serverful
        self.oracle = oracle
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.compute_speedup = compute_speedup
        self.idle_timeout_s = idle_timeout_s
        self.replan = replan
        self.reprovision = reprovision
        self.replan_s = replan_s
        self.prewarm = prewarm
        self.timeline = timeline
        self.max_rows = max_tokens_per_request(size.hidden)
        self.host = host or HostModel(2, 2 * model.mem_gbps_per_vcpu, model.gflops_per_vcpu)
        self.host = replace(self.host, compute_speedup=compute_speedup)
        self.account_concurrency = account_concurrency
        self.retries = retries
        self.speculate, self.acceptance = speculate, acceptance
        self._running: list[float] = []  # heap: when each on-demand environment busy now is free
        self._rng = np.random.default_rng(seed)
        self._prewarm_rng = np.random.default_rng(prewarm.seed if prewarm else 0)
        self._spread_rng = np.random.default_rng(seed + 1)
        self.functions: dict[str, _Function] = {}
        self._served = np.zeros((len(self.layers), routing.num_experts), np.int64)  # tokens per expert
        self._initialising: list[float] = []  # when each cold start in progress ends (all functions)
        self.replans = -1
        self._provisioned_usd = 0.0
        self._provisioned_since = 0.0
        self._demand: dict[str, LevelDemand] = {}
        self._window_demand: dict[str, LevelDemand] = {}
        self._levels = LevelClock(idle_timeout_s)
        self._piece_ms: dict[tuple[int, int], tuple[float, float]] = {}  # (memory, rows) -> times
        self._per_request = model.prices.per_request
        self._apply(plan, 0.0, ready_now=True)
        self.warm_up = warm_up and not serverful and not oracle
        self.ping_s = ping_s
        self.record_demand = record_demand or reprovision is not None

    # -- plans ------------------------------------------------------------------------------------

    def _provisioned_rate(self) -> float:
        if self.serverful:
            return 0.0
        return sum(
            self.model.provisioned_usd_per_s(f.memory_mb, f.provisioned) for f in self.functions.values()
        )

    def _apply(self, plan: Plan, now: float, ready_now: bool = False) -> None:
        """Switch to ``plan`` at ``now``: keep the instances of functions it keeps."""
        self._provisioned_usd += self._provisioned_rate() * (now - self._provisioned_since)
        self._provisioned_since = now
        ready = now if ready_now else now + self.model.provisioning_delay_s
        step = self.model.prices.provisioned_step_s
        functions = {}
        for spec in plan.functions:
            function = self.functions.get(spec.name) or _Function(spec.memory_mb, 0)
            count = spec.provisioned_concurrency
            for since in function.provisioned_since[count:]:  # removed: billed to the next step
                enabled = now - since
                rounded = math.ceil(enabled / step - 1e-9) * step
                self._provisioned_usd += self.model.provisioned_usd_per_s(function.memory_mb, 1) * (
                    rounded - enabled
                )
            extra = max(0, count - len(function.provisioned_free_at))
            function.provisioned_free_at = function.provisioned_free_at[:count] + [ready] * extra
            function.provisioned_since = function.provisioned_since[:count] + [now] * extra
            function.memory_mb = spec.memory_mb
            function.hosted = max(1, len(spec.experts))
            function.provisioned = count
            function.keep_warm = spec.keep_warm
            functions[spec.name] = function
        self.plan = plan
        self.functions = functions
        self._provisioned_total = sum(f.provisioned for f in functions.values())
        self.placement = {(p.layer, p.expert): p for p in plan.experts}
        self.targets = plan.invoke_targets()
        # per layer, expert -> the functions its replicas invoke (None: resident on the backbone,
        # on its GPU or its host: ``_tiers``); a resident expert that offloads: ``_offloads``
        self._routes: dict[int, dict[int, list[str] | None]] = {}
        tiers = plan.tiers()
        self._gpu: dict[int, set[int]] = {}  # per layer, the experts resident on the GPU
        for (layer, expert), tier in tiers.items():
            if tier == Placement.GPU:
                self._gpu.setdefault(layer, set()).add(expert)
        self._offloads = {key: (rows, self.targets[key]) for key, rows in plan.offloads().items()}
        for layer, expert in self.placement:
            names = None if (layer, expert) in tiers else self.targets[(layer, expert)]
            self._routes.setdefault(layer, {})[expert] = names
        # the same, each function once (a pre-warm warms a function, not a replica)
        self._distinct_routes = {
            layer: {e: None if t is None else tuple(dict.fromkeys(t)) for e, t in routes.items()}
            for layer, routes in self._routes.items()
        }
        # layers where no function serves two experts, and each expert's replicas are on one
        # function or each on its own: there every piece is an invoke of its own (no bundling)
        self._unbundled_layers = set()
        for layer, routes in self._routes.items():
            owner: dict[str, int] = {}
            unbundled = True
            for expert, targets in routes.items():
                if (layer, expert) in self._offloads:
                    targets = self._offloads[(layer, expert)][1]
                if targets is None:
                    continue
                distinct = set(targets)
                unbundled &= len(distinct) in (1, len(targets))
                unbundled &= all(owner.setdefault(name, expert) == expert for name in distinct)
            if unbundled:
                self._unbundled_layers.add(layer)
        self.replans += 1

    # -- the run ----------------------------------------------------------------------------------

    def run(
        self,
        requests: list[Request],
        duration_s: float,
        progress: bool = False,
        horizon_s: float | None = None,
        give_up: GiveUp | None = None,
    ) -> PolicyResult:
        """Serve ``requests``; the span billed is ``duration_s`` or until the last request finishes,
        whichever is later. An overloaded policy whose queue would take longer than ``horizon_s``
        (default: 3 x the duration, at least 10 minutes more) to drain stops there: the requests
        it had not finished count as not completed (``completed < requests``), and its cost is per
        completed request. With ``give_up`` it stops as soon as it certainly misses those bounds
        (``gave_up``; its figures then cover what it served until then)."""
        horizon = horizon_s if horizon_s is not None else max(3 * duration_s, duration_s + 600.0)
        result = PolicyResult(
            self.plan.policy,
            duration_s=duration_s,
            requests=len(requests),
            provisioned=0 if self.serverful else sum(f.provisioned for f in self.functions.values()),
            layers_simulated=len(self.layers),
        )
        usd = dict.fromkeys(("requests", "duration", "provisioned", "gpu"), 0.0)
        if not self.serverful and not self.oracle:
            self._warm_up(result, usd)
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
        judge = None
        if give_up is not None:
            floor_s = self._step_floor_s() if self.replan is None else 0.0  # (a re-plan may change memory)
            judge = _Judge(give_up, requests, self.prefill_chunk, self.hardware.loops, floor_s, horizon)
        waiting: deque[int] = deque()
        arrived = 0
        active: list[list[_Sequence]] = [[] for _ in range(self.hardware.loops)]
        steps: list[_Step | None] = [None] * self.hardware.loops
        finished_at = [math.nan] * len(requests)
        # events: (time_s, tiebreak, loop, layer index); layer index 0 starts a step, loop -1 re-plans
        events = [(0.0, n, n, 0) for n in range(self.hardware.loops)]
        if self.replan is not None or self.reprovision is not None:
            events.append((self.replan_s, len(events), -1, 0))
        heapq.heapify(events)
        tiebreak = len(events)
        window = np.zeros((len(self.layers), self.routing.num_experts))
        bar = tqdm(
            total=len(requests),
            desc=f"simulating {result.policy}",
            unit="req",
            disable=not progress,
            mininterval=0.5,
        )
        while events:
            now, _, loop, layer_index = heapq.heappop(events)
            if now > horizon:
                break
            if loop < 0:  # a re-plan, on the clock whether or not steps are running
                if self.replan is not None:
                    if window.sum():
                        self._apply(self.replan(self._window_loads(window)), now)
                    window[:] = 0
                else:
                    self._reprovision(now, self.replan_s, usd)
                if result.completed < len(requests) or now + self.replan_s <= duration_s:
                    tiebreak += 1
                    heapq.heappush(events, (now + self.replan_s, tiebreak, -1, 0))
                continue
            if layer_index == 0:
                while arrived < len(order) and requests[order[arrived]].arrival_s <= now:
                    waiting.append(order[arrived])
                    arrived += 1
                while waiting and len(active[loop]) < self.max_batch:
                    active[loop].append(_Sequence(waiting.popleft()))
                if not active[loop]:
                    if arrived < len(order):  # idle until the next arrival
                        tiebreak += 1
                        heapq.heappush(events, (requests[order[arrived]].arrival_s, tiebreak, loop, 0))
                    continue
                started = steps[loop] = self._begin_step(now, active[loop], requests, result, usd)
                window += started.counts
                result.steps += 1
            step = steps[loop]
            assert step is not None
            done = now + self._layer(now, layer_index, step, result, usd) / 1e3
            tiebreak += 1
            if layer_index + 1 < len(self.layers):
                heapq.heappush(events, (done, tiebreak, loop, layer_index + 1))
                continue
            stepped = list(step.decoding)
            for sequence, tokens in step.prefilling:
                sequence.prefilled += tokens
                if sequence.prefilled >= requests[sequence.index].prompt_tokens:
                    stepped.append(sequence)
            for n, sequence in enumerate(stepped):  # the decoding ones first
                request = requests[sequence.index]
                new = 1  # a prefill's last chunk gives the first token
                if n < len(step.decoding):
                    new = self._verified(step.drafts[n])
                    result.verifications += 1
                    result.decoded_tokens += new
                sequence.generated += new
                if sequence.generated == 1:
                    sequence.first_token_s = done
                if sequence.generated >= request.output_tokens:
                    finished_at[sequence.index] = done
                    result.completed += 1
                    bar.update()
                    result.ttft_ms.append((sequence.first_token_s - request.arrival_s) * 1e3)
                    if request.output_tokens > 1:
                        result.tpot_ms.append(
                            (done - sequence.first_token_s) * 1e3 / (request.output_tokens - 1)
                        )
            active[loop] = [s for s in active[loop] if math.isnan(finished_at[s.index])]
            if judge is not None and result.completed < len(requests):
                judge.step(done, stepped, active[loop], waiting, requests, finished_at)
                judge.prefilled(done, sum(tokens for _, tokens in step.prefilling))
                if judge.missed():
                    result.gave_up = True
                    break
            heapq.heappush(events, (done, tiebreak, loop, 0))
        bar.close()
        result.tokens_served = {
            (self.layers[i], int(e)): int(self._served[i, e])
            for i, e in zip(*np.nonzero(self._served), strict=True)
        }
        result.replans = self.replans
        result.demand = self._demand
        result.request_latency_ms = [
            (finished_at[i] - r.arrival_s) * 1e3
            for i, r in enumerate(requests)
            if not math.isnan(finished_at[i])
        ]
        span = max([duration_s, *(t for t in finished_at if not math.isnan(t))])
        if result.completed < len(requests):  # stopped at the horizon, still serving
            span = horizon
        usd["gpu"] = self.hardware.hourly_usd / 3600 * span
        if not self.serverful:
            usd["provisioned"] = self._provisioned_usd + self._provisioned_rate() * (
                span - self._provisioned_since
            )
            self._bill_pings(span, result, usd)
        result.usd = usd
        result.backbone = "" if self.serverful else self.hardware.label
        result.fleet = self.hardware.label if self.serverful else ""
        return result

    def _step_floor_s(self) -> float:
        """A lower bound on any step's time: each MoE layer whose experts are all on functions
        waits for at least one invoke of one row on its fastest function (0 where invoke times
        vary with the machine's load, or serverful)."""
        if self.serverful or self.model.invoke_spread > 0:
            return 0.0
        floor_ms = 0.0
        for layer in self.layers:
            routed = list(self._routes.get(layer, {}).values())
            if not routed or any(targets is None for targets in routed):
                continue
            memories = {self.functions[name].memory_mb for targets in routed for name in targets or ()}
            floor_ms += min(sum(self._times(memory, 1)) for memory in memories)
        return floor_ms / 1e3

    def _reprovision(self, now: float, window_s: float, usd: dict[str, float]) -> None:
        """One re-plan of the forecasting re-planner over the window just ended."""
        assert self.reprovision is not None
        current = {f.name: Warmth(f.provisioned_concurrency, f.keep_warm) for f in self.plan.functions}
        in_use = {  # serving an invoke, or at a level used within the idle timeout
            name: max(sum(t > now for t in function.provisioned_free_at), self._levels.in_use(name, now))
            for name, function in self.functions.items()
        }
        warmth = self.reprovision.update(self._window_demand, window_s, current, in_use)
        self._window_demand = {}
        if warmth != current:
            self._apply(with_concurrency(self.plan, warmth), now)
            for name, chosen in warmth.items():  # newly kept environments start from a ping now
                function = self.functions[name]
                cold_ms = self._init_ms(function)
                new = chosen.keep_warm - len(function.free_at) - len(function.warming)
                if new > 0:
                    function.warming += [now + cold_ms / 1e3] * new
                    usd["requests"] += new * self.model.prices.per_request
                    usd["duration"] += new * self.model.duration_usd(cold_ms, function.memory_mb)
        else:
            self.replans += 1

    def _warm_up(self, result: PolicyResult, usd: dict[str, float]) -> None:
        """Before traffic: the environments the pings keep warm start (``keep_warm`` of each
        function), and with the warm-up pass one of every function with nothing provisioned or
        kept warm; each is a cold start off the request path, idle from time 0, billed once per
        deployment (``one_off_usd``)."""
        for name, function in self.functions.items():
            cold_ms = self._init_ms(function)
            wanted = function.keep_warm or (1 if self.warm_up and not function.provisioned else 0)
            if self.warm_up:
                self._levels.warmed(name, max(wanted, function.provisioned, 1), 0.0)
            for _ in range(max(0, wanted - len(function.free_at))):
                function.free_at.append(0.0)
                result.warm_up_invokes += 1
                result.one_off_usd += self.model.invoke_usd(cold_ms, function.memory_mb)

    def _bill_pings(self, span_s: float, result: PolicyResult, usd: dict[str, float]) -> None:
        """Every ``ping_s``, each function keeping environments warm pings them all at once (its
        provisioned ones take the first pings): one request and one token's compute each."""
        rounds = math.ceil(span_s / self.ping_s)
        for function in self.functions.values():
            if not function.keep_warm:
                continue
            pings = rounds * (function.keep_warm + function.provisioned)
            result.keep_warm_pings += pings
            usd["requests"] += pings * self.model.prices.per_request
            usd["duration"] += pings * self.model.duration_usd(self._ping_ms(function), function.memory_mb)

    def _ping_ms(self, function: _Function) -> float:
        """One ping's billed compute: one token through one expert (fp32, as the pings are costed)."""
        size = self.size
        return self.model.expert_ms(
            1, size.hidden, size.intermediate, self.model.vcpus(function.memory_mb), size.weight_bytes
        )

    def _expire(self, function: _Function, now: float) -> None:
        """Drop the on-demand instances idle longer than the timeout, except those the pings keep
        alive (up to ``keep_warm`` instances in all, the most recently used first). What the run
        does depends only on the instances' times, not on their order in the list."""
        if len(function.free_at) <= function.keep_warm:  # the pings keep every one
            return
        timeout = self.idle_timeout_s
        for t in function.free_at:  # (called once per invoke: nothing to drop is the common case)
            if now - t > timeout:
                break
        else:
            return
        alive = [t for t in function.free_at if t > now or now - t <= timeout]
        if function.keep_warm > len(alive):
            idle = sorted((t for t in function.free_at if t <= now - self.idle_timeout_s), reverse=True)
            alive += idle[: function.keep_warm - len(alive)]
        function.free_at = alive

    def _window_loads(self, window: np.ndarray) -> Loads:
        return Loads({layer: window[i].copy() for i, layer in enumerate(self.layers)})

    def _begin_step(
        self,
        now: float,
        batch: list[_Sequence],
        requests: list[Request],
        result: PolicyResult,
        usd: dict[str, float],
    ) -> _Step:
        """Route the step's tokens over every layer and price its dense part on the GPU."""
        prefilling = self._prefill_chunks([s for s in batch if s.generated == 0], requests)
        decoding = [s for s in batch if s.generated > 0]
        counts = np.zeros((len(self.layers), self.routing.num_experts), np.int64)
        for sequence, tokens in prefilling:
            request = requests[sequence.index]
            chunk = slice(sequence.prefilled, sequence.prefilled + tokens)
            routed = self.routing.prefill(request.source, request.prompt_tokens, self._rng, chunk)
            counts += routed
            if self.prewarm is not None and self.prewarm.lead == "request":
                for index in range(len(self.layers)):
                    self._prewarm(now, index, routed[index], result, usd)
        # each decoding sequence's rows: its token and its drafts, at its next positions (a
        # shorter draft's padding goes to no expert)
        drafts = self._drafts(decoding, requests)
        if decoding:
            counts += self.routing.decode(
                [
                    requests[s.index].source
                    for s, n in zip(decoding, drafts, strict=True)
                    for _ in range(1 + n)
                ],
                [s.generated - 1 + j for s, n in zip(decoding, drafts, strict=True) for j in range(1 + n)],
                self._rng,
            )
        # the step's forwards, as generation.py runs them: each prefill (chunk) alone, then one
        # batched decode; each is (tokens, context tokens attended over, sequences)
        forwards = [(tokens, s.prefilled + tokens, 1) for s, tokens in prefilling]
        if decoding:
            context = sum(requests[s.index].prompt_tokens + s.generated for s in decoding)
            forwards.append((len(decoding) * (1 + max(drafts)), context, len(decoding)))
        tokens = sum(f[0] for f in forwards)
        engine_ms = self.gpu.step_overhead_ms + self.gpu.sequence_overhead_ms * len(batch)
        dense_ms = (sum(self._forward_ms(*f) for f in forwards) + engine_ms) / len(self.layers)
        return _Step(prefilling, decoding, counts, dense_ms, tokens, drafts)

    def _drafts(self, decoding: list[_Sequence], requests: list[Request]) -> list[int]:
        """The drafts each decoding sequence carries into this step, as the engine drafts: room for
        at most ``speculate``, fewer than the tokens it may still generate, of which the drafter
        fills a drawn number (:meth:`Acceptance.carried`)."""
        if not self.speculate or self.acceptance is None:
            return [0] * len(decoding)
        return [
            self.acceptance.carried(
                max(0, min(self.speculate, requests[s.index].output_tokens - s.generated - 1)), self._rng
            )
            for s in decoding
        ]

    def _verified(self, drafts: int) -> int:
        """Tokens one decoding sequence generates in a step with ``drafts`` carried drafts (each
        within its room): 1, and the drafts kept."""
        if not drafts:
            return 1
        assert self.acceptance is not None
        return 1 + self.acceptance.accepted(drafts, self._rng)

    def _prefill_chunks(self, new: list[_Sequence], requests: list[Request]) -> list[tuple[_Sequence, int]]:
        """The prompt tokens each new sequence computes in this step: all that are left, or with
        ``prefill_chunk`` that many shared in join order (later ones wait for a step with room)."""
        remaining = [requests[s.index].prompt_tokens - s.prefilled for s in new]
        shares = prefill_shares(remaining, self.prefill_chunk)
        return [
            (s, tokens)
            for s, tokens, left in zip(new, shares, remaining, strict=True)
            if tokens > 0 or left <= 0  # an empty prompt completes in the step it joins
        ]

    def _forward_ms(self, tokens: int, context: int, sequences: int) -> float:
        """One forward's dense part over every block: each block streams its weights and its
        sequences' KV cache again, computes its tokens, and pays the per-block overhead."""
        gpu, roofline = self.gpu, self.hardware.roofline
        blocks = max(gpu.blocks, 1)
        flops = 2 * gpu.dense_params * tokens + gpu.attention_flops * tokens * context / max(sequences, 1)
        per_block = roofline.ms((gpu.dense_bytes + gpu.kv_bytes_per_token * context) / blocks, flops / blocks)
        return blocks * (per_block + roofline.block_overhead_ms)

    def _layer(
        self, now: float, index: int, step: _Step, result: PolicyResult, usd: dict[str, float]
    ) -> float:
        """Serve layer ``index`` of ``step`` at ``now``; returns the layer's time (dense + experts), ms."""
        layer = self.layers[index]
        row = step.counts[index]
        needed = np.flatnonzero(row)
        self._served[index] += row
        if self.serverful:
            moe_ms = self._gpu_experts_ms(len(needed), int(row.sum()))
        else:
            billed = usd["requests"] + usd["duration"]
            if self.prewarm is not None and self.prewarm.lead == "layer" and index + 1 < len(self.layers):
                self._prewarm(now, index + 1, step.counts[index + 1], result, usd)
            moe_ms = self._serverless_layer(now, layer, row, needed, result, usd, step.tokens)
            if not step.prefilling:
                result.decode_step_usd += usd["requests"] + usd["duration"] - billed
        result.layer_latency_ms.append(moe_ms)
        return step.dense_ms_per_layer + moe_ms

    def _gpu_experts_ms(self, experts: int, selections: int) -> float:
        """The roofline of ``experts`` touched experts computing ``selections`` token-expert pairs."""
        if not experts:
            return 0.0
        return self.hardware.roofline.ms(
            experts * self.gpu.expert_bytes, 2 * self.gpu.expert_params * selections
        )

    def _serverless_layer(
        self,
        now: float,
        layer: int,
        row: np.ndarray,
        needed: np.ndarray,
        result: PolicyResult,
        usd: dict[str, float],
        layer_rows: int = 0,
    ) -> float:
        slowest = 0.0
        gpu, gpu_selections, host, host_selections = 0, 0, 0, 0
        on_gpu, offloads = self._gpu.get(layer, ()), self._offloads
        issued = 0  # invokes of this layer so far: the k-th leaves k x invoke_serial_ms later
        # the machine's momentary load scales the layer's invoke overheads (lognormal, 0: none)
        spread = self.model.invoke_spread
        factor = float(np.exp(self._spread_rng.normal(0.0, spread))) if spread > 0 else 1.0
        slices: dict[str, list[Slice]] = {}  # function -> (expert, 0, rows) of this layer, in order
        routes, max_rows, timeline = self._routes[layer], self.max_rows, self.timeline
        serial_ms = self.model.invoke_serial_ms * factor
        routed = []  # (expert, tokens, the functions of its replicas) of the experts on functions
        for expert, tokens in zip(needed.tolist(), row[needed].tolist(), strict=True):
            names = routes[expert]
            if names is None:  # resident on the backbone, unless this many rows go to its functions
                offload = offloads.get((layer, expert)) if offloads else None
                if offload is not None and layer_rows >= offload[0]:
                    routed.append((expert, tokens, offload[1]))
                elif expert in on_gpu:
                    gpu += 1
                    gpu_selections += tokens
                else:
                    host += 1
                    host_selections += tokens
            else:
                routed.append((expert, tokens, names))
        if layer in self._unbundled_layers and not timeline:
            # every piece its own invoke, issued in the order the general path below issues them
            # (its bundles never hold two pieces of one expert, and no function here serves two)
            for _, tokens, names in routed:
                replicas = len(names)
                for k in range(replicas):
                    share = tokens // replicas + (1 if k < tokens % replicas else 0)
                    for offset in range(0, share, max_rows):
                        delay_ms = issued * serial_ms
                        issued += 1
                        piece = (min(max_rows, share - offset),)
                        latency = delay_ms + self._invoke(
                            now + delay_ms / 1e3, names[k], piece, result, usd, factor
                        )
                        if latency > slowest:
                            slowest = latency
            return max(slowest, self._resident_ms(gpu, gpu_selections, host, host_selections))
        for expert, tokens, names in routed:
            replicas = len(names)
            if replicas == 1 and tokens <= max_rows and not timeline:  # one piece, one function
                slices.setdefault(names[0], []).append((expert, 0, tokens))
                continue
            for k in range(replicas):
                share = tokens // replicas + (1 if k < tokens % replicas else 0)
                for offset in range(0, share, max_rows):
                    piece = min(max_rows, share - offset)
                    slices.setdefault(names[k], []).append((expert, 0, piece))
                    if timeline:
                        result.pieces.append((now, f"{layer}/{expert}/{k}", piece))
        for name, assigned in slices.items():
            for bundle in bundle_slices(assigned, max_rows) if len(assigned) > 1 else (assigned,):
                delay_ms = issued * serial_ms
                issued += 1
                latency = delay_ms + self._invoke(
                    now + delay_ms / 1e3, name, [rows for _, _, rows in bundle], result, usd, factor
                )
                slowest = max(slowest, latency)
        return max(slowest, self._resident_ms(gpu, gpu_selections, host, host_selections))

    def _resident_ms(self, gpu: int, gpu_selections: int, host: int, host_selections: int) -> float:
        """The layer's resident experts: the GPU's at HBM speed beside the host's on its CPUs, both
        alongside the layer's invokes."""
        host_ms = self.host.layer_ms(host, self.size.weight_bytes, self._expert_flops(host_selections))
        return max(self._gpu_experts_ms(gpu, gpu_selections), host_ms)

    def _expert_flops(self, selections: int) -> float:
        """FLOPs of ``selections`` token-expert pairs (a SwiGLU expert: three matmuls)."""
        return 6.0 * self.size.hidden * self.size.intermediate * selections

    def _prewarm(
        self, now: float, index: int, row: np.ndarray, result: PolicyResult, usd: dict[str, float]
    ) -> None:
        """Pre-warm the functions of the predicted part of ``row`` that have no idle instance."""
        if self.prewarm is None or self.serverful or self.oracle:
            return
        routes = self._distinct_routes[self.layers[index]]
        experts = np.flatnonzero(row)
        predicted = self._prewarm_rng.random(len(experts)) < self.prewarm.hit_rate
        for expert in experts[predicted].tolist():
            names = routes[expert]
            if names is None:  # resident on the backbone
                continue
            for name in names:
                function = self.functions[name]
                if function.warming:
                    function.warming = [t for t in function.warming if now - t <= self.idle_timeout_s]
                self._expire(function, now)
                if (
                    function.warming
                    or _any_idle(function.provisioned_free_at, now)
                    or _any_idle(function.free_at, now)
                ):
                    continue
                cold_ms = self._cold_start_ms(now, function)
                function.warming.append(now + cold_ms / 1e3)
                result.prewarms += 1
                usd["requests"] += self.model.prices.per_request
                usd["duration"] += self.model.duration_usd(cold_ms, function.memory_mb)

    def _init_ms(self, function: _Function) -> float:
        """One environment's init: loading every expert the function hosts."""
        return self.model.cold_start_ms(self.size.weight_bytes * function.hosted)

    def _cold_start_ms(self, now: float, function: _Function) -> float:
        """A cold start of ``function`` beginning at ``now``: its own init, plus
        ``cold_start_serial_ms`` for every other one still initialising (they share the machine's
        cores locally; 0 on AWS)."""
        self._initialising = [t for t in self._initialising if t > now]
        cold_ms = self._init_ms(function) + len(self._initialising) * self.model.cold_start_serial_ms
        self._initialising.append(now + cold_ms / 1e3)
        return cold_ms

    def _room(self, at: float, function: _Function | None = None) -> bool:
        """Whether an invoke at ``at`` gets an environment within the account's concurrency: an
        idle provisioned one of ``function``, or room beside the on-demand ones running then and
        every provisioned one (allocated whether busy or not)."""
        if function is not None and _any_idle(function.provisioned_free_at, at):
            return True
        running = self._running
        while running and running[0] <= at:
            heapq.heappop(running)
        assert self.account_concurrency is not None
        return len(running) + self._provisioned_total < self.account_concurrency

    def _throttled(
        self,
        now: float,
        name: str,
        bundle: Sequence[int],
        result: PolicyResult,
        usd: dict[str, float],
        overhead_factor: float,
    ) -> float:
        """An invoke Lambda refused (429, not billed): retried after the dispatcher's backoff, each
        retry again only if there is room; after the last, the backbone's host serves the piece."""
        attempts, backoff_s = self.retries
        waited_s = 0.0
        for attempt in range(1, attempts):
            result.throttles += 1
            waited_s += backoff_s * 2 ** (attempt - 1)
            if self._room(now + waited_s, self.functions[name]):
                return waited_s * 1e3 + self._invoke(
                    now + waited_s, name, bundle, result, usd, overhead_factor
                )
        result.throttles += 1
        result.fallbacks += 1
        flops = self._expert_flops(sum(bundle))
        return waited_s * 1e3 + self.host.layer_ms(len(bundle), self.size.weight_bytes, flops)

    def _times(self, memory_mb: int, rows: int) -> tuple[float, float]:
        """(invoke overhead and transfer, expert compute) of ``rows`` rows at ``memory_mb``, ms
        (memoised: a whole-model run asks for the same few sizes millions of times)."""
        key = (memory_mb, rows)
        times = self._piece_ms.get(key)
        if times is None:
            size = self.size
            compute = self.model.expert_ms(
                rows, size.hidden, size.intermediate, self.model.vcpus(memory_mb), size.weight_bytes
            )
            times = self._piece_ms[key] = (
                self.model.invoke_ms(rows, size.hidden),
                compute / self.compute_speedup,
            )
        return times

    def _invoke(
        self,
        now: float,
        name: str,
        bundle: Sequence[int],
        result: PolicyResult,
        usd: dict[str, float],
        overhead_factor: float = 1.0,
    ) -> float:
        """One invoke on function ``name`` at ``now`` carrying ``bundle[i]`` rows for each of its
        experts (one, or several of one layer, computed one after another); returns its latency,
        ms (``overhead_factor`` scales its overhead and transfer: the machine's momentary load)."""
        function = self.functions[name]
        if self.account_concurrency is not None and not self.oracle and not self._room(now, function):
            return self._throttled(now, name, bundle, result, usd, overhead_factor)
        memory, piece_ms = function.memory_mb, self._piece_ms
        if len(bundle) == 1:  # (most invokes: one expert's piece)
            times = piece_ms.get((memory, bundle[0])) or self._times(memory, bundle[0])
            compute = times[1]
        else:
            compute = 0.0
            for rows in bundle:
                compute += (piece_ms.get((memory, rows)) or self._times(memory, rows))[1]
            times = piece_ms.get((memory, sum(bundle))) or self._times(memory, sum(bundle))
        busy_ms = times[0] * overhead_factor + compute
        result.invokes += 1
        usd["requests"] += self._per_request
        provisioned = False
        cold_ms = 0.0
        if self.oracle:
            start = now
        else:
            level, free = 1, -1
            for k, t in enumerate(function.provisioned_free_at):
                if t > now:
                    level += 1
                elif free < 0:
                    free = k
            # one pass over the on-demand instances: the busy ones, whether any idled out, and the
            # latest idle one (the one to reuse, unless idled-out ones are dropped). What the run
            # does depends only on the instances' times, not on their order in the list.
            free_at, timeout = function.free_at, self.idle_timeout_s
            expired, k, latest = False, -1, 0.0
            for j, t in enumerate(free_at):
                if t > now:
                    level += 1
                    continue
                if now - t > timeout:
                    expired = True
                if k < 0 or t > latest:
                    k, latest = j, t
            if free >= 0:
                provisioned = True
                function.provisioned_free_at[free] = now + busy_ms / 1e3
                start = now
            else:
                if expired and len(free_at) > function.keep_warm:  # idled-out ones beyond the pinged go
                    self._expire(function, now)
                    free_at = function.free_at
                    k, latest = -1, 0.0
                    for j, t in enumerate(free_at):
                        if t <= now and (k < 0 or t > latest):
                            k, latest = j, t
                if k >= 0:
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
                    cold_ms = self._cold_start_ms(now, function)
                    result.cold_starts += 1
                    function.free_at.append(0.0)
                    k = len(function.free_at) - 1
                    start = now + cold_ms / 1e3
                function.free_at[k] = start + busy_ms / 1e3
                if self.account_concurrency is not None:
                    heapq.heappush(self._running, function.free_at[k])
            if self.record_demand:  # by level, its cold starts as on-demand Lambda alone would have had them
                level_idle = self._levels.touch(name, level, now)
                demand = self._demand.get(name)
                if demand is None:
                    demand = self._demand[name] = LevelDemand()
                demand.add(level, busy_ms / 1e3, level_idle)
                if self.reprovision is not None:
                    self._window_demand.setdefault(name, LevelDemand()).add(level, busy_ms / 1e3, level_idle)
        usd["duration"] += self.model.duration_usd(compute + cold_ms, function.memory_mb, provisioned)
        if self.timeline:
            result.busy.append((start, start + busy_ms / 1e3))
        return (start - now) * 1e3 + busy_ms
