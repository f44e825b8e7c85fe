"""Packing: one function hosting experts of several consecutive layers, or of one layer.

A warm environment of a packed function serves layer after layer of the same step (the layers of
a step run one after another, so its experts' invokes seldom overlap), so a plan needs about
``per_function`` times fewer environments kept warm, provisioned or initialised by the warm-up
pass, and each is invoked that many times more often, which keeps it warm on its own. The price:
a cold start loads every hosted expert, and the function's memory must hold them all
(``CostModel.function_memory_mb``, at most 10,240 MB). The invoke payload is unchanged: each
invoke still carries one expert's rows, under the 6 MB limit as the dispatcher cuts them.

Which experts share a function: chains along the layers that the same tokens take. Within each
block of ``per_function`` consecutive layers, each expert of the block's first layer starts a
chain; each next layer's experts join the chains greedily by co-activation with the chain's last
expert (``pair_scores(previous_layer, layer)[e, e']``: from per-token routing, how many tokens
chose e then e'; without it, the product of the two layers' shares), so a token's path tends to
stay on the environments it has already warmed.

**Within a layer** (:func:`pack_within_layer`): a function hosting ``per_function`` experts of one
layer takes all of their rows of a step in one bundled invoke (``contracts/payload.py``): one
invoke overhead, one request charge and one environment instead of ``per_function``, for compute
that runs the experts one after another in that environment. Which experts share: those the same
tokens choose together (``coactivation(layer)[e, e']``: tokens that chose both, from per-token
routing; without it, the product of their shares), greedily from the most loaded expert, so a
token's ``top_k`` experts tend to travel in fewer invokes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from moeless.aws_limits import MAX_FUNCTION_MEMORY_MB
from moeless.contracts.plan import FunctionSpec, Placement, Plan
from moeless.errors import PlanError

Slice = tuple[int, int, int]  # (expert, first row, end row) of one layer's input for that expert


def bundle_slices(slices: list[Slice], max_rows: int) -> list[list[Slice]]:
    """The invokes of one function for one layer: its slices grouped into bundles.

    A bundle holds at most one slice per expert (an expert's slices are meant to run concurrently,
    on as many environments) and at most ``max_rows`` rows (the payload limit). Each slice goes to
    the first bundle that has room, so an expert's k-th slice usually shares the k-th invoke:
    ``[(0, 0, 5), (0, 5, 9), (1, 0, 3)] -> [[(0, 0, 5), (1, 0, 3)], [(0, 5, 9)]]``.
    """
    bundles: list[list[Slice]] = []
    sizes: list[int] = []
    for piece in slices:
        expert, start, end = piece
        for index, bundle in enumerate(bundles):
            if sizes[index] + end - start <= max_rows and all(e != expert for e, _, _ in bundle):
                bundle.append(piece)
                sizes[index] += end - start
                break
        else:
            bundles.append([piece])
            sizes.append(end - start)
    return bundles


def chains(
    layers: list[int],
    experts: dict[int, list[int]],
    per_function: int,
    pair_scores: Callable[[int, int], np.ndarray],
) -> list[list[tuple[int, int]]]:
    """Groups of (layer, expert), each of at most ``per_function`` consecutive layers' experts."""
    groups: list[list[tuple[int, int]]] = []
    for start in range(0, len(layers), per_function):
        block = layers[start : start + per_function]
        open_chains = [[(block[0], e)] for e in experts[block[0]]]
        for previous, layer in itertools.pairwise(block):
            scores = pair_scores(previous, layer)
            tails = {chain[-1][1]: chain for chain in open_chains if chain[-1][0] == previous}
            pairs = sorted(
                ((float(scores[a, b]), a, b) for a in tails for b in experts[layer]), key=lambda p: -p[0]
            )
            taken_tails, placed = set(), set()
            for _, a, b in pairs:
                if a in taken_tails or b in placed:
                    continue
                tails[a].append((layer, b))
                taken_tails.add(a)
                placed.add(b)
            open_chains += [[(layer, b)] for b in experts[layer] if b not in placed]
        groups += open_chains
    return groups


