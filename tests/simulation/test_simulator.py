"""The whole-model simulator: a batched step checked by hand, every token served once, cost that
scales with the layers, the oracle as a bound, pre-warming, re-planning, and the command."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from moeless.contracts.loads import Loads
from moeless.contracts.plan import ExpertPlacement, FunctionSpec, Plan
from moeless.model.shapes import ModelShape
from moeless.planning.cost_model import CostModel, ExpertShape
from moeless.simulation.host import HostModel
from moeless.simulation.roofline import Hardware, Roofline
from moeless.simulation.routing import RecordedRouting, SampledRouting
from moeless.simulation.simulator import GpuModel, PolicyResult, PrewarmModel, Request, Simulator

SIZE = ExpertShape(1024, 2816, 3 * 1024 * 2816 * 4)
SHARES = {0: [50.0, 30, 10, 5, 3, 1, 1, 0], 1: [5.0, 5, 20, 20, 20, 10, 10, 10]}
# a GPU whose dense part takes exactly 0.5 ms per layer (1 GB over 2 blocks at 1 TB/s, nothing else)
GPU = GpuModel(blocks=2, dense_bytes=1e9, dense_params=0, kv_bytes_per_token=0, attention_flops=0,
               expert_bytes=SIZE.weight_bytes / 2, expert_params=3 * 1024 * 2816)  # fmt: skip
HARDWARE = Hardware("1x test", 3.6, Roofline(1000, 1000, 1.0, 1.0, 0.0))


def toy_shape(layers: int) -> ModelShape:
    return ModelShape(
        name="toy", num_layers=layers, moe_layers=tuple(range(layers)), num_experts=8, top_k=2,
        hidden=1024, expert_intermediate=2816, shared_experts=0, shared_intermediate=0,
        dense_params=1e8, kv_bytes_per_token=1024, attention_flops_per_token_per_context=0,
        native_dtype="bf16", source="test",
    )  # fmt: skip


def sampled(layers: int = 2) -> SampledRouting:
    loads = Loads({i: np.array(SHARES[i % 2]) for i in range(layers)}, {"top_k": 2})
    return SampledRouting.from_loads(loads, 2, list(range(layers)), layers)


def one_function_each(layers: int = 2, experts: int = 8, provisioned: int = 0) -> Plan:
    placements, functions = [], []
    for layer in range(layers):
        for expert in range(experts):
            name = f"f-{layer}-{expert}"
            placements.append(ExpertPlacement(layer, expert, function=name, memory_mb=1769))
            functions.append(FunctionSpec(name, [(layer, expert)], 1769, provisioned))
    return Plan("moeless", placements, functions)


def poisson(rate: float = 4.0, duration: float = 10.0, seed: int = 0, prompt: int = 24, output: int = 8):
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0, duration, rng.poisson(rate * duration)))
    return [Request(float(t), prompt, output, n) for n, t in enumerate(times)]


def test_a_batched_step_matches_a_hand_computation():
    # two requests of 2 prompt tokens and 2 outputs, both at t = 0: step 1 prefills both, step 2
    # decodes both; one invoke per needed expert per layer per step, whatever the sequences
    prefill = [
        np.array([[[0, 1], [2, 3]], [[0, 1], [2, 3]]]),  # request 0: tokens x layers x k
        np.array([[[0, 2], [4, 5]], [[0, 2], [4, 5]]]),
    ]
    decode = [np.array([[[0, 1], [2, 3]]]), np.array([[[0, 1], [6, 7]]])]
    routing = RecordedRouting(decode, prefill, 8, 2, [0, 1], [0, 1], "", "hand-made")
    model = CostModel()
    requests = [Request(0.0, 2, 2, 0), Request(0.0, 2, 2, 1)]
    sim = Simulator(one_function_each(), routing, SIZE, model, GPU, HARDWARE, oracle=True, max_batch=2)
    result = sim.run(requests, duration_s=1.0)

    def invoke(tokens: int) -> float:
        compute = model.expert_ms(tokens, 1024, 2816, 1, SIZE.weight_bytes)
        return model.invoke_ms(tokens, 1024) + compute

    # step 1: layer 0 sends 4, 2, 2 tokens to experts 0, 1, 2; layer 1 two tokens to each of 2..5
    step1 = [invoke(4), invoke(2)]
    # step 2: layer 0 sends 2 tokens to experts 0 and 1; layer 1 one token to each of 2, 3, 6, 7
    step2 = [invoke(2), invoke(1)]
    assert result.invokes == 3 + 4 + 2 + 4
    assert result.steps == 2
    assert result.layer_latency_ms == pytest.approx(step1 + step2)
    # each prefill is a forward of its own (generation.py): step 1 streams the dense part twice
    first = sum(step1) + 2 * 2 * 0.5
    assert result.ttft_ms == pytest.approx([first, first])
    assert result.tpot_ms == pytest.approx([sum(step2) + 1.0] * 2)
    assert result.tokens_served[(0, 0)] == 6 and result.tokens_served[(1, 2)] == 3


def test_a_step_pays_each_of_its_forwards_as_the_engine_runs_them():
    # three requests at t = 0, 1 output token each: one step of three prefill forwards, each alone
    # (its own pass over the weights and its own per-block overhead), then a step that decodes two
    # sequences in one batched forward
    gpu = replace(GPU, dense_bytes=0.0)
    hardware = Hardware("1x test", 0.0, Roofline(1000, 1000, 1.0, 1.0, block_overhead_ms=1.5))
    sim = Simulator(one_function_each(), sampled(), SIZE, CostModel(), gpu, hardware, oracle=True)
    one_step = sim.run([Request(0.0, 4, 1, n) for n in range(3)], 1.0)
    moe = sum(one_step.layer_latency_ms)
    assert one_step.steps == 1
    assert one_step.ttft_ms == pytest.approx([moe + 3 * 2 * 1.5] * 3)  # 3 forwards x 2 blocks
    sim = Simulator(one_function_each(), sampled(), SIZE, CostModel(), gpu, hardware, oracle=True)
    two_steps = sim.run([Request(0.0, 4, 2, n) for n in range(2)], 1.0)
    assert two_steps.steps == 2
    dense = two_steps.request_latency_ms[0] - sum(two_steps.layer_latency_ms)
    assert dense == pytest.approx((2 + 1) * 2 * 1.5)  # 2 prefill forwards, then 1 decode forward


def test_a_chunked_prefill_takes_a_step_per_chunk_in_join_order_and_replays_its_rows():
    # two requests at t = 0, prompts of 5 and 3 tokens, chunks of 4 prompt tokens per step:
    # step 1 computes tokens 0-3 of request 0; step 2 its token 4 and tokens 0-2 of request 1 (both
    # prefills complete: first tokens); step 3 decodes both
    prompt0 = np.arange(5 * 2 * 2).reshape(5, 2, 2) % 8
    prompt1 = np.array([[[5, 6], [6, 7]]] * 3)
    decode = [np.array([[[0, 1], [2, 3]]]), np.array([[[0, 1], [6, 7]]])]
    routing = RecordedRouting(decode, [prompt0, prompt1], 8, 2, [0, 1], [0, 1], "", "hand-made")
    requests = [Request(0.0, 5, 2, 0), Request(0.0, 3, 2, 1)]
    sim = Simulator(one_function_each(), routing, SIZE, CostModel(), GPU, HARDWARE, oracle=True,
                    max_batch=2, prefill_chunk=4)  # fmt: skip
    result = sim.run(requests, duration_s=1.0)
    assert result.steps == 3
    layers = np.reshape(result.layer_latency_ms, (3, 2))
    forwards = np.array([1, 2, 1])  # request 0's chunk; both chunks; the batched decode
    step_ms = layers.sum(axis=1) + forwards * 2 * 0.5  # each forward: two blocks of 0.5 ms
    assert result.ttft_ms == pytest.approx([step_ms[:2].sum()] * 2)
    assert result.tpot_ms == pytest.approx([step_ms[2]] * 2)
    served = np.zeros((2, 8), int)
    for rows in (prompt0, prompt1, decode[0], decode[1]):
        for layer in range(2):
            np.add.at(served[layer], rows[:, layer].ravel(), 1)
    assert {k: v for k, v in result.tokens_served.items()} == {
        (layer, e): int(served[layer, e]) for layer in range(2) for e in range(8) if served[layer, e]
    }


def test_chunked_prefill_bounds_the_stall_a_long_prompt_puts_on_decoding():
    # a short request decoding when a 4,000-token prompt arrives: whole, its prefill is one long
    # step every decoding sequence waits for; in chunks of 256 no step is that long, but the
    # chunks together cost more (each re-pays the invokes and the experts' weights)
    def run(chunk: int | None) -> tuple[float, float]:
        sim = Simulator(one_function_each(), sampled(), SIZE, CostModel(), GPU, HARDWARE,
                        oracle=True, prefill_chunk=chunk)  # fmt: skip
        result = sim.run([Request(0.0, 8, 40, 0), Request(0.05, 4000, 4, 1)], 1.0)
        assert result.completed == 2 and result.steps == 40
        steps = np.reshape(result.layer_latency_ms, (-1, 2)).sum(axis=1)
        return float(steps.max()), float(steps.sum())

    longest_whole, total_whole = run(None)
    longest_chunked, total_chunked = run(256)
    assert longest_chunked < 0.3 * longest_whole
    assert total_chunked > total_whole


def test_local_invokes_of_a_layer_leave_one_after_another():
    # one token to each of experts 0..3 of layer 0 and 4..7 of layer 1: four invokes per layer;
    # locally the k-th leaves k x invoke_serial_ms after the first; on AWS they overlap
    prefill = [np.array([[[0, 1], [4, 5]], [[2, 3], [6, 7]]])]
    routing = RecordedRouting(prefill, prefill, 8, 2, [0, 1], [0, 1], "", "hand-made")
    for aws, serial in ((False, 3.0), (True, 0.0)):
        model = CostModel(aws=aws, invoke_serial_ms_local=3.0, invoke_spread_local=0.0)
        sim = Simulator(one_function_each(), routing, SIZE, model, GPU, HARDWARE, oracle=True)
        result = sim.run([Request(0.0, 2, 1, 0)], 1.0)
        one = model.invoke_ms(1, 1024) + model.expert_ms(1, 1024, 2816, 1, SIZE.weight_bytes)
        assert result.invokes == 8
        assert result.layer_latency_ms == pytest.approx([3 * serial + one] * 2)


def test_local_cold_starts_at_once_share_the_machine():
    # four cold functions in one layer: locally each cold start still initialising delays the next
    # by cold_start_serial_ms (their processes share the cores); on AWS each has its own sandbox
    prefill = [np.array([[[0, 1], [0, 1]], [[2, 3], [2, 3]]])]
    routing = RecordedRouting(prefill, prefill, 8, 2, [0, 1], [0, 1], "", "hand-made")
    for aws, extra in ((False, 100.0), (True, 0.0)):
        model = CostModel(
            aws=aws, invoke_serial_ms_local=0.0, cold_start_serial_ms_local=100.0, invoke_spread_local=0.0
        )
        sim = Simulator(one_function_each(), routing, SIZE, model, GPU, HARDWARE)
        result = sim.run([Request(0.0, 2, 1, 0)], 1.0)
        cold = model.cold_start_ms(SIZE.weight_bytes)
        one = model.invoke_ms(1, 1024) + model.expert_ms(1, 1024, 2816, 1, SIZE.weight_bytes)
        assert result.cold_starts == 8
        # layer 0 cold-starts four at once; layer 1's four begin after those ended
        assert result.layer_latency_ms == pytest.approx([cold + 3 * extra + one] * 2)


def test_every_token_is_served_exactly_once_and_the_batch_is_bounded():
    replay = poisson()
    for max_batch in (1, 4, 16):
        sim = Simulator(one_function_each(), sampled(), SIZE, CostModel(), GPU, HARDWARE, max_batch=max_batch)
        result = sim.run(replay, 10.0)
        tokens = sum(result.tokens_served.values())
        assert tokens == len(replay) * (24 + 7) * 2 * 2  # prompt + 7 decode tokens, 2 layers, top-2
        assert result.completed == len(replay) == len(result.ttft_ms) == len(result.request_latency_ms)
        assert result.steps >= len(replay) * 8 / max_batch


def test_cost_scales_with_the_layers_simulated():
    replay = poisson(rate=2.0)
    summaries = {}
    for layers in (2, 4):
        sim = Simulator(
            one_function_each(layers), sampled(layers), SIZE, CostModel(), GPU, HARDWARE, oracle=True
        )
        summaries[layers] = sim.run(replay, 10.0)
    two, four = summaries[2], summaries[4]
    assert (two.layers_simulated, four.layers_simulated) == (2, 4)
    lambda_usd = {n: r.usd["requests"] + r.usd["duration"] for n, r in summaries.items()}
    assert lambda_usd[4] / lambda_usd[2] == pytest.approx(2.0, rel=0.1)
    assert four.invokes / two.invokes == pytest.approx(2.0, rel=0.1)


def test_the_oracle_is_never_slower_and_a_cold_function_costs_its_init():
    replay = poisson()
    plan = one_function_each()
    real = Simulator(plan, sampled(), SIZE, CostModel(), GPU, HARDWARE).run(replay, 10.0)
    bound = Simulator(plan, sampled(), SIZE, CostModel(), GPU, HARDWARE, oracle=True).run(replay, 10.0)
    assert real.cold_starts > 0 and bound.cold_starts == 0
    assert np.percentile(bound.request_latency_ms, 99) <= np.percentile(real.request_latency_ms, 99)
    assert real.usd["duration"] > bound.usd["duration"]
    warm = Simulator(one_function_each(provisioned=1), sampled(), SIZE, CostModel(), GPU, HARDWARE)
    provisioned = warm.run(replay[:1], 10.0)
    assert provisioned.cold_starts == 0
    assert provisioned.usd["provisioned"] == pytest.approx(
        16 * CostModel().provisioned_usd_per_s(1769, 1) * 10.0, rel=0.05
    )


def test_a_serverful_fleet_runs_the_experts_on_its_gpus():
    replay = poisson()
    result = Simulator(
        Plan("static", [], []), sampled(), SIZE, CostModel(), GPU, HARDWARE, serverful=True
    ).run(replay, 10.0)
    assert result.invokes == 0 and result.cold_starts == 0
    span = max(10.0, max(r.arrival_s for r in replay) + max(result.request_latency_ms) / 1e3)
    assert result.usd["gpu"] == pytest.approx(3.6 / 3600 * span, rel=0.01)
    assert result.fleet == "1x test" and result.backbone == ""


def test_prewarming_from_a_predictor_takes_cold_starts_off_the_path():
    spaced = [Request(float(t), 4, 2, n) for n, t in enumerate(range(0, 900, 60))]  # past idle time-out
    plan = one_function_each()

    def run(prewarm: PrewarmModel | None):
        sim = Simulator(plan, sampled(), SIZE, CostModel(), GPU, HARDWARE, prewarm=prewarm, idle_timeout_s=30)
        return sim.run(spaced, 900.0)

    without, ahead, layer, never = (
        run(None),
        run(PrewarmModel(1.0, "request")),
        run(PrewarmModel(1.0, "layer")),
        run(PrewarmModel(0.0, "request")),
    )
    assert without.cold_starts > 0 and ahead.prewarms > 0
    assert ahead.cold_starts < without.cold_starts
    assert layer.cold_starts < without.cold_starts
    assert never.cold_starts == without.cold_starts and never.prewarms == 0


def test_replanning_switches_plans_and_integrates_provisioned_cost():
    seen: list[Loads] = []

    def replan(window: Loads) -> Plan:
        seen.append(window)
        return one_function_each(provisioned=1)

    model = CostModel()
    sim = Simulator(one_function_each(), sampled(), SIZE, model, GPU, HARDWARE, replan=replan, replan_s=5.0)
    result = sim.run(poisson(duration=10.0), 10.0)
    assert result.replans >= 1 and seen and sorted(seen[0].layers) == [0, 1]
    assert 0 < result.usd["provisioned"] < 16 * model.provisioned_usd_per_s(1769, 1) * 10.0


def test_the_simulation_is_deterministic_for_a_seed():
    def once(seed: int) -> dict:
        sim = Simulator(one_function_each(), sampled(), SIZE, CostModel(), GPU, HARDWARE, seed=seed)
        summary = sim.run(poisson(seed=3), 10.0).summary()
        return {k: v for k, v in summary.items() if isinstance(v, int | float)}

    assert once(1) == once(1)
    assert once(1) != once(2)


def test_layer_map_copies_the_nearest_recorded_layer():
    from moeless.simulation.routing import layer_map

    assert layer_map([0, 1, 2], 3, [0, 1, 2], 3) == [0, 1, 2]
    chosen = layer_map([0, 7, 15], 32, list(range(32)), 32)
    assert chosen[0] == 0 and chosen[7] == 1 and chosen[15] == 2 and chosen[31] == 2
    assert chosen[3] == 0 and chosen[4] == 1  # by relative depth, (l + 0.5) / 32
    routing = sampled(2)
    whole = SampledRouting.from_loads(
        Loads({0: np.ones(8), 7: np.arange(8.0)}, {"top_k": 2, "num_model_layers": 8}), 2, list(range(8)), 8
    )
    assert "1-3 <- recorded 0" in whole.describe() and "4-6 <- recorded 7" in whole.describe()
    assert routing.describe().endswith("all 2 MoE layers recorded")


def test_sampled_counts_pick_distinct_experts_and_keep_the_shares():
    from moeless.simulation.routing import sample_counts

    rng = np.random.default_rng(0)
    p = np.array([[0.5, 0.3, 0.2, 0.0]])
    small = sample_counts(p, 10, 2, rng)
    assert small.sum() == 20 and small[0, 3] == 0 and small.max() <= 10  # distinct: at most one per token
    large = sample_counts(p, 10_000, 2, rng)
    assert large.sum() == 20_000
    assert large[0] / large.sum() == pytest.approx(p[0], abs=0.01)


def test_trace_replay_keeps_the_recorded_routing(tiny, tmp_path):
    from moeless.prediction.trace import load_trace, profile

    profile(tiny.model("mixtral"), ["hello world", "MoE"], tmp_path / "t", max_new_tokens=3, progress=False)
    trace = load_trace(tmp_path / "t")
    routing = RecordedRouting.from_trace(trace)
    first = trace.request == np.unique(trace.request)[0]
    prefill_rows = int((first & (trace.phase == 0)).sum())
    counts = routing.prefill(0, prefill_rows, np.random.default_rng(0))
    expected = np.bincount(trace.experts[0][first & (trace.phase == 0)].ravel(), minlength=trace.num_experts)
    assert counts[0].tolist() == expected.tolist()
    assert routing.loads().layers[trace.layers[0]].sum() == trace.experts[0].size


SHARED_ROUTING = (
    Path(__file__).resolve().parents[2].parent / "shared" / "data" / "routing" / "gptoss20b_decode.npz"
)


@pytest.mark.skipif(
    not SHARED_ROUTING.exists(), reason="needs ../shared/data/routing (the project's shared data)"
)
def test_a_per_token_routing_file_replays_every_layer_as_recorded():
    from moeless.prediction.routing_file import load_routing

    trace = load_routing(SHARED_ROUTING)
    routing = RecordedRouting.from_trace(trace, list(range(24)), 24)
    assert routing.layers == list(range(24)) and routing.describe().endswith("all 24 MoE layers recorded")
    counts = routing.decode([0, 1], [0, 0], np.random.default_rng(0))
    assert counts.shape == (24, 32) and (counts.sum(axis=1) == 8).all()
    rows = np.flatnonzero(trace.request == 0)[:1]
    assert set(np.flatnonzero(counts[5])) >= set(trace.experts[5][rows].ravel().tolist())


def test_simulate_command_writes_the_report_with_the_contract_columns(tmp_path):
    import json

    from click.testing import CliRunner

    from cli.main import cli
    from moeless.simulation.report import COLUMNS, COMPONENT_COLUMNS

    loads = tmp_path / "loads.json"
    layers = [{"layer": layer, "counts": counts} for layer, counts in SHARES.items()]
    loads.write_text(json.dumps({"model": "mistralai/Mixtral-8x7B-v0.1", "top_k": 2, "num_model_layers": 32,
                                 "layers": layers}))  # fmt: skip
    arrivals = tmp_path / "arrivals.csv"
    arrivals.write_text("timestamp_s,input_tokens,output_tokens\n0,40,3\n0.5,10,4\n2.0,25,2\n4.0,5,1\n")
    out = tmp_path / "sim"
    result = CliRunner().invoke(
        cli,
        ["simulate", "--loads", str(loads), "--arrivals", str(arrivals), "--rate", "2", "--duration", "30",
         "--policies", "static,hybrid,moeless,oracle", "--no-plots", "-o", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["policy"] for r in rows] == ["static", "hybrid", "moeless", "oracle"]
    hybrid = rows[1]  # one node, every expert in its RAM: no invoke, its GPU billed
    assert hybrid["invokes"] == "0" and float(hybrid["usd_per_1k_gpu"]) > 0 and hybrid["backbone"]
    assert set(COLUMNS) <= set(rows[0])
    assert all(r["layers_simulated"] == "32" and r["requests"] == "4" for r in rows)
    assert rows[0]["fleet"] and not rows[0]["backbone"] and rows[1]["backbone"]
    report = (out / "report.md").read_text()
    assert "unrecorded layers copy the nearest recorded one" in report and "timestamps scaled" in report
    # Mixtral-8x7B's dated Bedrock price as the reference line, unless one is given or refused
    assert "reference: a hosted API at $0.45 / $0.7 per million" in report and "Bedrock" in report
    for row in rows:  # the total is the sum of its parts, whatever their names
        parts = [float(row[c]) for c in COMPONENT_COLUMNS.values()]
        assert float(row["usd_per_1k_requests"]) == pytest.approx(sum(parts)) and math.isfinite(sum(parts))
    static_gpu = float(rows[0]["usd_per_1k_gpu"])
    assert static_gpu > 0 and float(rows[0]["usd_per_1k_requests"]) == pytest.approx(static_gpu)


def test_simulate_takes_a_users_api_price_and_refuses_a_bad_one(tmp_path):
    import json

    from click.testing import CliRunner

    from cli.main import cli

    loads = tmp_path / "loads.json"
    layers = [{"layer": layer, "counts": counts} for layer, counts in SHARES.items()]
    loads.write_text(json.dumps({"model": "mistralai/Mixtral-8x7B-v0.1", "top_k": 2, "num_model_layers": 32,
                                 "layers": layers}))  # fmt: skip
    args = ["simulate", "--loads", str(loads), "--arrival", "poisson:1", "--duration", "5",
            "--policies", "static", "--no-plots", "-o", str(tmp_path / "sim")]  # fmt: skip
    given = CliRunner().invoke(cli, [*args, "--api-price", "1,2"])
    assert given.exit_code == 0, given.output
    # 1 $/M in and 2 $/M out, over the requests' own token counts
    assert "a hosted API at $1 / $2 per million input / output tokens" in given.output
    bad = CliRunner().invoke(cli, [*args, "--api-price", "cheap"])
    assert bad.exit_code == 2 and "is not an API price" in bad.output
    none = CliRunner().invoke(cli, [*args, "--api-price", "none"])
    assert none.exit_code == 0 and "a hosted API" not in none.output


def test_simulate_refuses_an_unknown_model_and_a_mismatched_one(tmp_path):
    import json

    from click.testing import CliRunner

    from cli.main import cli

    loads = tmp_path / "loads.json"
    layers = [{"layer": layer, "counts": counts} for layer, counts in SHARES.items()]
    loads.write_text(json.dumps({"model": "someone/unknown-moe", "top_k": 2, "layers": layers}))
    unknown = CliRunner().invoke(cli, ["simulate", "--loads", str(loads), "-o", str(tmp_path / "o")])
    assert unknown.exit_code != 0 and "--model" in unknown.output
    mismatch = CliRunner().invoke(
        cli, ["simulate", "--loads", str(loads), "--model", "deepseek-v3", "-o", str(tmp_path / "o")]
    )
    assert mismatch.exit_code != 0 and "experts per layer" in mismatch.output


def test_resampled_shares_keep_the_skew_on_another_expert_count():
    from moeless.simulation.routing import resampled_shares

    counts = np.array([60.0, 20, 10, 5, 3, 1, 1, 0])
    more = resampled_shares(counts, 32, np.random.default_rng(0))
    assert len(more) == 32 and more.sum() == pytest.approx(1.0) and (more >= 0).all()
    top_quarter = np.sort(more)[::-1][:8].sum()
    assert top_quarter == pytest.approx(0.8)  # the top 2 of 8 held 80%: so do the top 8 of 32
    assert resampled_shares(counts, 8, np.random.default_rng(1)).tolist() != counts.tolist()


def test_an_overloaded_policy_stops_at_the_horizon_and_says_so():
    flood = [Request(0.0, 4, 500, n) for n in range(40)]  # 40 x 500 tokens, 2 at a time
    sim = Simulator(
        one_function_each(), sampled(), SIZE, CostModel(), GPU, HARDWARE, oracle=True, max_batch=2
    )
    result = sim.run(flood, duration_s=1.0, horizon_s=30.0)
    assert 0 < result.completed < len(flood)
    assert result.usd["gpu"] == pytest.approx(3.6 / 3600 * 30.0)
    summary = result.summary()
    assert summary["usd_per_1k_requests"] == pytest.approx(1000 * sum(result.usd.values()) / result.completed)


def test_a_run_gives_up_once_it_certainly_misses_its_p99_and_never_before():
    """With every function cold, a tight TPOT bound is missed by the first requests: the run stops
    there (fewer steps, ``gave_up``). A bound the full run meets never stops it: the same figures."""
    from moeless.simulation.simulator import GiveUp

    requests = [Request(2.0 * n, 8, 6, n) for n in range(30)]

    def run(give_up: GiveUp | None) -> dict:
        simulator = Simulator(
            one_function_each(), sampled(), SIZE, CostModel(), GPU, HARDWARE, timeline=False
        )
        return simulator.run(requests, 60.0, give_up=give_up).summary()

    full = run(None)
    assert not full["gave_up"] and full["completed"] == 30
    met = run(GiveUp(full["tpot_ms_p99"] * 1.01, full["ttft_ms_p99"] * 1.01))
    assert met == full
    tight = run(GiveUp(full["tpot_ms_p50"] / 2))
    assert tight["gave_up"] and tight["completed"] < 30 and tight["steps"] < full["steps"]
    waiting = run(GiveUp(1e9, ttft_ms=full["ttft_ms_p50"] / 2))
    assert waiting["gave_up"] and waiting["steps"] < full["steps"]


@pytest.mark.parametrize("values", [1, 2, 15, 99, 100, 101, 250, 1000])
def test_give_up_counts_what_puts_numpys_p99_over_a_bound(values):
    from moeless.simulation.simulator import GiveUp

    over = GiveUp.over_p99(values)
    assert 1 <= over <= values + 1
    if over <= values:  # that many values over the bound, the rest at 0: the p99 is over it
        assert np.percentile([0.0] * (values - over) + [2.0] * over, 99) > 1.0


def test_a_run_whose_prompts_cannot_be_prefilled_by_its_horizon_gives_up_and_one_that_can_does_not():
    """Chunks of 8 tokens, each step at least the invoke of one row at every layer: 40 prompts of
    4,000 tokens cannot all be prefilled by the horizon (the full run completes few), so the run
    stops at once; 4 of them can, and run to the same end as without giving up."""
    from moeless.simulation.simulator import GiveUp

    def run(requests: list[Request], give_up: GiveUp | None) -> dict:
        simulator = Simulator(
            one_function_each(), sampled(), SIZE, CostModel(), GPU, HARDWARE, prefill_chunk=8, timeline=False
        )
        assert simulator._step_floor_s() > 0
        return simulator.run(requests, 30.0, horizon_s=120.0, give_up=give_up).summary()

    loose = GiveUp(1e9)
    heavy = [Request(0.5 * n, 4000, 2, n) for n in range(40)]
    full = run(heavy, None)
    assert full["completed"] < 40
    stopped = run(heavy, loose)
    assert stopped["gave_up"] and stopped["steps"] < full["steps"] / 10
    light = heavy[:4]
    assert run(light, loose) == run(light, None) and run(light, None)["completed"] == 4


def test_a_run_that_keeps_no_demand_serves_the_same():
    """The optimiser's judged points skip the demand by level (only probes read it): same figures."""
    requests = poisson(rate=6.0, duration=20.0)

    def run(record_demand: bool) -> PolicyResult:
        simulator = Simulator(
            one_function_each(), sampled(), SIZE, CostModel(), GPU, HARDWARE, timeline=False,
            record_demand=record_demand,
        )  # fmt: skip
        return simulator.run(requests, 20.0)

    kept, skipped = run(True), run(False)
    assert kept.summary() == skipped.summary() and kept.demand and not skipped.demand


