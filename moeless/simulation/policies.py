"""The serving policies compared on one deployment of a whole model, and what each runs on.

A :class:`Deployment` fixes the model's shape, the dtypes, the batch and context the serving path
admits, and the hardware both sides really need (:func:`~moeless.planning.instances.cheapest_fleet`):

* the **fleet** (``static``): the cheapest set of GPU instances whose memory holds every weight at
  the GPU dtype plus the KV cache of ``max_batch`` sequences of ``context_tokens``;
* the **backbone** (serverless policies): the cheapest instance that holds the dense part plus the
  same KV cache. Remoe keeps experts resident in the memory it has left (no extra GPU);
* the **hybrid** node: the cheapest single instance whose GPU holds the dense part and the KV cache
  and whose RAM holds every routed expert at the expert dtype, run by its CPUs (KTransformers,
  llama.cpp; the Remoe paper's own split), if one does.

Policies: ``static`` (the whole model on the fleet), ``hybrid`` (every expert on the hybrid node's
host), ``moeless`` (load-aware replicas, one function each, pre-warmed by the layer-aware
predictor), ``remoe`` (Remoe's optimiser: resident experts on the backbone's GPU, the rest as
functions, SPS pre-warming), ``oracle`` (moeless's plan with every replica warm and free: the bound).

A deployment with a drafter (``draft_acceptance``) and ``speculate`` = k verifies k drafts per
decoding sequence in every policy's forwards alike, the fleet's and the hybrid node's included, so
that the policies compare like for like (:mod:`moeless.simulation.speculation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from moeless.contracts.loads import Loads
from moeless.contracts.plan import Backbone, ExpertPlacement, Placement, Plan
from moeless.errors import CatalogueError, PlanError, SimulationError
from moeless.model.shapes import ModelShape
from moeless.planning.concurrency import ForecastReplanner
from moeless.planning.cost_model import EXPERT_DTYPES, CostModel, ExpertShape
from moeless.planning.instances import CATALOGUE, Fleet, Instance, cheapest_backbone, cheapest_fleet
from moeless.simulation.arrivals import Arrivals
from moeless.simulation.host import HostModel
from moeless.simulation.roofline import Hardware, Roofline
from moeless.simulation.routing import RecordedRouting, StepRouting
from moeless.simulation.simulator import GiveUp, GpuModel, PolicyResult, PrewarmModel, Request, Simulator
from moeless.simulation.speculation import Acceptance

POLICIES = ("static", "hybrid", "moeless", "remoe", "oracle")

# The predictors' accuracy measured on a real model's routing (gpt-oss-20b, all 24 layers, 70/30
# split by request: `moeless predict eval-routing ../shared/data/routing/gptoss20b_decode.npz`,
# benchmarks/routing_predictors.py; benchmarks/results/routing_predictors.md): moeless
# pre-warms one layer ahead with the cross-layer net (hit rate 0.751 at d = 1); remoe at arrival
# with SPS (set recall 0.683). The
# defaults only: ``moeless simulate --prewarm-eval POLICY=EVAL.json`` replaces them.
PREDICTORS = {
    "moeless": PrewarmModel(hit_rate=0.751, lead="layer"),
    "remoe": PrewarmModel(hit_rate=0.683, lead="request"),
}

DEFAULT_CONTEXT_TOKENS = 8192


@dataclass(frozen=True)
class Deployment:
    """One model, its dtypes and batch, and the hardware each side needs for it."""

    shape: ModelShape
    expert_dtype: str  # the functions' ONNX experts: fp32 | fp16 | int8
    gpu_dtype: str  # weights on the GPUs
    max_batch: int
    context_tokens: int
    fleet: Fleet
    backbone: Fleet
    model: CostModel
    prefill_chunk: int | None = None  # prompt tokens per engine step (chunked prefill); None: whole
    hybrid: Fleet | None = None  # the hybrid node (None: no single instance's RAM holds the experts)
    account_concurrency: int | None = None  # Lambda's concurrent executions (None: not limited)
    catalogue: dict[str, Instance] | None = None  # where backbones are chosen from (None: CATALOGUE)
    speculate: int = 0  # drafts each decoding sequence verifies per forward (0: no speculation)
    draft_acceptance: Acceptance | None = None  # its drafter's acceptance (None: no drafter)

    def __post_init__(self) -> None:
        if self.speculate < 0 or (self.speculate and self.draft_acceptance is None):
            raise SimulationError(
                f"speculate {self.speculate}: 0, or a number of drafts with the drafter's acceptance"
            )

    @classmethod
    def choose(
        cls,
        shape: ModelShape,
        expert_dtype: str = "fp32",
        gpu_dtype: str = "native",
        max_batch: int = 16,
        context_tokens: int = DEFAULT_CONTEXT_TOKENS,
        catalogue: dict[str, Instance] | None = None,
        model: CostModel | None = None,
        prefill_chunk: int | None = None,
        speculate: int = 0,
        draft_acceptance: Acceptance | None = None,
    ) -> Deployment:
        """Size both sides of ``shape`` and pick their cheapest instances."""
        if expert_dtype not in EXPERT_DTYPES:
            raise SimulationError(f"--expert-dtype {expert_dtype!r}: choose from {', '.join(EXPERT_DTYPES)}")
        dtype = shape.native_dtype if gpu_dtype == "native" else gpu_dtype
        kv = max_batch * context_tokens * shape.kv_bytes_per_token
        dense = shape.dense_bytes(_dense_dtype(dtype))
        experts = shape.expert_bytes(dtype) * shape.num_experts * len(shape.moe_layers)
        catalogue = catalogue or CATALOGUE
        backbone = serving_fleet(dense + kv, catalogue)
        host_experts = shape.routed_params * EXPERT_DTYPES[expert_dtype].memory_bytes
        try:
            hybrid: Fleet | None = Fleet(cheapest_backbone(dense + kv, host_experts, catalogue), 1)
        except CatalogueError:
            hybrid = None
        return cls(
            shape,
            expert_dtype,
            dtype,
            max_batch,
            context_tokens,
            serving_fleet(dense + experts + kv, catalogue),
            backbone,
            replace(model or CostModel(), gpu=backbone.instance),  # what Remoe prices residency at
            prefill_chunk,
            hybrid,
            catalogue=catalogue,
            speculate=speculate,
            draft_acceptance=draft_acceptance,
        )

    def with_backbone(self, instance: Instance, count: int = 1) -> Deployment:
        """This deployment on ``count`` backbones of ``instance`` (each serves its share of the
        sequences; resident experts are priced at its GPU)."""
        return replace(self, backbone=Fleet(instance, count), model=replace(self.model, gpu=instance))

    def for_plan(self, plan: Plan) -> Deployment:
        """This deployment on the backbones ``plan`` was sized for (itself if it names none)."""
        if plan.backbone is None:
            return self
        catalogue = self.catalogue or CATALOGUE
        instance = catalogue.get(plan.backbone.instance)
        if instance is None:
            raise SimulationError(
                f"the plan was sized for a {plan.backbone.instance} backbone, which the instance "
                "catalogue does not list: pass the catalogue it was planned with (--instances)"
            )
        if (instance, plan.backbone.count) == (self.backbone.instance, self.backbone.count):
            return self
        return self.with_backbone(instance, plan.backbone.count)

    def host_model(self) -> HostModel:
        """The backbone's host as it runs host-tier experts: its vCPUs at the per-vCPU rate measured
        here (``CostModel.gflops_per_vcpu``), its usable memory bandwidth."""
        instance = self.backbone.instance
        return HostModel(
            instance.vcpus,
            instance.host_memory_gbps,
            self.model.gflops_per_vcpu,
            compute_speedup=EXPERT_DTYPES[self.expert_dtype].compute_speedup,
        )

    @property
    def dense_bytes(self) -> float:
        """The dense part's bytes on the GPUs (a 4-bit expert format keeps attention in bf16)."""
        return self.shape.dense_bytes(_dense_dtype(self.gpu_dtype))

    @property
    def tokens_per_forward(self) -> float:
        """Tokens a decoding sequence generates per forward on average (1 without speculation)."""
        if not self.speculate or self.draft_acceptance is None:
            return 1.0
        return self.draft_acceptance.expected_tokens(self.speculate)

    @property
    def kv_bytes(self) -> float:
        return self.max_batch * self.context_tokens * self.shape.kv_bytes_per_token

    def expert_size(self) -> ExpertShape:
        """One routed expert as a function holds it (bytes in memory at the expert dtype)."""
        per_param = EXPERT_DTYPES[self.expert_dtype].memory_bytes
        return ExpertShape(
            self.shape.hidden, self.shape.expert_intermediate, self.shape.expert_params * per_param
        )

    def gpu_model(self) -> GpuModel:
        shape = self.shape
        return GpuModel(
            blocks=shape.num_layers,
            dense_bytes=self.dense_bytes,
            dense_params=shape.dense_params - shape.embedding_params,  # a lookup is no matmul
            kv_bytes_per_token=shape.kv_bytes_per_token,
            attention_flops=shape.attention_flops_per_token_per_context,
            expert_bytes=shape.expert_bytes(self.gpu_dtype),
            expert_params=shape.expert_params,
        )

    def hardware(self, serverful: bool) -> Hardware:
        """The fleet as ``count`` pipelined step loops at one instance's roofline, or the backbone."""
        fleet = self.fleet if serverful else self.backbone
        instance = fleet.instance
        return Hardware(
            fleet.label(),
            fleet.hourly_usd,
            Roofline(instance.hbm_gbps, instance.tflops_16bit),
            loops=fleet.count,
        )

    def spare_backbone_gb(self) -> float:
        """GPU memory the backbone has left for resident experts, GB."""
        used = self.dense_bytes + self.kv_bytes
        return max(0.0, (self.backbone.memory_bytes - used) / 1e9)

    def params(self) -> dict[str, Any]:
        """What a plan sized on this deployment records of it (``simulate --plan`` checks them)."""
        return {
            "model": self.shape.name,
            "expert_dtype": self.expert_dtype,
            "gpu_dtype": self.gpu_dtype,
            "max_batch": self.max_batch,
            "context_tokens": self.context_tokens,
            "prefill_chunk": self.prefill_chunk,
            "speculate": self.speculate,
            "draft_acceptance": self.draft_acceptance.to_json() if self.draft_acceptance else None,
            "backbone": self.backbone.label(),
            "fleet": self.fleet.label(),
            "hybrid": self.hybrid.label() if self.hybrid else None,
        }

    def describe(self) -> list[str]:
        shape = self.shape
        return [
            f"- model: {shape.name}: {shape.num_layers} blocks, {len(shape.moe_layers)} MoE layers x "
            f"{shape.num_experts} experts, top-{shape.top_k}, "
            f"expert {shape.hidden} x {shape.expert_intermediate}; {shape.total_params / 1e9:.1f}B "
            f"parameters ({shape.dense_params / 1e9:.2f}B dense); {shape.source}",
            f"- GPU weights in {self.gpu_dtype}; experts as functions in {self.expert_dtype}; "
            f"continuous batching up to {self.max_batch} sequences, "
            + (
                f"prompts prefilled {self.prefill_chunk} tokens per step"
                if self.prefill_chunk
                else "each prompt prefilled in one step"
            )
            + f"; KV cache sized for {self.context_tokens} tokens each ({self.kv_bytes / 1e9:.1f} GB)",
            *([f"- speculation: {self.speculation_line()}"] if self.draft_acceptance else []),
            f"- serverful fleet (static): {self.fleet.label()} (${self.fleet.hourly_usd:.2f}/h), "
            f"the cheapest that holds every weight and the KV cache",
            f"- serverless backbone: {self.backbone.label()} (${self.backbone.hourly_usd:.2f}/h), "
            f"the cheapest that holds the dense part and the KV cache; "
            f"{self.spare_backbone_gb():.1f} GB left for Remoe's resident experts",
            f"- hybrid node: {self.hybrid.label()} (${self.hybrid.hourly_usd:.2f}/h), the cheapest whose "
            f"GPU holds the dense part and the KV cache and whose RAM holds every expert in "
            f"{self.expert_dtype}"
            if self.hybrid
            else f"- hybrid node: none: no single instance's RAM holds every expert in {self.expert_dtype}",
        ]

    def speculation_line(self) -> str:
        """What the deployment drafts, and the tokens per forward it expects of it."""
        if self.draft_acceptance is None:
            return "none (one token per decoding sequence per forward)"
        if not self.speculate:
            return f"off; a drafter of {self.draft_acceptance.describe()}"
        return (
            f"k={self.speculate} drafts per decoding sequence verified in each forward, "
            f"{self.tokens_per_forward:.2f} tokens per forward; {self.draft_acceptance.describe()}"
        )

    def sources(self) -> list[str]:
        hardware = self.hardware(True).roofline
        return [
            *self.model.sources(),
            f"GPU step time: {hardware.describe()} "
            "(moeless/simulation/roofline.py: the efficiencies are assumptions)",
            f"fleet instance: {self.fleet.instance.source}",
            f"backbone instance: {self.backbone.instance.source}; host: {self.backbone.instance.host_source}",
            f"{self.host_model().describe()} (moeless/simulation/host.py)",
            f"expert dtype {self.expert_dtype}: {EXPERT_DTYPES[self.expert_dtype]} "
            "(benchmarks/expert_runtime.py)",
        ]


