"""The optimiser's tiers: experts on the backbone's GPU and host as well as on Lambda, the hybrid
node and the fleet as candidates, and how many backbones the traffic needs. Hand-sized cases: one
where the host tier is cheapest, one where functions are."""

from __future__ import annotations

import numpy as np
import pytest

from moeless.contracts.loads import Loads
from moeless.model.shapes import ModelShape
from moeless.simulation.policies import Deployment
from moeless.simulation.routing import SampledRouting
from moeless.simulation.simulator import Request
from moeless.sizing import Slo, size_for_slo
from moeless.sizing.report import alternative_lines, cheapest_by_tier
from moeless.sizing.settings import SearchSpace
from moeless.sizing.tiers import FLEET, HYBRID, LAMBDA, Tier, backbones_needed, tiers

SEARCH = SearchSpace(
    stall_bound=False,
    every_level_premium=None,
    processes=1,
    replica_scales=(1,),
    packings=(1,),
    memory_mb=(1769,),
)


def shape(experts: int, hidden: int, intermediate: int, dense_params: float = 1e8) -> ModelShape:
    return ModelShape(
        name="hand", num_layers=1, moe_layers=(0,), num_experts=experts, top_k=1, hidden=hidden,
        expert_intermediate=intermediate, shared_experts=0, shared_intermediate=0, dense_params=dense_params,
        kv_bytes_per_token=1024, attention_flops_per_token_per_context=0, native_dtype="bf16", source="test",
    )  # fmt: skip


def routing(experts: int, skew: bool = True) -> SampledRouting:
    load = np.linspace(experts, 1, experts) if skew else np.ones(experts)
    return SampledRouting.from_loads(Loads({0: load}, {"top_k": 1}), 1, [0], 1)


def test_small_experts_cost_nothing_more_on_the_backbones_host_than_on_lambda():
    # 4 experts of 1024 x 2816 (35 MB each in fp32): the cheapest backbone that holds the dense
    # part holds them in its RAM too, so the host tier adds no instance and every invoke goes
    deployment = Deployment.choose(shape(4, 1024, 2816))
    replay = [Request(20.0 * n, 16, 8, n) for n in range(10)]
    sizing = size_for_slo("moeless", deployment, routing(4), replay, 200.0, Slo(1e6), SEARCH)
    chosen = sizing.chosen
    assert chosen is not None and chosen.structure.tier == HYBRID
    assert chosen.structure.variant.backbone.instance == deployment.backbone.instance
    assert not chosen.plan.functions and {p.placement for p in chosen.plan.experts} == {"host"}
    assert (
        chosen.plan.backbone is not None
        and chosen.plan.backbone.instance == deployment.backbone.instance.name
    )
    by_tier = cheapest_by_tier(sizing)
    assert by_tier[LAMBDA] is not None and chosen.usd_per_1k < by_tier[LAMBDA].usd_per_1k
    assert chosen.plan.params["sizing"]["tier"] == HYBRID
    assert any("the plan (hybrid) costs 1.00x" in line for line in alternative_lines(sizing))


def test_big_experts_under_thin_traffic_cost_least_on_lambda():
    # 64 experts of 4096 x 14336 (705 MB each in fp32, 45 GB), evenly loaded: a node whose RAM
    # holds half of them costs more than the backbone that holds the dense part, and 3 short
    # requests in 10 minutes bill Lambda far less than the difference
    deployment = Deployment.choose(shape(64, 4096, 14336))
    replay = [Request(200.0 * n, 4, 2, n) for n in range(3)]
    sizing = size_for_slo("moeless", deployment, routing(64, skew=False), replay, 600.0, Slo(1e6), SEARCH)
    chosen = sizing.chosen
    assert chosen is not None and chosen.structure.tier == LAMBDA
    by_tier = cheapest_by_tier(sizing)
    assert by_tier[HYBRID] is not None and by_tier[FLEET] is not None
    assert chosen.usd_per_1k < by_tier[HYBRID].usd_per_1k < by_tier[FLEET].usd_per_1k
    hybrid_node = by_tier[HYBRID].structure.variant.backbone.instance
    assert hybrid_node.host_bytes_usable >= 64 * 705e6 > deployment.backbone.instance.host_bytes_usable


