"""Where the optimiser may put experts besides Lambda: the backbone's GPU and its host, and how
many backbones the traffic needs.

A **tier** is one way to split the experts, each on the backbone it needs:

* ``lambda``: every expert a function, on the cheapest backbone that holds the dense part and the
  KV cache (moeless as the papers run it);
* ``host N%``: per layer, the experts that take the first N% of its tokens (hottest first) live on
  the backbone (its host's RAM, run by its CPUs), the rest are functions; the backbone is the
  cheapest instance whose RAM holds them, and whatever its GPU has to spare holds the hottest of
  them (``gpu``, run at HBM speed, already paid for);
* ``hybrid``: every expert on the host: the node KTransformers and llama.cpp users run, and the
  Remoe paper's own split; on the cheapest instance that holds them, and on each cheapest one whose
  host reads at least twice as fast as the last (a host's experts decode at its memory bandwidth);
* ``fleet``: every expert on the GPUs of the fleet that holds the model (one instance: an all-gpu
  plan on it; several: the pipeline ``static`` simulates).

With ``offload_rows`` a tier's host experts are also functions, and a layer's rows for one of them
go there from that many rows on: a prefill's rows spread over many environments, decode rows stay
on the host (one expert, two tiers, by phase).

The number of backbones is a decision too (:func:`backbones_needed`): the traffic's work at the
backbone (its prompts' prefill, its tokens' decode steps) over what one backbone does in the span,
at :data:`TARGET_UTILISATION`; every tier scales out the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from moeless.contracts.loads import Loads
from moeless.contracts.plan import ExpertPlacement, Placement, Plan
from moeless.errors import CatalogueError
from moeless.planning.cost_model import EXPERT_DTYPES
from moeless.planning.instances import CATALOGUE, USABLE_FRACTION, cheapest_backbone
from moeless.simulation.policies import Deployment
from moeless.simulation.simulator import Request

# the share of its span a backbone may be busy: queueing beyond it stretches TTFT without bound
# (an M/D/1 queue at 0.6 waits 0.75 service times on average): an assumption, judged by the
# simulator like everything else the optimiser chooses
TARGET_UTILISATION = 0.6
LAMBDA = "lambda"
HYBRID = "hybrid"
FLEET = "fleet"


@dataclass(frozen=True)
class Tier:
    """One split of the experts: ``resident`` on the backbone (gpu or host), the rest functions,
    on ``variant``'s backbones; resident host experts go to functions from ``offload_rows`` rows."""

    label: str
    variant: Deployment
    resident: dict[tuple[int, int], Placement]
    offload_rows: int | None = None

    def apply(self, plan: Plan) -> Plan:
        """``plan`` (every expert on functions) with this tier's residents on the backbone: their
        functions dropped, or kept where they offload."""
        keep = self.offload_rows is not None
        experts = []
        for p in plan.experts:
            tier = self.resident.get((p.layer, p.expert))
            if tier is None:
                experts.append(p)
            elif keep and tier == Placement.HOST and p.function is not None:
                experts.append(replace(p, placement=tier, offload_rows=self.offload_rows))
            else:
                experts.append(ExpertPlacement(p.layer, p.expert, tier, function=None, memory_mb=p.memory_mb))
        hosted = {(p.layer, p.expert) for p in experts if p.function is not None}
        functions = [
            replace(f, experts=[pair for pair in f.experts if pair in hosted])
            for f in plan.functions
            if any(pair in hosted for pair in f.experts)
        ]
        return replace(plan, experts=experts, functions=functions)


def tiers(
    deployment: Deployment,
    loads: Loads,
    host_shares: tuple[float, ...],
    offload_rows: tuple[int, ...],
    replay: list[Request],
    span_s: float,
    alternatives: bool = True,
) -> Iterator[Tier]:
    """Every tier the search holds on ``deployment``: Lambda alone, each host share (1.0: the hybrid
    node; each also offloading where ``offload_rows`` says), and with ``alternatives`` the fleet; a
    tier no single instance holds is left out."""
    yield _scaled(Tier(LAMBDA, deployment, {}), loads, replay, span_s)
    for share in sorted(set(host_shares)):
        faster = 0.0
        while (tier := _host_tier(deployment, loads, share, faster)) is not None:
            for rows in (None, *offload_rows):
                yield _scaled(replace(tier, offload_rows=rows), loads, replay, span_s)
            if tier.label != HYBRID:
                break
            faster = 2 * tier.variant.backbone.instance.host_memory_gbps
    if alternatives:
        resident = dict.fromkeys(_experts(loads), Placement.GPU)
        fleet = deployment.with_backbone(deployment.fleet.instance, deployment.fleet.count)
        yield _scaled(Tier(FLEET, fleet, resident), loads, replay, span_s)


def _experts(loads: Loads) -> list[tuple[int, int]]:
    return [(layer, e) for layer, load in loads.layers.items() for e in range(len(load))]