def serving_fleet(bytes_needed: float, catalogue: dict[str, Instance]) -> Fleet:
    """Where a model that needs ``bytes_needed`` of GPU memory is served: the cheapest single
    instance that holds it (its GPUs share the model by tensor parallelism over their own links),
    else the cheapest set of full 8-GPU nodes (a pipeline across the network). Many one-GPU
    instances joined over the network are not how a model is served, however cheap."""
    from moeless.errors import CatalogueError

    try:
        return cheapest_fleet(bytes_needed, catalogue, max_instances=1)
    except CatalogueError:
        nodes = {name: i for name, i in catalogue.items() if i.gpus >= 8}
        return cheapest_fleet(bytes_needed, nodes or catalogue)


def _dense_dtype(dtype: str) -> str:
    """The dense part's dtype: a 4-bit expert format (gpt-oss's mxfp4) keeps attention in bf16."""
    return "bf16" if dtype == "mxfp4" else dtype


def plan_for_policy(name: str, loads: Loads, deployment: Deployment) -> Plan:
    """The plan ``name`` serves with on ``deployment`` (planned for ``loads``, on the model's layers)."""
    from moeless.planning.planner import PlanRequest, make_plan
    from moeless.planning.remoe import Workload

    top_k = deployment.shape.top_k
    work = Workload(top_k=top_k, batch_tokens=deployment.max_batch)
    shape = deployment.expert_size()
    if name == "static":
        return Plan("static", [], [])
    if name == "hybrid":
        return all_on_host(loads, deployment)
    if name == "remoe":
        request = PlanRequest(
            "remoe", memory_gb=deployment.spare_backbone_gb(), workload=work, model=deployment.model
        )
    elif name in ("moeless", "oracle"):
        request = PlanRequest("moeless", workload=work, model=deployment.model)
    else:
        raise SimulationError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    try:
        return make_plan(loads, request, shape=shape)
    except PlanError as exc:
        raise SimulationError(f"{name} cannot plan this deployment: {exc}") from None