def test_a_tpot_only_the_backbone_can_meet_gets_a_plan_not_a_refusal():
    # a TPOT under the Lambda floor (one invoke a layer): the hybrid and the fleet meet it
    deployment = Deployment.choose(shape(64, 4096, 14336))
    replay = [Request(200.0 * n, 4, 8, n) for n in range(3)]
    from moeless.sizing.tiers import lambda_floor_ms

    floor = lambda_floor_ms(deployment, 1769)
    sizing = size_for_slo("moeless", deployment, routing(64), replay, 600.0, Slo(floor / 2), SEARCH)
    assert sizing.chosen is not None and sizing.chosen.structure.tier in (
        HYBRID,
        FLEET,
        "host 50%",
        "host 90%",
    )
    assert sizing.chosen.summary["tpot_ms_p99"] <= floor / 2


def test_traffic_one_backbone_cannot_prefill_gets_several():
    deployment = Deployment.choose(shape(4, 1024, 2816))
    loads = routing(4).loads()
    hybrid = next(t for t in tiers(deployment, loads, (1.0,), (), [], 60.0, False) if t.label == HYBRID)
    thin = [Request(10.0 * n, 100, 10, n) for n in range(6)]
    assert backbones_needed(hybrid, loads, thin, 60.0) == 1
    # 2,000-token prompts at 20 a second: seconds of host arithmetic every second
    heavy = [Request(0.05 * n, 2000, 10, n) for n in range(1200)]
    needed = backbones_needed(hybrid, loads, heavy, 60.0)
    assert needed > 1
    scaled = next(t for t in tiers(deployment, loads, (1.0,), (), heavy, 60.0, False) if t.label == HYBRID)
    assert scaled.variant.backbone.count == needed
    assert scaled.variant.hardware(serverful=False).loops == needed  # each serves its share
    assert scaled.variant.hardware(serverful=False).hourly_usd == pytest.approx(
        needed * scaled.variant.backbone.instance.hourly_usd
    )


def test_a_tier_keeps_its_offloading_experts_functions():
    deployment = Deployment.choose(shape(4, 1024, 2816))
    from moeless.contracts.plan import Placement
    from moeless.simulation.policies import plan_for_policy

    loads = routing(4).loads()
    plan = plan_for_policy("moeless", loads, deployment)
    tier = Tier("host 50%", deployment, {(0, 0): Placement.GPU, (0, 1): Placement.HOST}, offload_rows=32)
    placed = tier.apply(plan)
    by_expert = {p.expert: p for p in placed.experts}
    assert by_expert[0].placement == "gpu" and by_expert[0].function is None
    assert by_expert[1].placement == "host" and by_expert[1].offload_rows == 32 and by_expert[1].function
    assert by_expert[2].placement == "function"
    assert placed.offloads() == {(0, 1): 32}
    assert {pair for f in placed.functions for pair in f.experts} == {(0, 1), (0, 2), (0, 3)}


def test_several_slos_on_one_traffic_choose_as_one_sizing_each():
    from moeless.sizing import size_for_slos

    deployment = Deployment.choose(shape(64, 4096, 14336))
    replay = [Request(200.0 * n, 4, 8, n) for n in range(3)]
    slos = [Slo(1e6), Slo(1e-3)]  # loose: the cheapest; a microsecond: nothing meets it
    loose, impossible = size_for_slos(
        "moeless", deployment, routing(64, skew=False), replay, 600.0, slos, SEARCH
    )
    alone = size_for_slo("moeless", deployment, routing(64, skew=False), replay, 600.0, slos[0], SEARCH)
    assert loose.chosen is not None and loose.chosen.usd_per_1k == pytest.approx(alone.chosen.usd_per_1k)
    assert loose.chosen.structure.key == alone.chosen.structure.key
    assert impossible.chosen is None and impossible.points  # every point judged, none meets it
