"""Re-planning while serving: rolling loads, hysteresis, and re-provisioning live functions."""

from __future__ import annotations

import numpy as np
import pytest

from moeless.contracts.loads import Loads
from moeless.contracts.manifest import load_manifest
from moeless.contracts.plan import one_function_per_expert
from moeless.planning.planner import reprovision
from moeless.serving.generation import SamplingParams
from moeless.serving.replanner import Hysteresis, Replanner, RollingLoads
from tests.fakes import FakeClock
from tests.lambda_helpers import wait_for
from tests.serving.test_serving import PROMPTS, serving


def test_rolling_loads_are_rates_that_decay_with_the_half_life():
    clock = FakeClock(0.0)
    loads = RollingLoads(4, half_life_s=10.0, clock=clock)
    assert loads.snapshot() is None
    for _ in range(1000):  # a steady 8 tokens/s to expert 1 for 1,000 s
        clock.now += 1.0
        loads.add(0, {1: 8})
    snapshot = loads.snapshot()
    assert snapshot.meta["unit"] == "tokens_per_s"
    assert snapshot.layers[0][1] == pytest.approx(8.0, rel=0.05)
    clock.now += 20.0  # two half-lives of silence
    assert loads.snapshot().layers[0][1] == pytest.approx(2.0, rel=0.05)


def test_hysteresis_rises_at_once_and_falls_only_after_it_persists():
    gate = Hysteresis(up_after=1, down_after=3)
    assert gate.admit("f", 0, 1) == 1
    assert [gate.admit("f", 1, 0) for _ in range(3)] == [1, 1, 0]
    assert gate.admit("f", 1, 0) == 1 and gate.admit("f", 1, 1) == 1 and gate.admit("f", 1, 0) == 1  # reset


def test_reprovision_warms_busy_functions_only(tiny):
    plan = one_function_per_expert(load_manifest(tiny.package("mixtral")))
    rates = Loads({0: np.array([5.0, 0.01] + [0.0] * 6), 1: np.zeros(8)}, {"unit": "tokens_per_s"})
    warm = {f.name for f in reprovision(plan, rates).functions if f.provisioned_concurrency}
    assert warm == {"moeless-l000-e000"}
    plan.functions[0].reserved_concurrency = 0  # a function that may not run gets no provisioned instance
    assert not any(f.provisioned_concurrency for f in reprovision(plan, rates).functions)


def test_serving_reprovisions_the_busy_functions_then_lets_them_go(tiny):
    artifacts = tiny.package("mixtral")
    with serving(artifacts) as (_, backbone, host):
        observed = RollingLoads(8, half_life_s=1.0)
        backbone.dispatcher.observed = observed
        replanner = Replanner(
            backbone.plan,
            observed,
            reprovision,
            backbone.dispatcher.client,
            interval_s=3600,
            hysteresis=Hysteresis(up_after=1, down_after=2),
        )
        for prompt in PROMPTS[:4]:
            sequence = backbone.engine.submit(
                backbone.encode(prompt), SamplingParams(6, temperature=0), lambda e: None
            )
            assert sequence.done.wait(60)
        up = replanner.step()
        assert up and all(c.setting == "provisioned" and c.after == 1 for c in up)
        warm = {c.function for c in up}
        wait_for(
            lambda: all(host.pools[name].provisioned_status("live")["Status"] == "READY" for name in warm)
        )
        observed.clock = lambda: 1e9  # long silence: the rates decay to nothing
        assert replanner.step() == []  # hysteresis holds the first proposal to scale down
        down = replanner.step()
        assert {c.function for c in down} == warm and all(c.after == 0 for c in down)
        assert replanner.errors == 0


def test_a_sized_plan_reprovisions_integer_concurrency_from_the_demand_it_serves(tiny, tmp_path):
    """The plan's own re-planner (moeless plan --replan-interval) reads the dispatcher's demand by
    level: an expert with 2 replicas is invoked twice at once, so its function needs 2 provisioned
    environments at an infinite price of a cold start; the host gets exactly that."""
    from dataclasses import replace

    from moeless.contracts.plan import Plan

    artifacts = tiny.package("mixtral")
    base = one_function_per_expert(load_manifest(artifacts))
    experts = [replace(p, replicas=2) if p.layer == 0 else p for p in base.experts]
    params = {"replan": {"interval_s": 3600.0, "usd_per_cold_start": None, "ping_usd_per_s": None}}
    plan_path = tmp_path / "plan.json"
    Plan("moeless", experts, base.functions, params=params).save(plan_path)
    with serving(artifacts, plan_path=plan_path) as (_, backbone, host):
        replanner = backbone.replanner
        assert replanner is not None and replanner.forecaster is not None
        for prompt in PROMPTS[:2]:
            sequence = backbone.engine.submit(
                backbone.encode(prompt), SamplingParams(4, temperature=0), lambda e: None
            )
            assert sequence.done.wait(60)
        changes = replanner.step()
        provisioned = {c.function: c.after for c in changes}
        first_layer = {f.name for f in base.functions if f.experts[0][0] == 0}
        assert provisioned and set(provisioned) <= {f.name for f in base.functions}
        assert max(provisioned[name] for name in provisioned if name in first_layer) == 2
        assert all(provisioned[name] == 1 for name in provisioned if name not in first_layer)
        # the levels just used are in use for the idle timeout: the next re-plan may not take them
        assert backbone.dispatcher.take_demand() == ({}, provisioned)
        name = next(iter(provisioned))
        wait_for(lambda: host.pools[name].provisioned_status("live")["Status"] == "READY")
        assert replanner.errors == 0


def test_a_packed_sized_plan_serves_the_unsplit_models_tokens(tiny, tmp_path):
    """Functions hosting experts of two consecutive layers, replicas as environments, kept warm by
    the keeper: the answers are the unsplit model's, token for token."""
    from dataclasses import replace

    import numpy as np

    from moeless.contracts.plan import Plan
    from moeless.planning.concurrency import Warmth, with_concurrency
    from moeless.planning.packing import pack_across_layers
    from tests.serving.test_serving import engine_ids, reference_ids

    model_dir, artifacts = tiny.model("mixtral"), tiny.package("mixtral")
    base = one_function_per_expert(load_manifest(artifacts))
    experts = [replace(p, replicas=2) for p in base.experts]
    packed = pack_across_layers(
        Plan("moeless", experts, base.functions), 2, lambda a, b: np.ones((8, 8)), lambda n: 1769
    )
    assert len(packed.functions) == len(base.functions) // 2
    assert all(len({layer for layer, _ in f.experts}) == 2 for f in packed.functions)
    sized = with_concurrency(packed, {packed.functions[0].name: Warmth(1, 1)})
    sized.params |= {"warm_up": True, "keep_warm_ping_s": 3600.0}
    plan_path = tmp_path / "plan.json"
    sized.save(plan_path)
    with serving(artifacts, plan_path=plan_path) as (_, backbone, _host):
        assert backbone.keep_warm is not None and backbone.keep_warm.kept
        got = engine_ids(backbone, PROMPTS[:2], 8)
        counters = backbone.stats.snapshot()["counters"]
        assert counters.get("invokes", 0) > 0 and counters.get("fallbacks", 0) == 0
    assert got == reference_ids(model_dir, PROMPTS[:2], 8)