def all_on_host(loads: Loads, deployment: Deployment) -> Plan:
    """The hybrid node's plan: every expert in its host's RAM, run by its CPUs."""
    if deployment.hybrid is None:
        raise SimulationError(
            f"no single instance's RAM holds every expert in {deployment.expert_dtype}: no hybrid node "
            "(a smaller --expert-dtype, or your own --catalogue)"
        )
    experts = [
        ExpertPlacement(layer, expert, Placement.HOST)
        for layer, load in loads.layers.items()
        for expert in range(len(load))
    ]
    hybrid = deployment.hybrid
    return Plan("hybrid", experts, [], backbone=Backbone(hybrid.instance.name, hybrid.count))


def on_hardware(name: str, deployment: Deployment) -> Deployment:
    """The deployment a policy runs on: the hybrid policy on the hybrid node."""
    if name == "hybrid":
        if deployment.hybrid is None:
            raise SimulationError(f"no single instance's RAM holds every expert in {deployment.expert_dtype}")
        return replace(deployment, backbone=deployment.hybrid)
    return deployment


def simulate_policy(
    name: str,
    deployment: Deployment,
    routing: StepRouting,
    replay: list[Request],
    duration_s: float,
    *,
    progress: bool = False,
    replan_s: float | None = None,
    predictors: bool = True,
    prewarm: dict[str, PrewarmModel] | None = None,
    seed: int = 0,
    timeline: bool = True,
    plan: Plan | None = None,
    warm_up: bool = False,
    give_up: GiveUp | None = None,
    record_demand: bool = True,
) -> PolicyResult:
    """Plan ``name`` for the routing's loads (or take ``plan`` as it is) and replay the requests
    through it.

    With ``replan_s`` the serverless policies re-plan from the loads of each window of that length;
    with ``predictors`` moeless and remoe pre-warm what their predictor foresees (``prewarm``, a
    policy -> model map measured by ``predict eval``; ``PREDICTORS`` where it names none); with
    ``warm_up`` the deployment's warm-up pass runs before the first request; with ``give_up`` the run
    stops once it certainly misses those bounds. A given plan that asks for the forecasting
    re-planner (``params["replan"]``) runs with it.
    """
    reprovision = None
    deployment = on_hardware(name, deployment)
    if plan is None:
        plan = plan_for_policy(name, routing.loads(), deployment)
    else:
        if name != "static":
            deployment = deployment.for_plan(plan)
        if (reprovision := ForecastReplanner.from_plan(plan)) is not None:
            replan_s = float(plan.params["replan"]["interval_s"])
    serverful = name == "static"
    oracle = name == "oracle"

    def replan(window: Loads) -> Plan:
        return plan_for_policy(name, window, deployment)

    use_replan = replan_s is not None and not serverful and not oracle and reprovision is None
    result = Simulator(
        plan,
        routing,
        deployment.expert_size(),
        deployment.model,
        deployment.gpu_model(),
        deployment.hardware(serverful),
        serverful=serverful,
        oracle=oracle,
        max_batch=deployment.max_batch,
        prefill_chunk=deployment.prefill_chunk,
        compute_speedup=EXPERT_DTYPES[deployment.expert_dtype].compute_speedup,
        replan=replan if use_replan else None,
        reprovision=reprovision,
        replan_s=replan_s or 60.0,
        prewarm=(PREDICTORS | (prewarm or {})).get(name) if predictors else None,
        seed=seed,
        timeline=timeline,
        warm_up=warm_up,
        record_demand=record_demand,
        host=deployment.host_model(),
        account_concurrency=deployment.account_concurrency,
        speculate=deployment.speculate,
        acceptance=deployment.draft_acceptance,
    ).run(replay, duration_s, progress, give_up=give_up)
    result.policy = name
    return result


