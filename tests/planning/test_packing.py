"""Packing experts of one layer into one function: who shares, and what the plan then says."""

from __future__ import annotations

import numpy as np
import pytest

from moeless.contracts.plan import ExpertPlacement, FunctionSpec, Placement, Plan
from moeless.errors import PlanError
from moeless.planning.packing import layer_groups, pack_within_layer


def test_groups_follow_co_activation_from_the_most_loaded_expert():
    # experts 0+3 and 1+2 are chosen together; 4 and 5 by themselves; 0 carries the most load
    coactivation = np.zeros((6, 6))
    for a, b in ((0, 3), (1, 2)):
        coactivation[a, b] = coactivation[b, a] = 50.0
    load = np.array([9.0, 5, 4, 3, 2, 1])
    assert layer_groups(list(range(6)), 2, coactivation, load) == [[0, 3], [1, 2], [4, 5]]
    assert layer_groups(list(range(6)), 4, coactivation, load) == [[0, 1, 2, 3], [4, 5]]
    assert layer_groups([5, 1], 3, coactivation, load) == [[1, 5]]


def _plan(on_backbone: set[tuple[int, int]]) -> Plan:
    pairs = [(layer, e) for layer in range(2) for e in range(4)]
    placements = [
        ExpertPlacement(layer, e, placement=Placement.GPU)
        if (layer, e) in on_backbone
        else ExpertPlacement(layer, e, function=f"f{layer}{e}", replicas=2 if e == 0 else 1)
        for layer, e in pairs
    ]
    functions = [
        FunctionSpec(f"f{layer}{e}", [(layer, e)]) for layer, e in pairs if (layer, e) not in on_backbone
    ]
    return Plan("moeless", placements, functions)


def test_pack_within_layer_keeps_replicas_and_backbone_experts_and_respects_memory():
    plan = _plan({(1, 3)})
    packed = pack_within_layer(
        plan, 2, lambda _: np.ones((4, 4)), lambda _: np.array([4.0, 3, 2, 1]), lambda n: 1769 * n
    )
    hosted = sorted(tuple(f.experts) for f in packed.functions)
    assert hosted == [((0, 0), (0, 1)), ((0, 2), (0, 3)), ((1, 0), (1, 1)), ((1, 2),)]
    by_name = {f.name: f for f in packed.functions}
    assert all(
        by_name[p.function].memory_mb == 1769 * len(by_name[p.function].experts)
        for p in packed.experts
        if p.function
    )
    backbone = [p for p in packed.experts if p.placement == Placement.GPU]
    assert [(p.layer, p.expert, p.function) for p in backbone] == [(1, 3, None)]
    targets = packed.invoke_targets()
    assert targets[(0, 0)] == [targets[(0, 1)][0]] * 2  # two environments of the shared function
    assert pack_within_layer(plan, 1, None, None, None) is plan
    with pytest.raises(PlanError, match="over Lambda's 10240 MB"):
        pack_within_layer(plan, 4, lambda _: np.ones((4, 4)), lambda _: np.ones(4), lambda n: 3000 * n)
