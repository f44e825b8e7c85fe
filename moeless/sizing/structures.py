"""The candidates' structures: tier, packing, grouping, memory, replicas, dtype, prefill chunk and
drafts per forward.

Each structure is one plan of the policy with nothing warm yet; its family of warmth levels is
sized on it (:mod:`moeless.sizing.family`). The dtypes and chunks searched are the deployment's
unless the search space allows more; the drafts per forward, where the deployment has a drafter,
0 up to the positions its acceptance covers (:func:`drafts_searched`). moeless plans also come in
every tier the search holds (:mod:`moeless.sizing.tiers`): part or all of the experts on the
backbone's GPU and host, each tier on the backbone instance and count it needs; those with
functions are searched in memory and replicas, one function per expert (packing serves Lambda's
cold starts, which a tier with the hot experts resident has few of).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from moeless.contracts.loads import Loads, shares
from moeless.contracts.payload import max_tokens_per_request
from moeless.contracts.plan import Plan
from moeless.errors import SimulationError
from moeless.planning.concurrency import levels_in_reach, with_concurrency, with_memory, with_replicas
from moeless.planning.cost_model import MEMORY_OPTIONS_MB
from moeless.planning.packing import pack_across_layers, pack_within_layer
from moeless.simulation.policies import Deployment, plan_for_policy
from moeless.simulation.routing import RecordedRouting, StepRouting
from moeless.simulation.simulator import Request
from moeless.sizing.settings import SearchSpace
from moeless.sizing.tiers import LAMBDA, lambda_floor_ms, tiers


@dataclass(frozen=True)
class Structure:
    """One candidate: the deployment variant (dtype, chunk, drafts) and the plan's packing, grouping,
    memory and replicas, nothing warm yet; ``stall_tpot_ms`` is its stall probe
    (:func:`~moeless.sizing.stall.stall_tpot_ms`), set once probed."""

    variant: Deployment
    plan: Plan
    memory_mb: int
    replica_scale: int
    packing: int
    group: int
    stall_tpot_ms: float | None = None
    tier: str = LAMBDA
    offload_rows: int | None = None

    @property
    def key(self) -> tuple[object, ...]:
        """What identifies it among the candidates."""
        return (
            self.memory_mb,
            self.replica_scale,
            self.packing,
            self.group,
            self.variant.expert_dtype,
            self.variant.prefill_chunk,
            self.variant.speculate,
            self.tier,
            self.offload_rows,
            self.variant.backbone.label(),
        )

    def reach(self) -> dict[str, int]:
        """Each function's levels in reach on this structure's deployment (:func:`reach_of`)."""
        return reach_of(self.plan, self.variant)


def variants(deployment: Deployment, search: SearchSpace) -> dict[tuple[str, int | None, int], Deployment]:
    """The deployment in every expert dtype, prefill chunk and number of drafts the search allows,
    by (dtype, chunk, drafts)."""
    dtypes = dict.fromkeys([deployment.expert_dtype, *search.expert_dtypes])
    chunks = dict.fromkeys([deployment.prefill_chunk, *search.prefill_chunks])
    return {
        (dtype, chunk, k): replace(deployment, expert_dtype=dtype, prefill_chunk=chunk, speculate=k)
        for dtype in dtypes
        for chunk in chunks
        for k in drafts_searched(deployment, search)
    }


def drafts_searched(deployment: Deployment, search: SearchSpace) -> list[int]:
    """The drafts per forward searched: the deployment's and the search's; by default, with a
    drafter, 0 and every k its acceptance gives a rate for (a draft past them is never kept, so
    more would only add rows); without one, 0 alone."""
    acceptance = deployment.draft_acceptance
    if acceptance is None:
        if any(search.speculate):
            raise SimulationError(
                f"the search's speculate {list(search.speculate)} needs a drafter: give its acceptance "
                "(--draft-acceptance)"
            )
        return [0]
    chosen = search.speculate or range(len(acceptance.rates) + 1)
    return list(dict.fromkeys([deployment.speculate, *chosen]))


def structures(
    policy: str,
    deployment: Deployment,
    routing: StepRouting,
    search: SearchSpace,
    replay: list[Request] | None = None,
    span_s: float = 0.0,
) -> Iterator[Structure]:
    """Every candidate structure of ``policy`` the search space holds (a packing that needs more
    memory than a size offers is sized up, once; one whose functions cannot cold-start within their
    timeout is left out); moeless's in every tier, on as many backbones as ``replay`` needs."""
    loads = routing.loads()
    together = coactivation(routing, loads)
    for variant in variants(deployment, search).values():
        if policy != "moeless" or replay is None:
            yield from _lambda_structures(policy, variant, loads, together, search)
            continue
        shares, rows = search.host_shares, search.offload_rows
        for tier in tiers(variant, loads, shares, rows, replay, span_s, search.alternatives):
            if tier.label == LAMBDA:
                yield from _lambda_structures(policy, tier.variant, loads, together, search)
                continue
            base = tier.apply(with_concurrency(plan_for_policy(policy, loads, tier.variant), {}))
            if not base.functions:
                yield Structure(tier.variant, base, 0, 1, 1, 1, tier=tier.label)
                continue
            for memory, scale in itertools.product(
                memory_options(tier.variant, search), search.replica_scales
            ):
                plan = with_replicas(with_memory(base, memory), scale)
                yield Structure(
                    tier.variant, plan, memory, scale, 1, 1, tier=tier.label, offload_rows=tier.offload_rows
                )


