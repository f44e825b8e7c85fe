"""``moeless plan``: turn expert loads into a plan with one of three policies.

* ``static`` — serverful expert parallelism, the baseline: experts in contiguous blocks over W
  workers, one replica each, every worker always on.
* ``moeless`` — MoEless: the expert scaler replicates hot experts (all ``--slots`` on
  expert-parallel workers; otherwise until the load is even, see
  :func:`moeless.planning.placement.scale_replicas`), the placer balances per-worker load and, given the
  previous plan, keeps replicas where they run when that costs little balance.
* ``remoe`` — Remoe: backbone-resident vs serverless, memory size and replicas from the
  Lagrangian dual of the cost/memory/latency problem, makespan packing, MMP (:mod:`moeless.planning.remoe`).

Functions: with ``--workers W`` each (layer, worker) is one function hosting that worker's
replicas; without, each expert is its own function and its replicas are concurrent execution
environments of it (the dispatcher splits its tokens into that many invokes; provisioned
concurrency keeps that many warm).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from moeless.contracts.loads import Loads, shares
from moeless.contracts.manifest import Manifest
from moeless.contracts.plan import (
    ExpertPlacement,
    FunctionSpec,
    Placement,
    Plan,
    PlanEstimate,
    Policy,
    function_name,
)
from moeless.errors import PlanError
from moeless.model.shapes import shape_for_loads
from moeless.planning.cost_model import CostModel, ExpertShape
from moeless.planning.placement import (
    Assignment,
    balancedness,
    contiguous,
    place,
    place_warm,
    replicate,
    scale_replicas,
    worker_loads,
)
from moeless.planning.remoe import Workload, pack_makespan, solve

POLICIES = tuple(Policy)
# The shape make_plan gives loads built in code that name no model: Mixtral-8x7B's expert, fp32.
LIBRARY_SHAPE = ExpertShape(4096, 14336, 3.0 * 4096 * 14336 * 4)


@dataclass
class PlanRequest:
    """Everything a policy needs besides the loads."""

    policy: str
    workers: int | None = None
    slots: int | None = None
    memory_gb: float | None = None
    slo_ms: float | None = None
    workload: Workload = field(default_factory=lambda: Workload(top_k=2))
    model: CostModel = field(default_factory=CostModel)
    cv_threshold: float = 0.2
    tokens_per_request: int = 256
    previous: Plan | None = None


def expert_shape(
    loads: Loads,
    manifest: Manifest | None,
    hidden: int | None = None,
    intermediate: int | None = None,
    model: str | None = None,
) -> tuple[ExpertShape, str]:
    """The experts' size (fp32 weights, as packaged) with its source: from the artifacts, else
    ``hidden`` and ``intermediate`` when both are given, else ``model`` (a ``--model`` value) or the
    model the loads name (:func:`moeless.model.shapes.shape_for_loads`), either size overriding its.

    Raises:
        ModelShapeError: no shape can be had: pass ``--model`` (never a silent default).
    """
    if manifest is not None:
        h, i = manifest.hidden_size, manifest.intermediate_size
        size = float(np.mean([e.bytes for e in manifest.experts]))
        return ExpertShape(hidden or h, intermediate or i, size), "artifacts manifest"
    if hidden and intermediate and not model:  # both sizes given: no model needed
        return ExpertShape(hidden, intermediate, 3.0 * hidden * intermediate * 4), "given sizes"
    whole = shape_for_loads(loads.meta, model)
    if hidden or intermediate:
        whole = replace(
            whole,
            hidden=hidden or whole.hidden,
            expert_intermediate=intermediate or whole.expert_intermediate,
        )
    return ExpertShape(whole.hidden, whole.expert_intermediate, whole.expert_bytes("fp32")), whole.source


def make_plan(
    loads: Loads, request: PlanRequest, manifest: Manifest | None = None, shape: ExpertShape | None = None
) -> Plan:
    """Plan every layer of ``loads`` with ``request.policy``.

    ``shape`` defaults to :func:`expert_shape` of the loads (an unknown model is an error); loads that
    name no model at all, built in code, are planned with :data:`LIBRARY_SHAPE` (the CLI never does
    that: it asks for ``--model``).
    """
    if request.policy not in POLICIES:
        raise PlanError(f"unknown policy {request.policy!r}; choose one of {', '.join(POLICIES)}")
    if manifest is not None and manifest.num_experts != loads.num_experts:
        raise PlanError(
            f"the loads have {loads.num_experts} experts per layer, the artifacts {manifest.num_experts}"
        )
    if request.workers is not None and request.workers < 1:
        raise PlanError("--workers must be at least 1")
    if request.policy == Policy.STATIC and not request.workers:
        raise PlanError("the static policy lays experts over expert-parallel workers: give --workers W")
    layers = _layers(loads, manifest)
    if shape is None:
        headerless = manifest is None and not loads.meta.get("model")
        shape = LIBRARY_SHAPE if headerless else expert_shape(loads, manifest)[0]
    started = time.perf_counter()
    if request.policy == Policy.REMOE:
        plan = _remoe(layers, request, shape)
    else:
        plan = _replicated(layers, request, shape)
    plan.estimate = replace(
        estimate(plan, layers, request, shape), plan_seconds=round(time.perf_counter() - started, 4)
    )
    return plan


def _layers(loads: Loads, manifest: Manifest | None) -> dict[int, np.ndarray]:
    if manifest is None:
        return loads.layers
    moe_layers = list(manifest.moe_layers)
    if set(loads.layers) <= set(moe_layers):
        return loads.layers
    if len(loads.layers) == len(moe_layers):  # loads numbered 0..n-1: map onto the model's MoE layers
        return dict(zip(moe_layers, loads.layers.values(), strict=True))
    raise PlanError(
        f"the loads' layers {sorted(loads.layers)} are not the artifacts' MoE layers {moe_layers}"
    )


def _slots(request: PlanRequest, experts: int) -> int:
    workers = request.workers or 1
    slots = request.slots if request.slots is not None else experts
    if slots < experts:
        raise PlanError(
            f"--slots {slots} is below the {experts} experts of a layer: every expert needs a replica"
        )
    return math.ceil(slots / workers) * workers


def _replicated(layers: dict[int, np.ndarray], request: PlanRequest, shape: ExpertShape) -> Plan:
    model, work = request.model, request.workload
    experts: list[ExpertPlacement] = []
    functions: list[FunctionSpec] = []
    moved_total = 0
    balance: list[float] = []
    for layer, load in layers.items():
        count = len(load)
        if request.policy == Policy.STATIC:
            counts = np.ones(count, dtype=np.int64)
            workers = request.workers or count
            assignment: Assignment = contiguous(count, workers)
        else:
            workers = request.workers or 0
            if request.slots is not None and workers:
                counts = replicate(load, _slots(request, count))
            else:
                budget = _memory_slots(request, shape, count) or 2 * count
                counts = scale_replicas(load, budget, max(workers, 1), request.cv_threshold)
            if workers:
                capacity = math.ceil(int(counts.sum()) / workers)
                previous = _previous_assignment(request.previous, layer, count)
                if previous is not None:
                    warm = place_warm(load, counts, workers, capacity, previous)
                    assignment, moved_total = warm.assignment, moved_total + warm.moved
                else:
                    assignment = place(load, counts, workers, capacity)
            else:
                assignment = [list(range(int(c))) for c in counts]  # replica k of e -> its own function
        if request.workers:
            balance.append(balancedness(worker_loads(load, counts, assignment, request.workers)))
        active = 1.0 - (1.0 - shares(load)) ** (work.top_k * work.batch_tokens)
        experts_here, functions_here = _functions_for_layer(
            layer, counts, assignment, bool(request.workers), active, request, shape, model
        )
        experts += experts_here
        functions += functions_here
    params = _params(request) | ({"warm_start_moved_replicas": moved_total} if request.previous else {})
    if balance:
        params["balancedness"] = round(float(np.mean(balance)), 6)
    return Plan(request.policy, experts, functions, params=params, workers=request.workers)


def _memory_slots(request: PlanRequest, shape: ExpertShape, experts: int) -> int | None:
    if request.memory_gb is None:
        return None
    per_replica = request.model.function_memory_mb(shape.weight_bytes) / 1024
    slots = int(request.memory_gb / per_replica)
    if slots < experts:
        raise PlanError(
            f"--memory-gb {request.memory_gb} holds {slots} functions of {per_replica:.1f} GB; "
            f"every one of the {experts} experts needs one"
        )
    return slots


def _previous_assignment(previous: Plan | None, layer: int, experts: int) -> Assignment | None:
    if previous is None:
        return None
    rows = {p.expert: p.workers for p in previous.experts if p.layer == layer}
    if len(rows) != experts or not all(rows.values()):
        return None
    return [list(rows[e]) for e in range(experts)]


def _functions_for_layer(
    layer: int,
    counts: np.ndarray,
    assignment: Assignment,
    by_worker: bool,
    active: np.ndarray,
    request: PlanRequest,
    shape: ExpertShape,
    model: CostModel,
) -> tuple[list[ExpertPlacement], list[FunctionSpec]]:
    threshold = request.workload.warm_threshold
    always_on = request.policy == Policy.STATIC
    experts, functions = [], []
    if by_worker:
        hosted: dict[int, list[int]] = {}
        for e, placed in enumerate(assignment):
            for w in placed:
                if e not in hosted.setdefault(w, []):
                    hosted[w].append(e)
        names = {w: f"moeless-l{layer:03d}-w{w:02d}" for w in hosted}
        for w, members in sorted(hosted.items()):
            memory = model.function_memory_mb(shape.weight_bytes * len(members))
            warm = 1 if always_on or any(active[e] >= threshold for e in members) else 0
            functions.append(FunctionSpec(names[w], [(layer, e) for e in members], memory, warm))
        for e, placed in enumerate(assignment):
            first = names[placed[0]]
            spec = next(f for f in functions if f.name == first)
            experts.append(
                ExpertPlacement(
                    layer,
                    e,
                    "function",
                    int(counts[e]),
                    list(placed),
                    first,
                    spec.memory_mb,
                    sum(1 for f in functions if (layer, e) in f.experts and f.provisioned_concurrency),
                )
            )
        return experts, functions
    memory = model.function_memory_mb(shape.weight_bytes)
    for e, c in enumerate(counts):  # one function per expert; its c replicas are c environments of it
        warm = int(c) if always_on or active[e] >= threshold else 0
        name = function_name(layer, e)
        functions.append(FunctionSpec(name, [(layer, e)], memory, warm))
        experts.append(ExpertPlacement(layer, e, Placement.FUNCTION, int(c), [], name, memory, warm))
    return experts, functions


def _remoe(layers: dict[int, np.ndarray], request: PlanRequest, shape: ExpertShape) -> Plan:
    model, work = request.model, request.workload
    slo = request.slo_ms if request.slo_ms is not None else 100.0
    memory = (request.memory_gb if request.memory_gb is not None else model.gpu.gpu_memory_gb / 2) * 1e9
    solution = solve({layer: shares(load) for layer, load in layers.items()}, shape, work, model, slo, memory)
    experts: list[ExpertPlacement] = []
    functions: list[FunctionSpec] = []
    for layer, load in layers.items():
        tokens = shares(load) * work.top_k * work.batch_tokens
        jobs: list[tuple[int, int]] = []  # (expert, replica)
        for e in range(len(load)):
            choice = solution.choices[(layer, e)]
            if choice.placement == Placement.GPU:
                experts.append(ExpertPlacement(layer, e, Placement.GPU, 1, [], None, 0, 0))
            else:
                jobs += [(e, k) for k in range(choice.replicas)]
        if request.workers and jobs:
            times = [
                model.expert_ms(
                    tokens[e] / solution.choices[(layer, e)].replicas,
                    shape.hidden,
                    shape.intermediate,
                    model.vcpus(solution.choices[(layer, e)].memory_mb),
                    shape.weight_bytes,
                )
                for e, _ in jobs
            ]
            worker_of, _ = pack_makespan(times, request.workers)
        else:  # one function per expert, hosting all its replicas as concurrent environments
            worker_of = [e for e, _ in jobs]
        members: dict[int, list[int]] = {}
        replica_workers: dict[int, list[int]] = {}
        for (e, _), w in zip(jobs, worker_of, strict=True):
            replica_workers.setdefault(e, []).append(w)
            if e not in members.setdefault(w, []):
                members[w].append(e)
        by_worker = bool(request.workers)
        layer_functions: list[FunctionSpec] = []
        for w, hosted in sorted(members.items()):
            name = f"moeless-l{layer:03d}-w{w:02d}" if by_worker else function_name(layer, w)
            memory_mb = max(solution.choices[(layer, e)].memory_mb for e in hosted)
            if by_worker:
                memory_mb = max(memory_mb, model.function_memory_mb(shape.weight_bytes * len(hosted)))
                warm = max(1 if solution.choices[(layer, e)].provisioned else 0 for e in hosted)
            else:
                warm = solution.choices[(layer, w)].provisioned
            layer_functions.append(FunctionSpec(name, [(layer, e) for e in hosted], memory_mb, warm))
        functions += layer_functions
        hosting_of: dict[int, list[str]] = {}
        for spec in layer_functions:
            for _, e in spec.experts:
                hosting_of.setdefault(e, []).append(spec.name)
        for e, ws in sorted(replica_workers.items()):
            choice = solution.choices[(layer, e)]
            hosting = hosting_of[e]
            experts.append(
                ExpertPlacement(
                    layer,
                    e,
                    "function",
                    choice.replicas,
                    ws if by_worker else [],
                    hosting[0],
                    choice.memory_mb,
                    choice.provisioned,
                )
            )
    experts.sort(key=lambda p: (p.layer, p.expert))
    params = _params(request) | {
        "slo_ms": slo,
        "memory_gb": memory / 1e9,
        "lagrange_multiplier": solution.multiplier,
        "dual_usd_per_s": solution.dual_value,
        "primal_usd_per_s": solution.primal_value,
        "mmp_gb": solution.mmp_bytes / 1e9,
        "resident_gb": solution.resident_bytes / 1e9,
        "backbone_preallocated_gb": (solution.mmp_bytes + solution.resident_bytes) / 1e9,
    }
    return Plan("remoe", experts, functions, params=params, workers=request.workers)


def _params(request: PlanRequest) -> dict[str, Any]:
    work = request.workload
    return {
        "workers": request.workers,
        "slots": request.slots,
        "memory_gb": request.memory_gb,
        "slo_ms": request.slo_ms,
        "cv_threshold": request.cv_threshold,
        "top_k": work.top_k,
        "batch_tokens": work.batch_tokens,
        "steps_per_s": work.steps_per_s,
        "warm_threshold": work.warm_threshold,
        "tokens_per_request": request.tokens_per_request,
    }


def estimate(
    plan: Plan, layers: dict[int, np.ndarray], request: PlanRequest, shape: ExpertShape
) -> PlanEstimate:
    """Cost per 1k requests and per-token MoE latency from the cost model (its sources included).

    A step moves ``batch_tokens`` tokens through every layer; a replica gets its expert's tokens
    divided by its replica count. ``static`` is priced as always-on GPU workers; the others as
    Lambda invokes, provisioned concurrency, and the backbone GPU's memory for resident experts.
    """
    model, work = request.model, request.workload
    by_key = {(p.layer, p.expert): p for p in plan.experts}
    function_memory = {f.name: f.memory_mb for f in plan.functions}
    latency_ms = 0.0
    usd_per_step = 0.0
    for layer, load in layers.items():
        share = shares(load)
        tokens = share * work.top_k * work.batch_tokens
        active = 1.0 - (1.0 - share) ** (work.top_k * work.batch_tokens)
        per_worker: dict[int, float] = {}
        slowest = 0.0
        backbone_ms = 0.0
        for e in range(len(load)):
            p = by_key[(layer, e)]
            if p.resident:
                backbone_ms += model.backbone_expert_ms(
                    tokens[e], shape.hidden, shape.intermediate, shape.weight_bytes
                )
                continue
            memory = function_memory.get(p.function or "", p.memory_mb) or p.memory_mb
            if plan.policy == Policy.STATIC:  # serverful: each worker is a GPU running its experts in turn
                t = model.backbone_expert_ms(tokens[e], shape.hidden, shape.intermediate, shape.weight_bytes)
            else:
                vcpus = model.vcpus(memory)
                t = model.expert_ms(
                    tokens[e] / p.replicas, shape.hidden, shape.intermediate, vcpus, shape.weight_bytes
                )
            slowest = max(slowest, t)
            for w in p.workers:
                per_worker[w] = per_worker.get(w, 0.0) + t
            if plan.policy != Policy.STATIC:
                usd_per_step += (
                    active[e] * p.replicas * model.invoke_usd(t, memory, p.provisioned_concurrency > 0)
                )
        function_ms = max(per_worker.values()) if per_worker and plan.policy == Policy.STATIC else slowest
        overhead = model.invoke_overhead_ms if plan.policy != Policy.STATIC else 0.0
        latency_ms += max(function_ms + overhead, backbone_ms)
    usd_per_s = 0.0
    if plan.policy == Policy.STATIC:
        usd_per_s = (plan.workers or 1) * model.gpu.hourly_usd / 3600
    else:
        usd_per_s += sum(
            model.provisioned_usd_per_s(f.memory_mb, f.provisioned_concurrency) for f in plan.functions
        )
        resident = sum(shape.weight_bytes for p in plan.experts if p.resident)
        usd_per_s += (resident + plan.params.get("mmp_gb", 0.0) * 1e9) / 1e9 * model.gpu_usd_per_gb_s()
    usd_per_step += usd_per_s / work.steps_per_s
    steps_per_request = request.tokens_per_request / work.batch_tokens
    return PlanEstimate(
        cost_per_1k_requests=float(1000 * steps_per_request * usd_per_step),
        makespan_ms=float(latency_ms),
        functions=len(plan.functions),
        provisioned_concurrency=sum(f.provisioned_concurrency for f in plan.functions),
        priced_as="always-on GPU workers" if plan.policy == Policy.STATIC else "Lambda + backbone GPU memory",
        sources=model.sources(),
    )


def reprovision(plan: Plan, loads: Loads, workload: Workload | None = None, min_rate: float = 0.2) -> Plan:
    """``plan`` with each function's provisioned concurrency recomputed from ``loads``.

    A function is kept warm (1 provisioned instance) when one of its experts is busy enough. Loads
    measured as rates (``meta["unit"] == "tokens_per_s"``, what the serving path observes): busy
    means at least ``min_rate`` tokens a second (an invoke every few seconds: it would rarely find
    an instance cold, but each cold start would sit on the request path). Plain counts: busy means
    likely active in a step, 1 - (1 - share)^(top_k * batch_tokens) >= the warm threshold.
    Functions and placement are unchanged (they are what is deployed).
    """
    params = plan.params
    work = workload or Workload(
        top_k=int(params.get("top_k") or loads.top_k or 2),
        batch_tokens=int(params.get("batch_tokens") or 64),
        warm_threshold=float(params.get("warm_threshold") or 0.5),
    )
    selections = work.top_k * work.batch_tokens
    if loads.meta.get("unit") == "tokens_per_s":
        busy = {
            (layer, e): float(r) / min_rate
            for layer, rates in loads.layers.items()
            for e, r in enumerate(rates)
        }
    else:
        busy = {
            (layer, e): float(p) / work.warm_threshold
            for layer, counts in loads.layers.items()
            for e, p in enumerate(1.0 - (1.0 - shares(counts)) ** selections)
        }
    functions = [
        FunctionSpec(
            f.name,
            list(f.experts),
            f.memory_mb,
            min(
                1 if max(busy.get((pair[0], pair[1]), 0.0) for pair in f.experts) >= 1.0 else 0,
                1 if f.reserved_concurrency is None else f.reserved_concurrency,
            ),
            f.reserved_concurrency,
        )
        for f in plan.functions
    ]
    return Plan(plan.policy, plan.experts, functions, dict(params), plan.workers, plan.estimate)