def tiered(layers: int = 2) -> Plan:
    """Expert 0 of each layer on the GPU, experts 1-3 on the host, the others on functions."""
    plan = one_function_each(layers)
    tier = {0: "gpu", 1: "host", 2: "host", 3: "host"}
    for placement in plan.experts:
        if placement.expert in tier:
            placement.placement, placement.function = tier[placement.expert], None
    plan.functions = [f for f in plan.functions if f.experts[0][1] not in tier]
    return plan


def test_a_steps_host_experts_share_the_hosts_bandwidth_and_its_cores():
    # the hand-made step of test_a_batched_step_matches_a_hand_computation on a tiered plan:
    # layer 0 sends 4, 2, 2 tokens to experts 0 (gpu), 1 (host), 2 (host)
    prefill = [np.array([[[0, 1], [2, 3]], [[0, 1], [2, 3]]]), np.array([[[0, 2], [4, 5]], [[0, 2], [4, 5]]])]
    routing = RecordedRouting([np.zeros((0, 2, 2), int)] * 2, prefill, 8, 2, [0, 1], [0, 1], "", "hand-made")
    # a host of 4 vCPUs at 10 GFLOP/s each and 10 GB/s: the two host experts (each read once) are
    # 2 x 34.6 MB -> 6.92 ms over the bandwidth, their 4 rows 4 x 6 x H x I FLOPs -> 1.73 ms
    host = HostModel(vcpus=4, memory_gbps=10.0, gflops_per_vcpu=10.0, call_overhead_ms=0.5)
    sim = Simulator(tiered(), routing, SIZE, CostModel(), GPU, HARDWARE, oracle=True, max_batch=2, host=host)
    result = sim.run([Request(0.0, 2, 1, 0), Request(0.0, 2, 1, 1)], duration_s=1.0)
    host_ms = 2 * 0.5 + 1e3 * 2 * SIZE.weight_bytes / 10e9
    gpu_ms = HARDWARE.roofline.ms(GPU.expert_bytes, 2 * GPU.expert_params * 4)
    assert host_ms == pytest.approx(1 + 6.92, rel=1e-3) and gpu_ms < host_ms
    # layer 0: no function serves it (the host is the slowest); layer 1: experts 2, 3 on the host
    # (4 rows, read once each: the same bytes) beside 4 and 5 as invokes of 2 tokens each
    invoke = CostModel().invoke_ms(2, 1024) + CostModel().expert_ms(2, 1024, 2816, 1, SIZE.weight_bytes)
    assert result.layer_latency_ms == pytest.approx([host_ms, max(host_ms, invoke)])
    assert result.invokes == 2
    # compute-bound: at 0.1 GFLOP/s per vCPU the same rows take 4 x 6 x H x I / 0.4 GFLOP/s
    slow = Simulator(tiered(), routing, SIZE, CostModel(), GPU, HARDWARE, oracle=True, max_batch=2,
                     host=replace(host, gflops_per_vcpu=0.1))  # fmt: skip
    flops_ms = 1e3 * 4 * 6 * 1024 * 2816 / 0.4e9
    assert slow.run([Request(0.0, 2, 1, 0), Request(0.0, 2, 1, 1)], 1.0).layer_latency_ms[0] == pytest.approx(
        1.0 + flops_ms
    )