def _lambda_structures(
    policy: str,
    variant: Deployment,
    loads: Loads,
    together: Callable[[int, int], np.ndarray],
    search: SearchSpace,
) -> Iterator[Structure]:
    """The policy's plans on ``variant`` in every packing, grouping, memory and replica scale."""
    base = with_concurrency(plan_for_policy(policy, loads, variant), {})
    memory_for = functools.partial(memory_for_experts, variant)
    packed_by = {(n, 1): pack_across_layers(base, n, together, memory_for) for n in search.packings} | {
        (1, g): pack_within_layer(
            base, g, lambda layer: together(layer, layer), lambda layer: loads.layers[layer], memory_for
        )
        for g in search.groups
        if g > 1
    }
    # a packing whose functions cannot cold-start within their timeout is no candidate
    weight = variant.expert_size().weight_bytes
    packed_by = {
        key: packed
        for key, packed in packed_by.items()
        if not any(variant.model.too_slow_to_load(weight * len(f.experts)) for f in packed.functions)
    }
    memories = memory_options(variant, search)
    seen = set()
    for (per_function, group), memory_option, scale in itertools.product(
        packed_by, memories, search.replica_scales
    ):
        packed = packed_by[(per_function, group)]
        memory = max(memory_option, max((f.memory_mb for f in packed.functions), default=memory_option))
        if (per_function, group, memory, scale) in seen:
            continue
        seen.add((per_function, group, memory, scale))
        plan = with_replicas(with_memory(packed, memory), scale)
        yield Structure(variant, plan, memory, scale, per_function, group)


def floor_ms(deployment: Deployment, search: SearchSpace) -> float:
    """The lowest Lambda floor of TPOT over the variants and memory sizes searched that the
    account's memory cap allows (called where some structure fits it)."""
    return min(
        lambda_floor_ms(variant, memory)
        for variant in variants(deployment, search).values()
        for memory in memory_options(variant, search)
        if memory <= search.max_function_memory_mb
    )


def memory_options(deployment: Deployment, search: SearchSpace) -> list[int]:
    """The memory sizes searched: the search's, else :func:`default_memory_options`."""
    return list(search.memory_mb) or default_memory_options(deployment)


def memory_for_experts(deployment: Deployment, experts: int) -> int:
    """The smallest Lambda memory size that holds ``experts`` of the deployment's experts."""
    return deployment.model.function_memory_mb(deployment.expert_size().weight_bytes * experts)


def default_memory_options(deployment: Deployment) -> list[int]:
    """The smallest full-vCPU size that holds one expert, and the next one up."""
    smallest = deployment.model.function_memory_mb(deployment.expert_size().weight_bytes)
    index = MEMORY_OPTIONS_MB.index(smallest)
    return list(MEMORY_OPTIONS_MB[index : index + 2])


def reach_of(plan: Plan, deployment: Deployment) -> dict[str, int]:
    """Each function's levels in reach (:func:`levels_in_reach`) on ``deployment``: a step carries
    at most a chunk (whole prompts: one as long as the deployment admits) beside a full decode
    batch (each sequence's token and drafts), on each of the backbone's step loops."""
    decode_rows = deployment.max_batch * (1 + deployment.speculate)
    rows = (deployment.prefill_chunk or deployment.context_tokens) + decode_rows
    loops = deployment.hardware(serverful=False).loops
    return levels_in_reach(plan, rows, max_tokens_per_request(deployment.expert_size().hidden), loops)


def coactivation(routing: StepRouting, loads: Loads) -> Callable[[int, int], np.ndarray]:
    """Co-activation of layer ``a``'s experts with layer ``b``'s, ``[E, E]``: a recorded routing's
    decode tokens that chose e at ``a`` and e' at ``b`` (at one layer, ``a == b``: two different
    picks of one token), else the product of their shares in ``loads``."""
    index = {layer: i for i, layer in enumerate(routing.layers)}
    if not isinstance(routing, RecordedRouting):

        def sampled(a: int, b: int) -> np.ndarray:
            return np.outer(shares(loads.layers[a]), shares(loads.layers[b]))

        return sampled
    rows = [r for r in routing.decode_rows if len(r)]
    chosen = routing.chosen

    @functools.cache  # the same layer pairs come back for every dtype allowed
    def recorded(a: int, b: int) -> np.ndarray:
        counts = np.zeros((routing.num_experts, routing.num_experts))
        for r in rows:
            first, second = r[:, chosen[index[a]]], r[:, chosen[index[b]]]
            for i, j in itertools.product(range(first.shape[1]), range(second.shape[1])):
                if a != b or i != j:
                    np.add.at(counts, (first[:, i], second[:, j]), 1.0)
        return counts

    return recorded