def _host_tier(deployment: Deployment, loads: Loads, share: float, min_host_gbps: float = 0.0) -> Tier | None:
    """The experts that take ``share`` of each layer's tokens, on the cheapest backbone that holds
    them (whose host reads at least ``min_host_gbps``; its spare GPU memory holds the hottest of
    them); ``None``: no instance does."""
    chosen: list[tuple[float, tuple[int, int]]] = []
    for layer, load in loads.layers.items():
        total = float(np.sum(load)) or 1.0
        taken = 0.0
        for expert in np.argsort(-np.asarray(load), kind="stable"):
            if share < 1.0 and taken >= share * total:
                break
            chosen.append((float(load[expert]) / total, (layer, int(expert))))
            taken += float(load[expert])
    host_bytes = len(chosen) * deployment.expert_size().weight_bytes
    dense = deployment.dense_bytes + deployment.kv_bytes
    try:
        instance = cheapest_backbone(dense, host_bytes, deployment.catalogue or CATALOGUE, min_host_gbps)
    except CatalogueError:
        return None
    spare = instance.gpu_memory_gb * 1e9 * USABLE_FRACTION - dense
    # the hybrid node runs every expert on its CPUs (what its users run); a tier that keeps some
    # on functions puts the hottest it holds in the GPU memory it has paid for anyway
    on_gpu = (
        0 if share >= 1.0 else int(max(0.0, spare) // deployment.shape.expert_bytes(deployment.gpu_dtype))
    )
    hottest = [key for _, key in sorted(chosen, key=lambda pair: -pair[0])]
    resident = {key: Placement.GPU if n < on_gpu else Placement.HOST for n, key in enumerate(hottest)}
    label = HYBRID if share >= 1.0 else f"host {share:.0%}"
    return Tier(label, deployment.with_backbone(instance), resident)


def _scaled(tier: Tier, loads: Loads, replay: list[Request], span_s: float) -> Tier:
    """``tier`` on as many backbones as its traffic needs."""
    backbone = tier.variant.backbone
    stages = backbone.count if tier.label == FLEET else 1
    count = stages * backbones_needed(tier, loads, replay, span_s)
    return replace(tier, variant=tier.variant.with_backbone(backbone.instance, count))


def backbones_needed(tier: Tier, loads: Loads, replay: list[Request], span_s: float) -> int:
    """How many backbones (whole fleets, for the fleet) ``replay`` keeps busy at most
    :data:`TARGET_UTILISATION`: per prompt token the dense part's arithmetic on the GPU and the
    resident experts' on the host's CPUs (a prefill's function rows run elsewhere, in parallel);
    per generated token a full batch's step (the dense part's weights read once, each resident
    expert the batch touches read once, at least the Lambda floor where functions serve a layer)
    shared by the batch, which generates its tokens per forward each (speculation). A lower bound
    on the work: the simulator judges the answer."""
    variant = tier.variant
    shape, instance = variant.shape, variant.backbone.instance
    stages = variant.backbone.count if tier.label == FLEET else 1
    gpu_flops = instance.tflops_16bit * 1e12 * 0.5 * stages
    gpu_bytes_s = instance.hbm_gbps * 1e9 * 0.8
    selections = shape.top_k * len(shape.moe_layers)
    shares = _resident_shares(tier, loads)
    expert_flops = 6.0 * shape.hidden * shape.expert_intermediate
    cpu_flops = instance.vcpus * variant.model.gflops_per_vcpu * 1e9
    cpu_flops *= EXPERT_DTYPES[variant.expert_dtype].compute_speedup
    prefill_s = 2 * shape.dense_params / gpu_flops + selections * expert_flops * (
        shares[Placement.HOST] / cpu_flops + shares[Placement.GPU] / gpu_flops
    )
    batch = variant.max_batch
    touched = len(shape.moe_layers) * shape.num_experts * (1 - (1 - shape.top_k / shape.num_experts) ** batch)
    step_s = variant.dense_bytes / gpu_bytes_s + touched * (
        shares[Placement.HOST] * variant.expert_size().weight_bytes / (instance.host_memory_gbps * 1e9)
        + shares[Placement.GPU] * shape.expert_bytes(variant.gpu_dtype) / gpu_bytes_s
    )
    if shares[Placement.FUNCTION] > 0:
        step_s = max(step_s, forward_floor_ms(variant, variant.model.function_memory_mb(0)) / 1e3)
    work_s = sum(r.prompt_tokens for r in replay) * prefill_s + sum(
        r.output_tokens for r in replay
    ) * step_s / (batch * variant.tokens_per_forward)
    return max(1, math.ceil(work_s / (max(span_s, 1e-9) * TARGET_UTILISATION)))


def _resident_shares(tier: Tier, loads: Loads) -> dict[Placement, float]:
    """The share of the tokens each tier serves (offloading host experts count as host)."""
    totals = dict.fromkeys(Placement, 0.0)
    layers = len(loads.layers) or 1
    for layer, load in loads.layers.items():
        total = float(np.sum(load)) or 1.0
        for expert, tokens in enumerate(np.asarray(load, dtype=float)):
            where = tier.resident.get((layer, expert), Placement.FUNCTION)
            totals[where] += tokens / total / layers
    return totals


def lambda_floor_ms(deployment: Deployment, memory_mb: int) -> float:
    """TPOT's floor on Lambda: a forward's floor (:func:`forward_floor_ms`) over the tokens a
    forward generates on average (1, or more with speculation)."""
    return forward_floor_ms(deployment, memory_mb) / deployment.tokens_per_forward


def forward_floor_ms(deployment: Deployment, memory_mb: int) -> float:
    """One decode forward's floor on Lambda: every MoE layer pays one warm invoke of one token and
    its expert."""
    model, size = deployment.model, deployment.expert_size()
    speedup = EXPERT_DTYPES[deployment.expert_dtype].compute_speedup
    expert = model.expert_ms(1, size.hidden, size.intermediate, model.vcpus(memory_mb), size.weight_bytes)
    return len(deployment.shape.moe_layers) * (model.invoke_ms(1, size.hidden) + expert / speedup)