def requests_for(arrivals: Arrivals) -> list[Request]:
    """The simulated requests of ``arrivals``: the n-th replays routing source ``n`` (a recorded
    routing cycles through the requests it holds)."""
    return [
        Request(float(t), int(p), int(o), n)
        for n, (t, p, o) in enumerate(
            zip(arrivals.times_s, arrivals.input_tokens, arrivals.output_tokens, strict=True)
        )
    ]


def requests_replaying(times: np.ndarray, routing: RecordedRouting) -> list[Request]:
    """Requests at ``times`` that replay the recorded requests in turn, each with its recorded
    prompt and output length (so its prefill replays the recorded rows)."""
    count = len(routing.lengths)
    return [Request(float(t), *routing.lengths[n % count], n) for n, t in enumerate(times)]


def crossover_rate(rates: list[float], serverless_usd: list[float], fleet_usd: list[float]) -> float | None:
    """The lowest request rate at which the fleet's cost per request falls below the serverless
    policy's (linear interpolation between the rates measured); ``None`` if it never does."""
    for n, (ours, theirs) in enumerate(zip(serverless_usd, fleet_usd, strict=True)):
        if theirs <= ours:
            if n == 0:
                return rates[0]
            a0, b0 = serverless_usd[n - 1] - fleet_usd[n - 1], ours - theirs
            if math.isclose(a0, b0):
                return rates[n]
            return rates[n - 1] + (rates[n] - rates[n - 1]) * a0 / (a0 - b0)
    return None
