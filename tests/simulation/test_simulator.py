"""The simulator: every token served once, a cost computed by hand, the oracle as a bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moeless.contracts.loads import Loads
from moeless.errors import SimulationError
from moeless.planning.cost_model import CostModel, ExpertShape
from moeless.planning.planner import PlanRequest, make_plan
from moeless.planning.remoe import Workload
from moeless.simulation.simulator import Request, Simulator, arrivals, sample_requests

SIZE = ExpertShape(1024, 2816, 3 * 1024 * 2816 * 4)
LOADS = Loads(
    {0: np.array([50.0, 30, 10, 5, 3, 1, 1, 0]), 1: np.array([5.0, 5, 20, 20, 20, 10, 10, 10])}, {"top_k": 2}
)


def requests(rate: float = 4.0, duration: float = 10.0, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    return sample_requests(LOADS, arrivals(f"poisson:{rate}", duration, rng), 2, 24, 8, rng)


def plan(policy: str, **options):
    return make_plan(LOADS, PlanRequest(policy, workload=Workload(top_k=2), **options))


def test_every_token_is_served_exactly_once():
    replay = requests()
    routed: dict[tuple[int, int], int] = {}
    for request in replay:
        for step in request.steps:
            for index, routing in enumerate(step):
                for expert, tokens in routing.items():
                    routed[(index, expert)] = routed.get((index, expert), 0) + tokens
    for policy, options in (
        ("static", {"workers": 4}),
        ("moeless", {"workers": 4, "slots": 12}),
        ("remoe", {}),
    ):
        result = Simulator(plan(policy, **options), [0, 1], SIZE, CostModel()).run(replay, 10.0)
        assert result.tokens_served == routed, policy
        assert len(result.request_latency_ms) == len(replay)
        assert len(result.layer_latency_ms) == sum(len(r.steps) * 2 for r in replay)


def test_cost_of_one_cold_invoke_matches_a_hand_computation():
    model = CostModel()
    one = make_plan(Loads({0: np.array([1.0, 0])}), PlanRequest("moeless", workload=Workload(top_k=1)))
    for spec in one.functions:
        spec.provisioned_concurrency = 0
    request = Request(0.0, [[{0: 5}]])
    result = Simulator(one, [0], SIZE, model, backbone_ms_per_layer=0.0).run([request], duration_s=1.0)
    memory = one.functions[0].memory_mb
    compute = model.expert_ms(5, SIZE.hidden, SIZE.intermediate, model.vcpus(memory), SIZE.weight_bytes)
    cold = model.cold_start_ms(SIZE.weight_bytes)
    assert result.cold_starts == 1 and result.invokes == 1
    assert result.usd["requests"] == pytest.approx(0.20 / 1e6)
    assert result.usd["duration"] == pytest.approx(
        math.ceil(compute + cold) / 1000 * memory / 1024 * 0.0000166667
    )
    latency = cold + model.invoke_overhead_ms + compute
    assert result.layer_latency_ms == [pytest.approx(latency)]
    span = max(1.0, latency / 1000)
    assert result.usd["gpu"] == pytest.approx(model.gpu.hourly_usd / 3600 * span)
    assert result.usd["provisioned"] == 0


def test_oracle_is_never_slower_at_equal_capacity():
    replay = requests(rate=8.0)
    for options in ({"workers": 4, "slots": 12}, {}):
        same = plan("moeless", **options)
        real = Simulator(same, [0, 1], SIZE, CostModel()).run(replay, 10.0).summary()
        bound = Simulator(same, [0, 1], SIZE, CostModel(), oracle=True).run(replay, 10.0).summary()
        for key in ("moe_layer_ms_p50", "moe_layer_ms_p99", "request_ms_p99"):
            assert bound[key] <= real[key] + 1e-9, key
        assert bound["cold_starts"] == 0


def test_a_busy_worker_queues_and_warm_instances_are_reused():
    static = plan("static", workers=1)
    burst = [Request(0.0, [[{0: 4}, {2: 4}]]), Request(0.0, [[{0: 4}, {2: 4}]])]
    result = Simulator(static, [0, 1], SIZE, CostModel()).run(burst, 1.0)
    first, second = result.layer_latency_ms[0], result.layer_latency_ms[1]
    assert second == pytest.approx(2 * first)  # the second waits for the first on the only worker
    serverless = one_function_per_expert_plan()
    later = [
        Request(0.0, [[{0: 4}, {2: 4}]]),
        Request(60.0, [[{0: 4}, {2: 4}]]),
        Request(1000.0, [[{0: 4}, {2: 4}]]),
    ]
    warm = Simulator(serverless, [0, 1], SIZE, CostModel(), idle_timeout_s=300).run(later, 1000.0)
    assert warm.cold_starts == 4  # 2 for the first request, none at 60 s, 2 again after the idle timeout


def one_function_per_expert_plan():
    from moeless.contracts.plan import ExpertPlacement, FunctionSpec, Plan, function_name

    experts = [
        ExpertPlacement(layer, e, function=function_name(layer, e)) for layer in (0, 1) for e in range(8)
    ]
    functions = [FunctionSpec(p.function, [(p.layer, p.expert)]) for p in experts]
    return Plan("one-function-per-expert", experts, functions)


def test_arrival_processes():
    rng = np.random.default_rng(0)
    steady = arrivals("poisson:10", 100.0, rng)
    assert 800 < len(steady) < 1200 and np.all(np.diff(steady) >= 0)
    bursty = arrivals("bursty:10:1.8:20", 100.0, rng)
    assert 800 < len(bursty) < 1200
    first_halves = sum(1 for t in bursty if (t % 20) < 10)
    assert first_halves > 0.8 * len(bursty)
    with pytest.raises(SimulationError, match="poisson:RATE"):
        arrivals("uniform:3", 1.0, rng)


def test_recorded_arrival_timestamps(tmp_path):
    (tmp_path / "arrivals.txt").write_text("100.5\n100.0\n107.25\n200\n")
    times = arrivals(f"timestamps:{tmp_path / 'arrivals.txt'}", 50.0, np.random.default_rng(0))
    assert list(times) == [0.0, 0.5, 7.25]
    with pytest.raises(SimulationError, match="timestamps"):
        arrivals(f"timestamps:{tmp_path / 'missing.txt'}", 1.0, np.random.default_rng(0))


def test_simulate_command_writes_the_report(tmp_path):
    import json

    from click.testing import CliRunner

    from moeless.cli.main import cli

    (tmp_path / "loads.json").write_text(json.dumps(LOADS.to_dict()))
    result = CliRunner().invoke(
        cli,
        [
            "simulate",
            "--loads",
            str(tmp_path / "loads.json"),
            "--arrival",
            "poisson:2",
            "--duration",
            "5",
            "--hidden",
            "256",
            "--intermediate",
            "512",
            "--prompt-tokens",
            "8",
            "--output-tokens",
            "4",
            "-o",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = (tmp_path / "r" / "report.md").read_text()
    for policy in ("static", "static-replicated", "moeless", "remoe", "oracle"):
        assert f"| {policy} |" in report
    assert "Constants and their sources" in report
    assert (tmp_path / "r" / "results.csv").read_text().count("\n") == 6
    assert (tmp_path / "r" / "latency_cdf.png").is_file() and (tmp_path / "r" / "concurrency.png").is_file()
    bad = CliRunner().invoke(
        cli,
        [
            "simulate",
            "--loads",
            str(tmp_path / "loads.json"),
            "--arrival",
            "zipf:1",
            "-o",
            str(tmp_path / "x"),
        ],
    )
    assert bad.exit_code == 2 and "poisson:RATE" in bad.output


def test_trace_replay_keeps_the_recorded_routing(tiny, tmp_path):
    from moeless.prediction.trace import load_trace, profile
    from moeless.simulation.simulator import requests_from_trace

    profile(tiny.model("mixtral"), ["hello world", "MoE"], tmp_path / "t", max_new_tokens=3, progress=False)
    trace = load_trace(tmp_path / "t")
    replay = requests_from_trace(trace, np.array([0.0, 1.0, 2.0]))
    assert len(replay) == 3 and replay[2].steps == replay[0].steps  # cycled
    first = trace.prompts[0]
    assert len(replay[0].steps) == 1 + first["generated_tokens"]
    assert sum(replay[0].steps[0][0].values()) == first["prompt_tokens"] * 2


def test_plot_series_and_files(tmp_path):
    from moeless.simulation.plots import concurrency_over_time, load_cv_over_time, write_plots
    from moeless.simulation.simulator import PolicyResult

    result = PolicyResult("p", duration_s=20.0, requests=1, request_latency_ms=[5.0], usd={"gpu": 1.0})
    result.busy = [(0.0, 5.0), (2.5, 7.5)]  # 10 instance-seconds in the first 10 s bin
    result.pieces = [(1.0, "a", 6), (2.0, "b", 2), (15.0, "a", 4), (16.0, "b", 4)]
    times, busy = concurrency_over_time(result, 10.0)
    assert list(times[:2]) == [0.0, 10.0] and busy[0] == pytest.approx(1.0) and busy[1] == 0
    _, cv = load_cv_over_time(result, 10.0)
    assert cv[0] == pytest.approx(0.5) and cv[1] == pytest.approx(0.0)
    names = [p.name for p in write_plots([result], tmp_path)]
    assert names == ["latency_cdf.png", "cost_breakdown.png", "load_cv.png", "concurrency.png"]
    assert all((tmp_path / n).stat().st_size > 1000 for n in names)


def test_simulation_is_deterministic_for_a_seed_and_serverful_replication_balances_workers():
    from moeless.planning.cost_model import ExpertShape
    from moeless.simulation.simulator import simulate_policy

    shape = ExpertShape(SIZE.hidden, SIZE.intermediate, SIZE.weight_bytes)
    runs = [
        simulate_policy("moeless", LOADS, 2, shape, 4, requests(seed=3), 10.0, CostModel()).summary()
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    replay = requests(rate=20.0, seed=4)
    plain = simulate_policy("static", LOADS, 2, shape, 4, replay, 10.0, CostModel()).summary()
    replicated = simulate_policy("static-replicated", LOADS, 2, shape, 4, replay, 10.0, CostModel()).summary()
    assert replicated["usd_per_1k_requests"] == pytest.approx(plain["usd_per_1k_requests"])  # same fleet
    assert replicated["moe_layer_ms_p99"] <= plain["moe_layer_ms_p99"]


def test_replanning_switches_plans_and_integrates_provisioned_cost():
    model = CostModel()
    first = one_function_per_expert_plan()
    for spec in first.functions:
        spec.provisioned_concurrency = 1 if spec.name == "moeless-l000-e000" else 0
    second = one_function_per_expert_plan()
    switched = []

    def replan(window):
        switched.append(window)
        return second

    replay = [Request(0.0, [[{0: 2}, {2: 2}]]), Request(6.0, [[{0: 2}, {2: 2}]])]
    sim = Simulator(first, [0, 1], SIZE, model, replan=replan, replan_s=5.0)
    result = sim.run(replay, 10.0)
    assert result.replans == 1 and switched[0].layers[0][0] == 2  # the window saw the first request
    memory = first.functions[0].memory_mb
    assert result.usd["provisioned"] == pytest.approx(model.provisioned_usd_per_s(memory, 1) * 6.0)
    replayed = requests(rate=4.0)
    from moeless.planning.cost_model import ExpertShape
    from moeless.simulation.simulator import simulate_policy

    shape = ExpertShape(SIZE.hidden, SIZE.intermediate, SIZE.weight_bytes)
    live = simulate_policy("moeless", LOADS, 2, shape, 4, replayed, 10.0, model, replan_s=2.0)
    assert live.replans >= 3
    assert sum(live.tokens_served.values()) == sum(
        t for r in replayed for step in r.steps for routing in step for t in routing.values()
    )


def test_prewarming_from_a_predictor_takes_cold_starts_off_the_path():
    from moeless.simulation.simulator import PrewarmModel

    plan = one_function_per_expert_plan()
    # requests further apart than the idle timeout: every one meets cold functions
    spaced = [Request(t, [[{0: 2}, {2: 2}], [{0: 1}, {3: 1}]]) for t in (0.0, 400.0, 800.0)]
    without = Simulator(plan, [0, 1], SIZE, CostModel()).run(spaced, 900.0)
    ahead = Simulator(plan, [0, 1], SIZE, CostModel(), prewarm=PrewarmModel(1.0, "request")).run(
        spaced, 900.0
    )
    assert without.cold_starts == 9 and ahead.cold_starts == 0  # layer 0, 1, and expert 3 of the decode step
    assert ahead.prewarms == 9 and ahead.waited_for_warmup > 0
    assert ahead.usd["requests"] > without.usd["requests"]  # warm-ups are invokes too
    layer = Simulator(plan, [0, 1], SIZE, CostModel(), prewarm=PrewarmModel(1.0, "layer")).run(spaced, 900.0)
    assert 0 < layer.cold_starts < without.cold_starts  # layer 0 cannot be foreseen from inside the request
    never = Simulator(plan, [0, 1], SIZE, CostModel(), prewarm=PrewarmModel(0.0, "request")).run(
        spaced, 900.0
    )
    assert never.cold_starts == without.cold_starts and never.prewarms == 0