def test_a_resident_expert_offloads_a_prefills_rows_and_keeps_decode_rows():
    plan = tiered()
    for placement in plan.experts:
        if placement.placement == "host":
            placement.offload_rows = 16
    plan.functions += [
        FunctionSpec(f"f-{layer}-{e}", [(layer, e)], 1769) for layer in (0, 1) for e in (1, 2, 3)
    ]
    host = HostModel(vcpus=4, memory_gbps=1.0, gflops_per_vcpu=1.0)  # a slow host
    long_prompts = Simulator(plan, sampled(), SIZE, CostModel(), GPU, HARDWARE, oracle=True, host=host).run(
        [Request(0.0, 200, 1, 0)], 1.0
    )
    kept = Simulator(tiered(), sampled(), SIZE, CostModel(), GPU, HARDWARE, oracle=True, host=host).run(
        [Request(0.0, 200, 1, 0)], 1.0
    )
    assert long_prompts.invokes > kept.invokes  # the prefill's rows went to functions
    assert sum(long_prompts.layer_latency_ms) < sum(kept.layer_latency_ms)
    decode = Simulator(plan, sampled(), SIZE, CostModel(), GPU, HARDWARE, oracle=True, host=host).run(
        [Request(0.0, 1, 8, 0)], 1.0
    )
    decode_kept = Simulator(
        tiered(), sampled(), SIZE, CostModel(), GPU, HARDWARE, oracle=True, host=host
    ).run([Request(0.0, 1, 8, 0)], 1.0)
    assert decode.invokes == decode_kept.invokes  # one row a step: never offloaded


def test_invokes_beyond_the_accounts_concurrency_are_throttled_retried_then_served_by_the_host():
    # 8 requests at once on 8 one-expert functions per layer, nothing warm: a step needs up to 8
    # environments at once; an account of 3 (1 of them provisioned) throttles the rest
    replay = [Request(0.0, 32, 4, n) for n in range(8)]
    free = Simulator(one_function_each(), sampled(), SIZE, CostModel(), GPU, HARDWARE).run(replay, 5.0)
    assert free.throttles == 0 and free.fallbacks == 0
    plan = one_function_each()
    plan.functions[0].provisioned_concurrency = 1
    limited = Simulator(plan, sampled(), SIZE, CostModel(), GPU, HARDWARE, account_concurrency=3).run(
        replay, 5.0
    )
    assert limited.throttles > 0 and limited.fallbacks > 0
    assert limited.completed == 8
    # refused invokes are not billed: the requests charged are the invokes served
    assert limited.usd["requests"] == pytest.approx(limited.invokes * CostModel().prices.per_request)
    # what each refused piece waited for: the dispatcher's backoff (20 + 40 ms) at least
    assert max(limited.layer_latency_ms) >= 60.0