def pack_across_layers(
    plan: Plan,
    per_function: int,
    pair_scores: Callable[[int, int], np.ndarray],
    memory_for: Callable[[int], int],
) -> Plan:
    """``plan`` with its function-hosted experts regrouped ``per_function`` layers to a function.

    ``memory_for(n)`` is the memory of a function hosting ``n`` experts; an expert keeps its
    replicas (now environments of the packed function). Experts on the backbone stay there.

    Raises:
        PlanError: a group would not fit one Lambda function.
    """
    if per_function <= 1:
        return plan
    on_functions = [p for p in plan.experts if p.placement == Placement.FUNCTION]
    layers = sorted({p.layer for p in on_functions})
    experts: dict[int, list[int]] = {layer: [] for layer in layers}
    for placement in on_functions:
        experts[placement.layer].append(placement.expert)
    functions: list[FunctionSpec] = []
    host: dict[tuple[int, int], tuple[str, int]] = {}
    for index, group in enumerate(chains(layers, experts, per_function, pair_scores)):
        memory = memory_for(len(group))
        if memory > MAX_FUNCTION_MEMORY_MB:
            raise PlanError(
                f"{len(group)} experts need {memory} MB, over Lambda's {MAX_FUNCTION_MEMORY_MB} MB"
            )
        name = f"moeless-l{group[0][0]:03d}-g{index:04d}"
        functions.append(FunctionSpec(name, list(group), memory))
        host |= dict.fromkeys(group, (name, memory))
    return _rehosted(plan, functions, host)


def _rehosted(
    plan: Plan, functions: list[FunctionSpec], host: dict[tuple[int, int], tuple[str, int]]
) -> Plan:
    """``plan`` with ``functions`` replacing its own; each expert in ``host`` moves to (function,
    memory), keeping its replicas; the others (on the backbone) stay as they are."""
    placements = [
        replace(p, function=host[(p.layer, p.expert)][0], memory_mb=host[(p.layer, p.expert)][1], workers=[])
        if (p.layer, p.expert) in host
        else p
        for p in plan.experts
    ]
    return replace(plan, experts=placements, functions=functions)


def layer_groups(
    experts: list[int], per_function: int, coactivation: np.ndarray, load: np.ndarray
) -> list[list[int]]:
    """``experts`` of one layer in groups of at most ``per_function``: each group starts from the
    most loaded expert left and adds, one at a time, the expert most co-activated with its members."""
    left = sorted(experts, key=lambda e: (-float(load[e]), e))
    groups: list[list[int]] = []
    while left:
        group = [left.pop(0)]
        while left and len(group) < per_function:
            best = max(left, key=lambda e: (sum(float(coactivation[m, e]) for m in group), -left.index(e)))
            group.append(best)
            left.remove(best)
        groups.append(sorted(group))
    return groups


def pack_within_layer(
    plan: Plan,
    per_function: int,
    coactivation: Callable[[int], np.ndarray],
    load: Callable[[int], np.ndarray],
    memory_for: Callable[[int], int],
) -> Plan:
    """``plan`` with its function-hosted experts regrouped ``per_function`` experts of one layer to
    a function (``coactivation(layer)``: ``[E, E]``; ``load(layer)``: ``[E]``, tokens or shares).

    An expert keeps its replicas: concurrent environments of the grouped function, each invoke of
    which carries one slice of every member's rows. Experts on the backbone stay there.

    Raises:
        PlanError: a group would not fit one Lambda function.
    """
    if per_function <= 1:
        return plan
    on_functions = [p for p in plan.experts if p.placement == Placement.FUNCTION]
    experts: dict[int, list[int]] = {}
    for placement in on_functions:
        experts.setdefault(placement.layer, []).append(placement.expert)
    memory = memory_for(per_function)
    if memory > MAX_FUNCTION_MEMORY_MB:
        raise PlanError(f"{per_function} experts need {memory} MB, over Lambda's {MAX_FUNCTION_MEMORY_MB} MB")
    functions: list[FunctionSpec] = []
    host: dict[tuple[int, int], tuple[str, int]] = {}
    for layer in sorted(experts):
        for index, group in enumerate(
            layer_groups(experts[layer], per_function, coactivation(layer), load(layer))
        ):
            name = f"moeless-l{layer:03d}-b{index:04d}"
            size = memory_for(len(group))
            functions.append(FunctionSpec(name, [(layer, e) for e in group], size))
            host |= dict.fromkeys(((layer, e) for e in group), (name, size))
    return _rehosted(plan, functions, host)
