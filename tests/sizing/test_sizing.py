"""The replica optimiser: replicas are concurrent environments of one function, provisioned
concurrency per level priced against its cold starts, the cheapest plan meeting an SLO, a tighter
SLO never cheaper, an unreachable one refused with the latency that can be had, and the commands."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from moeless.aws_prices import PRICES
from moeless.contracts.loads import Loads
from moeless.contracts.payload import max_tokens_per_request
from moeless.contracts.plan import ExpertPlacement, FunctionSpec, Plan, load_plan
from moeless.model.shapes import ModelShape
from moeless.planning.concurrency import (
    ForecastReplanner,
    LevelDemand,
    Warmth,
    level_cost_usd,
    ping_cost_usd,
    provisioned_for,
    with_concurrency,
)
from moeless.simulation.policies import Deployment, plan_for_policy, simulate_policy
from moeless.simulation.routing import SampledRouting
from moeless.simulation.simulator import Request
from moeless.sizing import DEFAULT_SEARCH, SearchSpace, Slo, SloUnreachable
from moeless.sizing import size_for_slo as optimise
from moeless.sizing.settings import PRICE_GRID
from tests.simulation.test_simulator import GPU, HARDWARE, SIZE, sampled

# the bare optimiser these tests size with: no stall bound, no insurance (each test asks for what it
# checks), every candidate judged in this process
# Lambda alone: these tests are about the functions (the tiers: tests/sizing/test_tiers.py)
BARE = SearchSpace(
    stall_bound=False,
    every_level_premium=None,
    processes=1,
    exhaustive=True,
    host_shares=(),
    alternatives=False,
)
DEFAULT_EVERY_LEVEL_PREMIUM = DEFAULT_SEARCH.every_level_premium
RENAMED = {"memory_options": "memory_mb", "every_level": "warm_every_level"}


def size_for_slo(policy, deployment, routing, replay, duration_s, slo, **settings):
    """The optimiser on :data:`BARE` with ``settings`` (lists as the search space's tuples)."""
    changes = {
        RENAMED.get(name, name): tuple(value) if isinstance(value, list) else value
        for name, value in settings.items()
    }
    return optimise(policy, deployment, routing, replay, duration_s, slo, replace(BARE, **changes))


MB = 1769


def test_a_level_is_provisioned_exactly_when_its_cold_starts_pay_for_it():
    span = 1000.0
    demand = LevelDemand()
    for _ in range(700):  # level 1 busy 70% of the span: provisioned is the cheaper way to run it
        demand.add(1, 1.0, False)
    demand.add(2, 5.0, True)  # level 2: nearly idle, 4 cold starts
    for _ in range(3):
        demand.add(2, 0.0, True)
    demand.add(3, 1.0, True)  # level 3: one cold start
    assert level_cost_usd(700.0, span, MB) < 0 < level_cost_usd(5.0, span, MB)
    assert provisioned_for(demand, span, MB, 0.0) == Warmth(1, 0)  # only what saves money outright
    level2 = level_cost_usd(5.0, span, MB)  # 4 cold starts must be worth this
    assert provisioned_for(demand, span, MB, 0.99 * level2 / 4) == Warmth(1, 0)
    assert provisioned_for(demand, span, MB, 1.01 * level2 / 4) == Warmth(2, 0)
    level3 = level_cost_usd(1.0, span, MB)
    assert provisioned_for(demand, span, MB, 1.01 * level3) == Warmth(3, 0)
    assert provisioned_for(demand, span, MB, math.inf) == Warmth(3, 0)
    counts = [provisioned_for(demand, span, MB, price).provisioned for price in PRICE_GRID]
    assert counts == sorted(counts)  # monotone in the price


def test_levels_that_pings_keep_warm_for_less_are_pinged_not_provisioned():
    span = 1000.0
    demand = LevelDemand()
    for _ in range(700):
        demand.add(1, 1.0, False)
    demand.add(2, 5.0, True)
    demand.add(3, 1.0, True)
    ping = ping_cost_usd(span, MB, 240.0, 11.0)
    assert 0 < ping < level_cost_usd(1.0, span, MB) / 100  # a ping a few minutes is far cheaper
    assert provisioned_for(demand, span, MB, 0.5 * ping, ping_usd=ping) == Warmth(1, 0)
    assert provisioned_for(demand, span, MB, 1.01 * ping, ping_usd=ping) == Warmth(1, 2)
    assert provisioned_for(demand, span, MB, math.inf, ping_usd=ping) == Warmth(1, 2)


def test_replicas_are_environments_of_the_functions_hosting_the_expert():
    plan = Plan(
        "moeless",
        [
            ExpertPlacement(0, 0, replicas=3, function="a"),
            ExpertPlacement(0, 1, replicas=3, function="b"),
            ExpertPlacement(0, 2, placement="gpu", function=None),
        ],
        [FunctionSpec("a", [(0, 0)]), FunctionSpec("b", [(0, 1)]), FunctionSpec("c", [(0, 1)])],
    )
    targets = plan.invoke_targets()
    assert targets == {(0, 0): ["a", "a", "a"], (0, 1): ["b", "c", "b"]}
    sized = with_concurrency(plan, {"a": Warmth(3, 0), "c": Warmth(1, 2)})
    assert [f.provisioned_concurrency for f in sized.functions] == [3, 0, 1]
    assert [f.keep_warm for f in sized.functions] == [0, 0, 2]
    assert [p.provisioned_concurrency for p in sized.experts] == [3, 1, 0]


def test_a_step_splits_an_expert_over_concurrent_environments_of_one_function():
    from moeless.planning.cost_model import CostModel
    from moeless.simulation.simulator import Simulator

    experts = [ExpertPlacement(0, e, replicas=3 if e == 0 else 1, function=f"f{e}") for e in range(8)]

    def run(provisioned: int):
        functions = [FunctionSpec(f"f{e}", [(0, e)], MB, provisioned if e == 0 else 0) for e in range(8)]
        routing = SampledRouting.from_loads(Loads({0: np.array([1.0] + [0.0] * 7)}, {"top_k": 1}), 1, [0], 1)
        simulator = Simulator(Plan("moeless", experts, functions), routing, SIZE, CostModel(), GPU, HARDWARE)
        return simulator.run([Request(0.0, 6, 1)], 1.0)

    warm, cold = run(3), run(1)
    assert warm.invokes == cold.invokes == 3 and warm.cold_starts == 0 and cold.cold_starts == 2
    # demand by level; its cold starts are those on-demand Lambda alone would have had (the
    # first use of each level), whatever was provisioned
    assert cold.demand["f0"].invokes == [1, 1, 1] and cold.demand["f0"].cold_starts == [1, 1, 1]
    assert warm.demand["f0"].cold_starts == [1, 1, 1]


def one_expert_shape() -> ModelShape:
    return ModelShape(
        name="one-hot", num_layers=1, moe_layers=(0,), num_experts=4, top_k=1, hidden=1024,
        expert_intermediate=2816, shared_experts=0, shared_intermediate=0, dense_params=1e8,
        kv_bytes_per_token=1024, attention_flops_per_token_per_context=0, native_dtype="bf16", source="test",
    )  # fmt: skip


def test_the_optimiser_finds_the_hand_sized_optimum():
    """Every token goes to expert 0, requests 400 s apart (past the 300 s idle timeout): judged
    after a quiet, each request meets a cold function, the first too. A TTFT bound below a cold start
    needs exactly function 0 kept warm once, nothing else: by provisioned concurrency, or more
    cheaply by pings; a loose bound needs nothing."""
    deployment = Deployment.choose(one_expert_shape())
    routing = SampledRouting.from_loads(Loads({0: np.array([1.0, 0, 0, 0])}, {"top_k": 1}), 1, [0], 1)
    replay = [Request(400.0 * n, 1, 4, n) for n in range(4)]
    cold_ms = deployment.model.cold_start_ms(deployment.expert_size().weight_bytes)
    tight, loose = Slo(1e6, ttft_ms=cold_ms / 2), Slo(1e6, ttft_ms=10 * cold_ms)
    only_expert_0 = {"moeless-l000-e000": 1} | {f"moeless-l000-e00{e}": 0 for e in (1, 2, 3)}

    def sized(slo: Slo, keep_warm: bool):
        chosen = size_for_slo("moeless", deployment, routing, replay, 1600.0, slo, keep_warm=keep_warm).chosen
        return chosen, {f.name: (f.provisioned_concurrency, f.keep_warm) for f in chosen.plan.functions}

    provisioned, counts = sized(tight, keep_warm=False)
    assert {name: p for name, (p, _) in counts.items()} == only_expert_0
    assert provisioned.summary["cold_starts"] == 0 and provisioned.keep_warm == 0
    pinged, counts = sized(tight, keep_warm=True)
    assert {name: k for name, (_, k) in counts.items()} == only_expert_0 and pinged.provisioned == 0
    assert pinged.summary["cold_starts"] == 0
    cheapest, counts = sized(loose, keep_warm=False)
    assert cheapest.provisioned == 0 and cheapest.summary["cold_starts"] == 4
    # provisioning costs the loose plan plus function 0's environment for the span, less its
    # savings; pings cost far less than that
    extra = provisioned.usd_per_1k - cheapest.usd_per_1k
    environment_usd = 1000 / 4 * 1600.0 * MB / 1024 * PRICES.provisioned_per_gb_second
    assert 0 < extra <= environment_usd
    assert pinged.usd_per_1k < provisioned.usd_per_1k
    assert provisioned.plan.params["sizing"]["usd_per_cold_start"] > 0


def test_a_tighter_slo_never_costs_less_and_an_unreachable_one_says_what_is_reachable():
    deployment = Deployment.choose(
        one_expert_shape().__class__(**(one_expert_shape().__dict__ | {"top_k": 2}))
    )
    routing = sampled(1)
    rng = np.random.default_rng(3)
    times = np.sort(rng.uniform(0, 1200, 12))
    replay = [Request(float(t), 16, 6, n) for n, t in enumerate(times)]
    frontier = size_for_slo("moeless", deployment, routing, replay, 1200.0, Slo(1e9))
    latencies = sorted({p.summary["tpot_ms_p99"] for p in frontier.points}, reverse=True)
    for premium in (None, DEFAULT_EVERY_LEVEL_PREMIUM):  # with every level's insurance too
        costs = []
        for bound in latencies:
            sizing = size_for_slo(
                "moeless", deployment, routing, replay, 1200.0, Slo(bound), every_level_premium=premium
            )
            costs.append(sizing.chosen.usd_per_1k)
            assert sizing.chosen.summary["tpot_ms_p99"] <= bound
        assert costs == sorted(costs)
    with pytest.raises(SloUnreachable, match="best reached is p99 TPOT") as caught:
        size_for_slo("moeless", deployment, routing, replay, 1200.0, Slo(0.5 * min(latencies)))
    assert caught.value.sizing.best_latency().summary["tpot_ms_p99"] == pytest.approx(min(latencies))


def test_plan_sizes_for_an_slo_and_simulate_replays_that_plan(tmp_path):
    from click.testing import CliRunner

    from cli.main import cli

    loads = tmp_path / "loads.json"
    layers = [
        {"layer": 0, "counts": [50, 30, 10, 5, 3, 1, 1, 0]},
        {"layer": 1, "counts": [5, 5, 20, 20, 20, 10, 10, 10]},
    ]
    loads.write_text(json.dumps({"model": "mistralai/Mixtral-8x7B-v0.1", "top_k": 2, "num_model_layers": 32,
                                 "layers": layers}))  # fmt: skip
    arrivals = tmp_path / "arrivals.csv"
    arrivals.write_text("timestamp_s,input_tokens,output_tokens\n0,20,3\n5,10,4\n200,25,3\n500,5,2\n")
    common = ["--loads", str(loads), "--arrivals", str(arrivals), "--duration", "600"]
    plan_path = tmp_path / "plan.json"
    runner = CliRunner()
    refused = runner.invoke(
        cli, ["plan", *common, "--policy", "moeless", "--slo-tpot-ms", "1", "-o", str(plan_path)]
    )
    assert refused.exit_code == 1 and "best reached is p99 TPOT" in refused.output and not plan_path.exists()

    def refused(*flags: str):
        return runner.invoke(
            cli, ["plan", *common, "--policy", "moeless", "--slo-tpot-ms", "9", *flags, "-o", str(plan_path)]
        )

    mixed = refused("--workers", "2")
    assert mixed.exit_code == 2 and "--workers not with --slo-tpot-ms" in mixed.output
    search = tmp_path / "search.json"
    search.write_text(json.dumps({"warm_every_level": True, "uniform_levels": True}))
    both = refused("--search", str(search))
    assert both.exit_code == 1 and "warm_every_level or uniform_levels" in both.output
    search.write_text(json.dumps({"uniform_levels": True, "packings": [1, 4], "typo": 1}))
    unknown = refused("--search", str(search))
    assert unknown.exit_code == 1 and "unknown setting(s) typo" in unknown.output
    unsized = runner.invoke(cli, ["plan", *common, "--policy", "moeless", "-o", str(plan_path)])
    assert unsized.exit_code == 2 and "--arrivals needs --slo-tpot-ms" in unsized.output
    search.write_text(json.dumps({"uniform_levels": True, "processes": 2}))
    sized = runner.invoke(
        cli,
        ["plan", *common, "--policy", "moeless", "--slo-tpot-ms", "1e7", "--frontier", "--prefill-chunk", "8",
         "--search", str(search), "-o", str(plan_path)],
    )  # fmt: skip
    assert sized.exit_code == 0, sized.output
    assert "stall bound: p99 TPOT" in sized.output
    plan = load_plan(plan_path)
    assert (
        plan.params["sizing"]["slo_tpot_ms_p99"] == 1e7
        and plan.params["deployment"]["model"] == "mixtral-8x7b"
        and plan.params["deployment"]["prefill_chunk"] == 8  # the replay below chunks as planned
        and 0 < plan.params["sizing"]["stall_tpot_ms_p99"] <= 1e7
        and plan.params["sizing"]["every_level_premium"] == 0.1  # plan's default insurance
        and plan.params["sizing"]["stall_bound"]  # and its default bound
    )
    assert all(isinstance(f.provisioned_concurrency, int) for f in plan.functions)
    hosted = sorted(pair for f in plan.functions for pair in f.experts)
    assert hosted == [(layer, e) for layer in range(32) for e in range(8)]  # each expert once
    packing = plan.params["sizing"]["packing"]
    assert len(plan.functions) == 32 * 8 // packing and all(f.memory_mb <= 10240 for f in plan.functions)
    rows = list(csv.DictReader(plan_path.with_suffix(".frontier.csv").open()))
    assert "uniform_level" in plan.params["sizing"] and {r["uniform_level"] for r in rows} >= {"", "0", "1"}
    assert [r["policy"] for r in rows if r["chosen"] == "True"].count("moeless") == 1  # the plan's row
    assert {r["every_level"] for r in rows if r["policy"] == "moeless"} == {"True", "False"}  # insured too
    assert {r["policy"] for r in rows} >= {"moeless", "static"} and plan_path.with_suffix(
        ".frontier.png"
    ).is_file()
    out = tmp_path / "sim"
    replayed = runner.invoke(
        cli, ["simulate", *common, "--plan", str(plan_path), "--no-plots", "-o", str(out)]
    )
    assert replayed.exit_code == 0, replayed.output
    results = {r["policy"]: r for r in csv.DictReader((out / "results.csv").open())}
    assert set(results) == {"static", "hybrid", "moeless"}
    planned = plan.params["sizing"]["planned"]
    assert float(results["moeless"]["usd_per_1k_requests"]) == pytest.approx(planned["usd_per_1k_requests"])
    assert int(results["moeless"]["cold_starts"]) == planned["cold_starts"]


def test_simulate_refuses_a_plan_sized_for_another_deployment(tmp_path):
    from click.testing import CliRunner

    from cli.main import cli

    recorded = {"model": "deepseek-v3", "expert_dtype": "int8", "prefill_chunk": 256}
    plan = Plan("moeless", [], [], params={"deployment": recorded})
    plan.save(tmp_path / "plan.json")
    loads = tmp_path / "loads.json"
    loads.write_text(json.dumps({"model": "mistralai/Mixtral-8x7B-v0.1", "top_k": 2, "num_model_layers": 32,
                                 "layers": [{"layer": 0, "counts": [1] * 8}]}))  # fmt: skip
    base = [
        "simulate",
        "--loads",
        str(loads),
        "--plan",
        str(tmp_path / "plan.json"),
        "-o",
        str(tmp_path / "s"),
    ]
    wrong_dtype = CliRunner().invoke(cli, [*base, "--expert-dtype", "fp16"])
    assert wrong_dtype.exit_code == 2 and "sized for expert_dtype int8" in wrong_dtype.output
    wrong_chunk = CliRunner().invoke(cli, [*base, "--expert-dtype", "int8", "--prefill-chunk", "128"])
    assert wrong_chunk.exit_code == 2 and "sized for prefill_chunk 256" in wrong_chunk.output
    wrong_model = CliRunner().invoke(cli, base)
    assert wrong_model.exit_code == 2 and "sized for deepseek-v3" in wrong_model.output


def test_a_clump_of_requests_then_quiet_is_sized_for_the_next_clump():
    """Four requests in the first seconds of a 20-minute trace: the warm-up pass had warmed every
    function for them, but it runs once per deployment. Judged after a quiet, the plan keeps
    function 0 warm, and a second clump after 16 quiet minutes (held out) meets no cold start."""
    deployment = Deployment.choose(one_expert_shape())
    routing = SampledRouting.from_loads(Loads({0: np.array([1.0, 0, 0, 0])}, {"top_k": 1}), 1, [0], 1)
    clump = [Request(2.0 * n, 1, 4, n) for n in range(4)]
    cold_ms = deployment.model.cold_start_ms(deployment.expert_size().weight_bytes)
    slo = Slo(1e6, ttft_ms=cold_ms / 2)
    chosen = size_for_slo("moeless", deployment, routing, clump, 1200.0, slo).chosen
    assert chosen.keep_warm + chosen.provisioned == 1
    two = clump + [Request(1000.0 + 2.0 * n, 1, 4, 4 + n) for n in range(4)]
    replayed = simulate_policy(
        "moeless", deployment, routing, two, 1200.0, plan=chosen.plan, warm_up=True, timeline=False
    ).summary()
    assert replayed["cold_starts"] == 0 and slo.met(replayed)


def test_a_sized_plan_replays_as_it_was_judged():
    """The simulator judges a plan the same way whether the optimiser or `simulate --plan` runs it."""
    deployment = Deployment.choose(one_expert_shape())
    routing = SampledRouting.from_loads(Loads({0: np.array([4.0, 3, 2, 1])}, {"top_k": 1}), 1, [0], 1)
    replay = [Request(30.0 * n, 8, 4, n) for n in range(10)]
    sizing = size_for_slo("moeless", deployment, routing, replay, 300.0, Slo(1e9))
    plan = sizing.chosen.plan
    assert plan.params["sizing"]["judged_after_quiet"]
    again = simulate_policy(
        "moeless", deployment, routing, replay, 300.0, plan=plan, warm_up=False, timeline=False
    )
    assert again.summary()["usd_per_1k_requests"] == pytest.approx(sizing.chosen.usd_per_1k)


def busy_window(levels: int, cold_each: float, busy_each: float = 1.0) -> LevelDemand:
    demand = LevelDemand()
    for level in range(1, levels + 1):
        demand.add(level, busy_each, False)
        demand.cold_starts[level - 1] = cold_each
    return demand


def test_the_replanner_rises_at_once_falls_after_it_persists_and_keeps_what_is_in_flight():
    # at $0.001 a cold start, 2 a window pay for a level's minute; a quarter of one does not
    replanner = ForecastReplanner({"f": MB}, usd_per_cold_start=1e-3, smoothing=0.5, down_after=3)
    up = replanner.update({"f": busy_window(3, 2.0)}, 60.0, {"f": Warmth(0, 0)})
    assert up == {"f": Warmth(3, 0)}  # a burst is met at once
    history, now = [], up
    for _ in range(8):
        now = replanner.update({}, 60.0, now, in_use={"f": 2})
        history.append(now["f"].provisioned)
    # the forecast halves each quiet window; the drop is proposed from the 3rd window on and let
    # through only after 3 proposals in a row, and never below the 2 environments serving invokes
    assert history[:4] == [3, 3, 3, 3] and history[-1] == 2 and history == sorted(history, reverse=True)
    for _ in range(3):
        now = replanner.update({}, 60.0, now, in_use={})
    assert now["f"].provisioned == 0


def test_the_forecast_holds_a_rising_window_and_smooths_a_falling_one():
    replanner = ForecastReplanner({"f": MB}, usd_per_cold_start=1.0, smoothing=0.5)
    first = replanner.forecast({"f": busy_window(1, 4.0, busy_each=30.0)}, 60.0)["f"]
    assert first.cold_starts == [4.0] and first.busy_s == [30.0]
    falling = replanner.forecast({"f": busy_window(1, 0.0, busy_each=10.0)}, 60.0)["f"]
    assert falling.cold_starts == [2.0] and falling.busy_s == [20.0]  # half way down
    rising = replanner.forecast({"f": busy_window(1, 8.0, busy_each=50.0)}, 60.0)["f"]
    assert rising.cold_starts == [8.0] and rising.busy_s == [50.0]  # the newest window, held


def warmth_when_requests_arrive(memory_s: float | None) -> list[int]:
    """A request every 8 windows finds the function's one level idle past the timeout; at $0.01 a
    cold start, one in 8 minutes pays for keeping the level provisioned (8 x $0.00043)."""
    replanner = ForecastReplanner({"f": MB}, usd_per_cold_start=1e-2, memory_s=memory_s)
    now, found = {"f": Warmth(0, 0)}, []
    for window in range(48):
        arrives = window % 8 == 0
        if arrives:
            found.append(now["f"].provisioned)
        now = replanner.update({"f": busy_window(1, 1.0)} if arrives else {}, 60.0, now)
    return found


def test_the_long_memory_keeps_a_level_that_requests_minutes_apart_each_need():
    # the short memory alone decays in each gap and lets the level go before the next request
    assert warmth_when_requests_arrive(None) == [0] * 6
    # the long memory forecasts the rate requests arrive at: warm for every request after the first
    assert warmth_when_requests_arrive(1800.0) == [0, 1, 1, 1, 1, 1]


def test_the_long_memory_follows_traffic_that_stops():
    replanner = ForecastReplanner({"f": MB}, usd_per_cold_start=1e-2, memory_s=1800.0)
    now = {"f": Warmth(0, 0)}
    for _ in range(6):  # a request a minute
        now = replanner.update({"f": busy_window(1, 1.0)}, 60.0, now)
    assert now["f"].provisioned == 1
    held = 0
    while now["f"].provisioned and held < 600:
        now = replanner.update({}, 60.0, now)
        held += 1
    # kept while the long memory's mean still pays for it, then let go: within two hours
    assert 30 <= held <= 120


def quiet_windows(replanner: ForecastReplanner, start: Warmth, windows: int) -> list[Warmth]:
    now, held = {"f": start}, []
    for _ in range(windows):  # no traffic at all
        now = replanner.update({}, 60.0, now)
        held.append(now["f"])
    return held


def test_the_plan_is_a_floor_for_good_or_for_the_hold_given():
    forever = ForecastReplanner({"f": MB}, usd_per_cold_start=1e-2, memory_s=600.0)
    assert quiet_windows(forever, Warmth(2, 1), 48) == [Warmth(2, 1)] * 48
    held = quiet_windows(ForecastReplanner({"f": MB}, usd_per_cold_start=1e-2, memory_s=600.0, hold_s=600.0),
                         Warmth(2, 1), 16)  # fmt: skip
    # proposed from the 10th window (600 s) on, let through after 3 in a row
    assert held[:11] == [Warmth(2, 1)] * 11 and held[11:] == [Warmth(0, 0)] * 5


def test_the_replanner_adds_to_the_plan_and_lets_the_addition_go_back_to_it():
    replanner = ForecastReplanner({"f": MB}, usd_per_cold_start=1e-3, memory_s=None)
    raised = replanner.update({"f": busy_window(3, 2.0)}, 60.0, {"f": Warmth(1, 0)})
    assert raised == {"f": Warmth(3, 0)}  # a burst the plan did not foresee is met at once
    assert quiet_windows(replanner, raised["f"], 20)[-1] == Warmth(1, 0)  # back to the plan, not below


def test_a_sized_plan_with_a_replanner_replays_with_it():
    deployment = Deployment.choose(one_expert_shape())
    routing = SampledRouting.from_loads(Loads({0: np.array([4.0, 3, 2, 1])}, {"top_k": 1}), 1, [0], 1)
    replay = [Request(30.0 * n, 8, 4, n) for n in range(20)]
    sizing = size_for_slo("moeless", deployment, routing, replay, 600.0, Slo(1e9), replan_s=60.0)
    plan = sizing.chosen.plan
    assert plan.params["replan"]["interval_s"] == 60.0 and plan.params["replan"]["ping_usd_per_s"] > 0
    result = simulate_policy(
        "moeless", deployment, routing, replay, 600.0, plan=plan, warm_up=False, timeline=False
    )
    assert result.replans >= 9  # on the clock, once a minute
    assert result.summary()["usd_per_1k_requests"] == pytest.approx(sizing.chosen.usd_per_1k)


def test_provisioned_environments_a_replan_removes_are_billed_in_whole_five_minute_steps():
    """A burst in the first minute: the re-plan at 60 s provisions one environment; the forecast
    (short memory alone) halves each quiet window until the 4th (at 300 s) no longer pays for it,
    and with no hysteresis it goes then, 240 s after it was enabled: billed 300 s, not 240."""
    from moeless.planning.cost_model import CostModel
    from moeless.simulation.simulator import Simulator

    experts = [ExpertPlacement(0, e, function=f"f{e}") for e in range(8)]
    functions = [FunctionSpec(f"f{e}", [(0, e)], MB) for e in range(8)]
    routing = SampledRouting.from_loads(Loads({0: np.array([1.0] + [0.0] * 7)}, {"top_k": 1}), 1, [0], 1)
    burst = [Request(float(t), 1, 2, n) for n, t in enumerate(np.linspace(0, 50, 20))]
    replanner = ForecastReplanner(
        {f.name: MB for f in functions}, usd_per_cold_start=1e-4, down_after=1, memory_s=None
    )
    simulator = Simulator(Plan("moeless", experts, functions), routing, SIZE, CostModel(), GPU, HARDWARE,
                          reprovision=replanner, replan_s=60.0, idle_timeout_s=1.0)  # fmt: skip
    result = simulator.run(burst, 600.0)
    step_usd = 300 * MB / 1024 * PRICES.provisioned_per_gb_second
    assert result.usd["provisioned"] == pytest.approx(step_usd)


def test_a_replan_keeps_a_provisioned_level_that_steady_traffic_uses():
    """A request every 30 s never leaves the one level idle past the timeout, so the demand shows
    no cold start to keep it for; removing its provisioned environment would still make the next
    invoke a cold start, on the request path (on-demand has no environment yet). It stays."""
    from moeless.planning.cost_model import CostModel
    from moeless.simulation.simulator import Simulator

    experts = [ExpertPlacement(0, 0, function="f0")]
    functions = [FunctionSpec("f0", [(0, 0)], MB, provisioned_concurrency=1)]
    routing = SampledRouting.from_loads(Loads({0: np.array([1.0])}, {"top_k": 1}), 1, [0], 1)
    steady = [Request(30.0 * n, 1, 2, n) for n in range(40)]
    replanner = ForecastReplanner({"f0": MB}, usd_per_cold_start=1e-2, down_after=1, hold_s=0.0)
    simulator = Simulator(Plan("moeless", experts, functions), routing, SIZE, CostModel(), GPU, HARDWARE,
                          reprovision=replanner, replan_s=60.0)  # fmt: skip
    result = simulator.run(steady, 1200.0)
    assert result.replans >= 19 and result.summary()["cold_starts"] == 0
    assert simulator.plan.functions[0].provisioned_concurrency == 1


def test_packing_chains_the_experts_tokens_take_and_keeps_within_lambdas_limits():
    from moeless.errors import PlanError
    from moeless.planning.packing import pack_across_layers

    pairs = [(layer, e) for layer in range(4) for e in range(3)]
    placements = [ExpertPlacement(layer, e, function=f"f{layer}{e}") for layer, e in pairs]
    plan = Plan("moeless", placements, [FunctionSpec(f"f{layer}{e}", [(layer, e)]) for layer, e in pairs])
    follows = {0: 2, 1: 0, 2: 1}  # tokens at expert e go on to expert follows[e] at the next layer

    def scores(a: int, b: int) -> np.ndarray:
        matrix = np.ones((3, 3))
        for e, after in follows.items():
            matrix[e, after] = 100.0
        return matrix

    packed = pack_across_layers(plan, 2, scores, lambda n: 1769 * n)
    groups = sorted(f.experts for f in packed.functions)
    assert len(groups) == 6 and all(len(g) == 2 for g in groups)
    for (l0, e0), (l1, e1) in groups:
        assert l1 == l0 + 1 and l0 in (0, 2) and e1 == follows[e0]
    assert {p.function for p in packed.experts} == {f.name for f in packed.functions}
    assert all(f.memory_mb == 2 * 1769 for f in packed.functions)
    with pytest.raises(PlanError, match="over Lambda's 10240 MB"):
        pack_across_layers(plan, 4, scores, lambda n: 3000 * n)


def test_a_packed_plan_still_cuts_every_invoke_to_the_payload_limit():
    from dataclasses import replace as with_fields

    shape = with_fields(one_expert_shape(), num_layers=4, moe_layers=(0, 1, 2, 3))
    deployment = Deployment.choose(shape)
    loads = Loads({layer: np.array([4.0, 3, 2, 1]) for layer in range(4)}, {"top_k": 1})
    routing = SampledRouting.from_loads(loads, 1, [0, 1, 2, 3], 4)
    replay = [Request(0.0, 40_000, 2)]
    sizing = size_for_slo("moeless", deployment, routing, replay, 10.0, Slo(1e9), packings=[4])
    plan = sizing.chosen.plan
    assert len(plan.functions) == 4 and all(len(f.experts) == 4 for f in plan.functions)
    assert plan.params["sizing"]["packing"] == 4
    result = simulate_policy("moeless", deployment, routing, replay, 10.0, plan=plan)
    limit = max_tokens_per_request(deployment.shape.hidden)
    assert result.pieces and all(rows <= limit for _, _, rows in result.pieces)
    assert any(rows == limit for _, _, rows in result.pieces)  # expert 0 got ~16,000 prefill rows: cut
    assert sum(rows for _, _, rows in result.pieces) == 4 * (40_000 + 1)  # each layer: prefill, 1 token


def test_experts_of_a_layer_packed_in_one_function_take_one_invoke_per_step_and_layer():
    from dataclasses import replace as with_fields

    from moeless.planning.packing import pack_within_layer

    shape = with_fields(one_expert_shape(), num_layers=2, moe_layers=(0, 1))
    deployment = Deployment.choose(shape)
    loads = Loads({layer: np.array([4.0, 3, 2, 1]) for layer in range(2)}, {"top_k": 2})
    routing = SampledRouting.from_loads(loads, 2, [0, 1], 2)
    replay = [Request(0.0, 64, 6)]
    base = with_concurrency(plan_for_policy("moeless", loads, deployment), {})
    apart = simulate_policy("moeless", deployment, routing, replay, 30.0, plan=base, predictors=False)
    packed = pack_within_layer(base, 4, lambda _: np.ones((4, 4)), lambda _: np.ones(4), lambda n: 1769 * n)
    together = simulate_policy("moeless", deployment, routing, replay, 30.0, plan=packed, predictors=False)
    assert {len(f.experts) for f in packed.functions} == {4}
    # every step, every layer: one invoke carries all its experts; the prefill's rows of an expert
    # with r replicas go out as r invokes (the r environments), each carrying the others' rows too
    most = {layer: max(p.replicas for p in base.experts if p.layer == layer) for layer in (0, 1)}
    assert together.invokes == sum(6 + most[layer] - 1 for layer in (0, 1))
    assert apart.invokes > together.invokes and apart.cold_starts > together.cold_starts
    assert sum(r for _, _, r in apart.pieces) == sum(r for _, _, r in together.pieces)  # the same rows


def test_grouping_a_layers_experts_is_a_choice_the_optimiser_weighs():
    deployment = Deployment.choose(one_expert_shape())
    routing = SampledRouting.from_loads(Loads({0: np.array([4.0, 3, 2, 1])}, {"top_k": 2}), 2, [0], 1)
    replay = [Request(20.0 * n, 200, 8, n) for n in range(10)]
    apart = size_for_slo("moeless", deployment, routing, replay, 200.0, Slo(1e9), packings=[1])
    either = size_for_slo(
        "moeless", deployment, routing, replay, 200.0, Slo(1e9), packings=[1], groups=[1, 4]
    )
    assert {p.group for p in apart.points} == {1} and {p.group for p in either.points} == {1, 4}
    grouped = [p for p in either.points if p.group == 4]
    assert all(len(f.experts) == 4 for p in grouped for f in p.plan.functions)
    assert min(p.summary["invokes"] for p in grouped) < min(p.summary["invokes"] for p in apart.points)
    assert either.chosen.usd_per_1k <= apart.chosen.usd_per_1k  # more choices never cost more
    assert either.chosen.plan.params["sizing"]["group"] == either.chosen.group


def test_a_cheaper_expert_dtype_is_chosen_only_where_the_user_allows_it():
    deployment = Deployment.choose(one_expert_shape())
    routing = SampledRouting.from_loads(Loads({0: np.array([4.0, 3, 2, 1])}, {"top_k": 1}), 1, [0], 1)
    replay = [Request(20.0 * n, 200, 8, n) for n in range(10)]
    fp32 = size_for_slo("moeless", deployment, routing, replay, 200.0, Slo(1e9))
    assert {p.expert_dtype for p in fp32.points} == {"fp32"}
    allowed = size_for_slo(
        "moeless", deployment, routing, replay, 200.0, Slo(1e9), expert_dtypes=["fp32", "int8"]
    )
    assert {p.expert_dtype for p in allowed.points} == {"fp32", "int8"}
    assert allowed.chosen.expert_dtype == "int8"  # a quarter of the bytes, 4.2x the speed
    assert allowed.chosen.plan.params["deployment"]["expert_dtype"] == "int8"
    assert allowed.chosen.usd_per_1k <= fp32.chosen.usd_per_1k


def test_a_prefill_chunk_is_a_choice_the_optimiser_weighs_against_the_slo():
    """Short requests decoding while long prompts arrive: whole prompts stall every decoding
    sequence for a long prefill step; chunked, the TPOT SLO that whole prompts miss is met, and
    the plan records the chunk it was sized with (the engine then chunks as planned)."""
    deployment = Deployment.choose(one_expert_shape())
    routing = SampledRouting.from_loads(Loads({0: np.array([4.0, 3, 2, 1])}, {"top_k": 1}), 1, [0], 1)
    replay = [Request(0.5 * n, 8, 60, n) if n % 4 else Request(0.5 * n, 6000, 2, n) for n in range(24)]
    whole = size_for_slo("moeless", deployment, routing, replay, 60.0, Slo(1e9))
    either = size_for_slo("moeless", deployment, routing, replay, 60.0, Slo(1e9), prefill_chunks=[None, 256])
    assert {p.prefill_chunk for p in either.points} == {None, 256}
    by_chunk = {c: min(p.summary["tpot_ms_p99"] for p in either.points if p.prefill_chunk == c)
                for c in (None, 256)}  # fmt: skip
    assert by_chunk[256] < by_chunk[None]
    bound = (by_chunk[256] + by_chunk[None]) / 2
    with pytest.raises(SloUnreachable):
        size_for_slo("moeless", deployment, routing, replay, 60.0, Slo(bound))
    chunked = size_for_slo(
        "moeless", deployment, routing, replay, 60.0, Slo(bound), prefill_chunks=[None, 256]
    )
    assert chunked.chosen.prefill_chunk == 256
    assert chunked.chosen.plan.params["deployment"]["prefill_chunk"] == 256
    assert whole.chosen.plan.params["deployment"]["prefill_chunk"] is None


def test_the_stall_bound_sizes_replicas_for_overlaps_the_planning_traffic_never_had():
    """Planned on prompts that arrive alone, x1 replicas meet the TPOT bound and miss it once the
    same prompts arrive together (each decodes beside the others' chunks). The stall probe
    predicts that overlapped TPOT with the traffic unseen; under the bound the optimiser takes
    the replicas that meet it, and a bound no structure meets is refused saying why."""
    from moeless.sizing.report import stall_lines as _stall_lines
    from moeless.sizing.stall import stall_tpot_ms

    deployment = replace(Deployment.choose(one_expert_shape()), prefill_chunk=256)
    routing = SampledRouting.from_loads(Loads({0: np.array([4.0, 3, 2, 1])}, {"top_k": 1}), 1, [0], 1)
    alone = [Request(400.0 * n, 1024, 8, n) for n in range(3)]
    together = [Request(0.01 * n, 1024, 8, n) for n in range(6)]
    options = {"memory_options": [MB], "packings": [1], "replica_scales": [1, 4]}
    frontier = size_for_slo(
        "moeless", deployment, routing, alone, 1200.0, Slo(1e9), stall_bound=True, **options
    )
    stall = {p.replica_scale: p.stall_tpot_ms for p in frontier.points}
    assert stall[4] < stall[1]
    for point in (next(p for p in frontier.points if p.replica_scale == s) for s in (1, 4)):
        overlapped = simulate_policy(
            "moeless", deployment, routing, together, 1200.0, plan=point.plan, timeline=False
        ).summary()["tpot_ms_p99"]
        assert overlapped == pytest.approx(stall_tpot_ms(point.plan, deployment, routing), rel=0.05)
    alone_ms = max(p.summary["tpot_ms_p99"] for p in frontier.points)
    bound = (stall[1] + stall[4]) / 2
    assert alone_ms < stall[4] < bound
    trace_only = size_for_slo("moeless", deployment, routing, alone, 1200.0, Slo(bound), **options).chosen
    sizing = size_for_slo(
        "moeless", deployment, routing, alone, 1200.0, Slo(bound), stall_bound=True, **options
    )
    bounded = sizing.chosen
    assert (trace_only.replica_scale, bounded.replica_scale) == (1, 4)
    # the structures over the bound are still simulated: what the traffic alone takes, and the price
    assert (sizing.unbounded.replica_scale, sizing.unbounded.usd_per_1k) == (1, trace_only.usd_per_1k)
    said = _stall_lines(sizing)
    assert (
        said[0].startswith("  stall bound: p99 TPOT")
        and '"stall_bound": false in --search): replicas x1' in said[1]
    )
    assert f"costs {bounded.usd_per_1k / trace_only.usd_per_1k:.2f}x here" in said[1]
    assert (
        "within the SLO"
        in _stall_lines(size_for_slo("moeless", deployment, routing, alone, 1200.0, Slo(1e9), **options))[0]
    )
    assert bounded.plan.params["sizing"]["stall_tpot_ms_p99"] == stall[4]
    # sized without the bound, the plan still records its structure's probe: over the bound here
    unbounded = trace_only.plan.params["sizing"]
    assert unbounded["stall_tpot_ms_p99"] == pytest.approx(stall[1]) and not unbounded["stall_bound"]
    assert bounded.plan.params["sizing"]["stall_bound"]

    def on_overlaps(plan: Plan) -> float:
        return simulate_policy(
            "moeless", deployment, routing, together, 1200.0, plan=plan, timeline=False
        ).summary()["tpot_ms_p99"]

    assert on_overlaps(trace_only.plan) > bound >= on_overlaps(bounded.plan)
    tight = Slo((alone_ms + stall[4]) / 2)
    assert size_for_slo("moeless", deployment, routing, alone, 1200.0, tight, **options).chosen
    with pytest.raises(SloUnreachable, match="within the stall bound: no replicas") as refused:
        size_for_slo("moeless", deployment, routing, alone, 1200.0, tight, stall_bound=True, **options)
    assert '"stall_bound": false in --search) it is met here by replicas x1' in str(refused.value)
    whole = replace(deployment, prefill_chunk=None)  # the probe's prompt is context-long
    with pytest.raises(SloUnreachable, match=r"whole prompts: a prefill chunk \(--prefill-chunk\)"):
        size_for_slo("moeless", whole, routing, alone, 1200.0, tight, stall_bound=True, **options)


def test_the_levels_in_reach_bound_what_a_step_can_hold_at_once():
    """Function f hosts expert 0 of layer 0 with 3 replicas and expert 0 of layer 1 with one: 35
    rows cut at 10 per invoke are 3 x 2 invokes at layer 0 and 4 at layer 1; the layers take
    turns, so 6 environments, twice that with two steps in flight."""
    from moeless.planning.concurrency import levels_in_reach

    plan = Plan(
        "moeless",
        [ExpertPlacement(0, 0, replicas=3, function="f"), ExpertPlacement(1, 0, function="f"),
         ExpertPlacement(1, 1, function="g")],
        [FunctionSpec("f", [(0, 0), (1, 0)]), FunctionSpec("g", [(1, 1)])],
    )  # fmt: skip
    assert levels_in_reach(plan, 35, 10) == {"f": 6, "g": 4}
    assert levels_in_reach(plan, 35, 10, loops=2) == {"f": 12, "g": 8}


def test_every_level_in_reach_warm_leaves_no_cold_start_on_traffic_the_plan_never_saw():
    """Sized on prompts that arrive alone for a loose bound, the cheapest plan keeps nothing warm
    and the same prompts arriving together start cold. With every level in reach provisioned no
    invoke starts cold and none finds more environments busy than were provisioned; with pings
    allowed, the same levels are warm, those provisioning does not pay for pinged."""
    deployment = replace(Deployment.choose(one_expert_shape()), prefill_chunk=256)
    routing = SampledRouting.from_loads(Loads({0: np.array([4.0, 3, 2, 1])}, {"top_k": 1}), 1, [0], 1)
    alone = [Request(400.0 * n, 1024, 8, n) for n in range(3)]
    together = [Request(0.01 * n, 1024, 8, n) for n in range(6)]
    options = {"memory_options": [MB], "packings": [1], "replica_scales": [4], "keep_warm": False}
    slo = Slo(1e9, ttft_ms=1e9)
    cheapest = size_for_slo("moeless", deployment, routing, alone, 1200.0, slo, **options).chosen
    every = size_for_slo(
        "moeless", deployment, routing, alone, 1200.0, slo, every_level=True, **options
    ).chosen
    assert every.provisioned > cheapest.provisioned and every.keep_warm == 0

    def on_overlaps(plan: Plan):
        return simulate_policy("moeless", deployment, routing, together, 1200.0, plan=plan, timeline=False)

    assert on_overlaps(cheapest.plan).cold_starts > 0
    replayed = on_overlaps(every.plan)
    assert replayed.cold_starts == 0
    provisioned = {f.name: f.provisioned_concurrency for f in every.plan.functions}
    assert all(len(d.invokes) <= provisioned[name] for name, d in replayed.demand.items())
    pinged = size_for_slo("moeless", deployment, routing, alone, 1200.0, slo, every_level=True,
                          **options | {"keep_warm": True}).chosen  # fmt: skip
    assert (
        pinged.keep_warm > 0
        and {f.name: f.provisioned_concurrency + f.keep_warm for f in pinged.plan.functions} == provisioned
    )


def test_the_best_reachable_latency_is_that_of_a_plan_that_completed_its_requests():
    from moeless.sizing import FrontierPoint, Sizing
    from moeless.sizing.structures import Structure

    structure = Structure(Deployment.choose(one_expert_shape()), Plan("moeless", [], []), 1769, 1, 1, 1)

    def point(completed: int, tpot_ms: float | None) -> FrontierPoint:
        summary = {"completed": completed, "requests": 4, "tpot_ms_p99": tpot_ms, "ttft_ms_p99": tpot_ms,
                   "usd_per_1k_requests": 1.0}  # fmt: skip
        return FrontierPoint(structure, 0.0, Plan("moeless", [], []), summary)

    overloaded, slow, fast_but_partial = point(0, None), point(4, 900.0), point(3, 100.0)
    sizing = Sizing("moeless", Slo(1.0), None, (overloaded, fast_but_partial, slow), 50.0, False, None, None)
    assert sizing.best_latency() is slow  # finishing none measures no latency at all
    with pytest.raises(SloUnreachable, match="best reached is p99 TPOT 900.0 ms"):
        raise SloUnreachable(sizing)


def test_with_uniform_levels_the_plan_never_costs_more_than_a_uniform_level_that_meets():
    """Each structure's family also holds the brute force's plans: every function warm to one
    level, capped at its levels in reach. The chosen plan then costs no more than any uniform
    level that meets the SLO on the planning traffic, replayed here on its own (uncapped)."""
    deployment = replace(Deployment.choose(one_expert_shape()), prefill_chunk=256)
    routing = SampledRouting.from_loads(Loads({0: np.array([4.0, 3, 2, 1])}, {"top_k": 1}), 1, [0], 1)
    alone = [Request(400.0 * n, 1024, 8, n) for n in range(3)]
    options = {"memory_options": [MB], "packings": [1], "replica_scales": [2], "keep_warm": False}
    slo = Slo(1e9, ttft_ms=1e9)
    sizing = size_for_slo("moeless", deployment, routing, alone, 1200.0, slo, uniform_levels=True, **options)
    uniform = {p.uniform_level: p for p in sizing.points if p.uniform_level is not None}
    reach = {"moeless-l000-e000": 6, "moeless-l000-e001": 4, "moeless-l000-e002": 2, "moeless-l000-e003": 2}
    assert sorted(uniform) == [0, 1, 2, 3, 4]
    for level, point in uniform.items():
        warm = {f.name: f.provisioned_concurrency for f in point.plan.functions}
        assert warm == {name: min(level, most) for name, most in reach.items()}
    assert len(sizing.points) == len(PRICE_GRID) + len(uniform)

    # a TTFT bound the family's price rule meets only by keeping every level (each level's first
    # use is its only cold start, so it keeps all or none), and uniform level 2 meets for less
    bound = Slo(1e9, ttft_ms=uniform[2].summary["ttft_ms_p99"])
    assert not bound.met(uniform[0].summary)
    priced = size_for_slo("moeless", deployment, routing, alone, 1200.0, bound, **options).chosen
    chosen = size_for_slo("moeless", deployment, routing, alone, 1200.0, bound, uniform_levels=True,
                          **options).chosen  # fmt: skip
    assert priced is not None and chosen is not None and bound.met(chosen.summary)
    assert chosen.usd_per_1k < priced.usd_per_1k and chosen.uniform_level is not None
    for level in range(5):
        plan = with_concurrency(chosen.plan, {f.name: Warmth(level) for f in chosen.plan.functions})
        replayed = simulate_policy("moeless", deployment, routing, alone, 1200.0, plan=plan, warm_up=False,
                                   timeline=False).summary()  # fmt: skip
        if bound.met(replayed):
            assert chosen.usd_per_1k <= replayed["usd_per_1k_requests"] + 1e-9
    assert chosen.plan.params["sizing"]["uniform_level"] == chosen.uniform_level


def test_every_level_is_taken_where_it_costs_at_most_the_premium_over_the_cheapest():
    """Each structure's family also holds the every-level plan (no cold start on any traffic);
    it is the structure's pick where it meets the SLO for at most 1 + premium times the cheapest
    plan that meets it, and the plan records what that insurance cost. Without a premium it is
    not judged at all."""
    deployment = replace(Deployment.choose(one_expert_shape()), prefill_chunk=256)
    routing = SampledRouting.from_loads(Loads({0: np.array([4.0, 3, 2, 1])}, {"top_k": 1}), 1, [0], 1)
    alone = [Request(400.0 * n, 1024, 8, n) for n in range(3)]
    options = {"memory_options": [MB], "packings": [1], "replica_scales": [4], "keep_warm": False}
    slo = Slo(1e9, ttft_ms=1e9)
    plain = size_for_slo("moeless", deployment, routing, alone, 1200.0, slo, **options)
    assert not any(p.every_level for p in plain.points) and plain.premium_paid is None
    judged = size_for_slo(
        "moeless", deployment, routing, alone, 1200.0, slo, every_level_premium=0.0, **options
    )
    every = next(p for p in judged.points if p.every_level)
    cheapest = judged.chosen
    assert cheapest.usd_per_1k == plain.chosen.usd_per_1k < every.usd_per_1k
    ratio = every.usd_per_1k / cheapest.usd_per_1k
    below = size_for_slo("moeless", deployment, routing, alone, 1200.0, slo,
                         every_level_premium=0.99 * ratio - 1, **options).chosen  # fmt: skip
    assert not below.every_level and below.usd_per_1k == cheapest.usd_per_1k
    insured = size_for_slo("moeless", deployment, routing, alone, 1200.0, slo,
                           every_level_premium=1.01 * ratio - 1, **options)  # fmt: skip
    within = insured.chosen
    assert within.every_level and insured.premium_paid == pytest.approx(ratio)
    assert {f.name: f.provisioned_concurrency for f in within.plan.functions} == {
        f.name: f.provisioned_concurrency for f in every.plan.functions
    }
    sizing = within.plan.params["sizing"]
    assert sizing["every_level"] and sizing["premium_paid"] == pytest.approx(ratio)
    assert sizing["every_level_premium"] == pytest.approx(1.01 * ratio - 1)
