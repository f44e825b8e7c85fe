"""Predictors on per-token routing files: the reader's checks, hand-made routing with a known
answer for the prompt-level and cross-layer predictors, online learning, the CLI."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from click.testing import CliRunner

from cli.cmd_predict_routing import ROUTING_METHODS as CLI_METHODS
from cli.main import cli
from moeless.prediction.crosslayer import CrossLayerModel, TransitionTable
from moeless.prediction.predictors import FrequencyPrior
from moeless.prediction.prompt_predictors import KernelNeighbours, weighted_median_shares
from moeless.prediction.routing_eval import ROUTING_METHODS, evaluate_routing, split_by_request
from moeless.prediction.routing_file import load_routing, load_routing_or_trace
from moeless.prediction.trace import TraceError
from tests.conftest import SHARED_DATA
from tests.fakes import BagOfWords

E, K = 8, 2


def two_topics(requests: int = 40, tokens: int = 30, layers: int = 3, seed: int = 0):
    """Arrays of a routing file where "alpha" prompts use experts 0-3 and "beta" prompts 4-7 at
    every layer, and layer 2 repeats layer 0's experts (layer 1 is noise within the topic)."""
    rng = np.random.default_rng(seed)
    request = np.repeat(np.arange(requests), tokens).astype(np.int32)
    position = np.tile(np.arange(tokens), requests).astype(np.int32)
    experts = np.zeros((len(request), layers, K), np.uint8)
    for row, r in enumerate(request):
        base = 0 if r % 2 == 0 else 4
        for layer in range(2):
            experts[row, layer] = base + rng.choice(4, K, replace=False)
        experts[row, 2:] = experts[row, 0]
    weights = np.full(experts.shape, 0.5, np.float16)
    prompts = [
        {"request": r, "prompt": ("alpha apple" if r % 2 == 0 else "beta banana") + f" number{r}"}
        for r in range(requests)
    ]
    return {"request": request, "position": position, "experts": experts, "weights": weights}, prompts


def write_routing(directory, arrays, prompts, stem="routing"):
    np.savez(directory / f"{stem}.npz", **arrays)
    (directory / f"{stem}.requests.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return directory / f"{stem}.npz"


@pytest.fixture
def routing(tmp_path):
    return write_routing(tmp_path, *two_topics())


def test_reader_turns_a_routing_file_into_a_decode_trace(routing):
    trace = load_routing(routing)
    assert trace.experts.shape == (3, 40 * 30, K) and trace.layers == [0, 1, 2]
    assert trace.num_experts == E and trace.meta["top_k"] == K and (trace.phase == 1).all()
    assert len(trace.prompts) == 40 and not len(trace.hidden_rows)


def _malformed(arrays, prompts):
    cases = {}
    cases["missing weights"] = ({k: v for k, v in arrays.items() if k != "weights"}, prompts, "lacks weights")
    cases["2-d experts"] = (arrays | {"experts": arrays["experts"][:, 0]}, prompts, "tokens, layers, k")
    cases["weights shape"] = (arrays | {"weights": arrays["weights"][:, :2]}, prompts, "do not match")
    cases["float experts"] = (arrays | {"experts": arrays["experts"].astype(float)}, prompts, "integers")
    cases["short request"] = (arrays | {"request": arrays["request"][:-1]}, prompts, "request and position")
    negative = arrays["experts"].astype(np.int16)
    negative[0, 0, 0] = -1
    cases["negative expert"] = (arrays | {"experts": negative}, prompts, r"expert ids must lie in \[0, 8\)")
    cases["prompt missing"] = (arrays, prompts[:-1], "no prompt for requests")
    cases["empty prompt"] = (arrays, [*prompts[:-1], {"request": 39, "prompt": ""}], 'no "prompt" string')
    return cases


@pytest.mark.parametrize("case", list(_malformed(*two_topics())))
def test_reader_refuses_a_malformed_file(tmp_path, case):
    arrays, prompts, message = _malformed(*two_topics())[case]
    with pytest.raises(TraceError, match=message):
        load_routing(write_routing(tmp_path, arrays, prompts))


def test_reader_refuses_a_missing_or_unreadable_file(tmp_path):
    with pytest.raises(TraceError, match="not a readable"):
        load_routing(tmp_path / "absent.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(TraceError, match="not a readable"):
        load_routing(tmp_path / "junk.npz")
    arrays, _ = two_topics()
    np.savez(tmp_path / "alone.npz", **arrays)
    with pytest.raises(TraceError, match="cannot read"):
        load_routing(tmp_path / "alone.npz")


def test_prompt_predictors_on_two_topics(routing):
    # given prompts whose topic decides which half of the experts they use
    trace = load_routing(routing)
    freq = evaluate_routing(trace, "freq", embedder=BagOfWords())
    sps = evaluate_routing(trace, "sps", embedder=BagOfWords())
    kernel = evaluate_routing(trace, "kernel", embedder=BagOfWords())
    # then the prior, which mixes both halves, is right on about half of each request's load
    assert 0.4 < freq["mean"]["load_accuracy"] < 0.6
    # and both prompt methods find the topic: every predicted expert lies in the right half
    assert kernel["mean"]["load_accuracy"] > 0.9 and sps["mean"]["load_accuracy"] > 0.9
    assert kernel["mean"]["load_accuracy"] >= sps["mean"]["load_accuracy"] - 0.01
    assert set(kernel["settings"]) >= {"bandwidth", "neighbours", "median", "shrink"}
    assert len(kernel["layers"]) == 3  # load-level methods are scored on every layer


def test_kernel_learns_online_and_falls_back_to_the_prior():
    prior = FrequencyPrior({0: np.ones(E), 1: np.ones(E)})
    kernel = KernelNeighbours(BagOfWords(), prior, bandwidth=0.05, neighbours=1)
    np.testing.assert_allclose(kernel.predict("anything")[0], np.full(E, 1 / E))  # nothing indexed yet
    kernel.fit(["alpha apple", "beta banana"], np.stack([np.eye(E)[[0, 0]], np.eye(E)[[5, 5]]]), tune=False)
    before = kernel.predict("gamma grape")[1]
    kernel.learn("gamma grape", {0: np.eye(E)[3], 1: np.eye(E)[3]})
    after = kernel.predict("gamma grape")[1]
    assert not np.allclose(before, after)
    np.testing.assert_allclose(after, np.eye(E)[3], atol=1e-6)
    np.testing.assert_allclose(kernel.predict("alpha apple")[0], np.eye(E)[0], atol=1e-6)


def test_kernel_shrinks_towards_the_prior_when_neighbours_mislead():
    # given past prompts whose routing is unrelated to their text, leave-one-out prefers the prior
    rng = np.random.default_rng(0)
    shares = rng.dirichlet(np.full(E, 0.3), size=(30, 1))
    prior = FrequencyPrior({0: shares[:, 0].sum(axis=0)})
    kernel = KernelNeighbours(BagOfWords(), prior).fit([f"word{i} common" for i in range(30)], shares)
    assert kernel.shrink > 0


def test_weighted_median_ignores_an_outlying_neighbour():
    # given three neighbours: two agree on expert 0 carrying 0.6, one (lightly weighted) puts all on 3
    shares = np.array([[0.6, 0.2, 0.2, 0.0], [0.6, 0.2, 0.1, 0.1], [0.0, 0.0, 0.0, 1.0]])[None, :, None]
    weights = np.array([[0.4, 0.3, 0.3]])
    median = weighted_median_shares(weights, shares)[0, 0]
    # the per-expert medians are 0.6, 0.2, 0.1, 0.1 (already summing to 1); the mean would give 0.3 to 3
    np.testing.assert_allclose(median, [0.6, 0.2, 0.1, 0.1])
    # and a lone neighbour is its own median
    np.testing.assert_allclose(weighted_median_shares(np.ones((1, 1)), shares[:, :1])[0, 0], shares[0, 0, 0])


def test_kernel_chooses_the_median_when_neighbours_carry_outliers():
    # given two topics whose requests share their topic's routing, except outliers
    # on a random expert (one in five): leave-one-out should weight the median, which the outliers cannot move
    rng = np.random.default_rng(1)
    prompts, rows = [], []
    for i in range(48):
        topic = i % 2
        row = np.eye(E)[[topic * 4, topic * 4 + 1]].mean(axis=0)
        if i % 5 == 4:
            row = np.eye(E)[rng.integers(E)]
        prompts.append(f"{('alpha', 'beta')[topic]} question {i}")
        rows.append(row[None])
    shares = np.stack(rows)
    prior = FrequencyPrior({0: shares[:, 0].sum(axis=0)})
    kernel = KernelNeighbours(BagOfWords(), prior).fit(prompts, shares)
    assert kernel.median > 0


def test_crosslayer_uses_earlier_layers_the_table_cannot_see():
    # given layer 2 repeating layer 0 while layer 1 is noise, predicting layer 2 from layer 1
    arrays, _ = two_topics(requests=60)
    experts, weights = arrays["experts"].astype(np.int64), arrays["weights"].astype(np.float32)
    groups = arrays["request"]
    train, test = groups < 40, groups >= 40
    table = TransitionTable(E, K).fit(experts[train], (1,))
    model = CrossLayerModel(E, K, hidden_sizes=(0, 32), epochs=100).fit(
        experts[train], weights[train], (1,), groups=groups[train]
    )
    actual = experts[test, 2]

    def hits(predicted):
        return (predicted[:, :, None] == actual[:, None, :]).any(axis=2).mean()

    table_hits = hits(table.predict(1, 1, experts[test], weights[test]))
    model_hits = hits(model.predict(1, 1, experts[test], weights[test]))
    # then the table only knows the topic (half of the 4 candidates are right: ~0.5), the model
    # reads layer 0 and gets both experts
    assert table_hits < 0.7 and model_hits > 0.95
    assert set(model.validation[1]) == {0, 32} and model.hidden[1] in (0, 32)


def test_crosslayer_saves_and_loads(tmp_path):
    arrays, _ = two_topics(requests=10)
    experts, weights = arrays["experts"].astype(np.int64), arrays["weights"].astype(np.float32)
    model = CrossLayerModel(E, K, hidden_sizes=(16,), epochs=2).fit(experts, weights, (1, 2))
    loaded = CrossLayerModel.load(model.save(tmp_path).parent)
    for pair in [(0, 1), (1, 1), (0, 2)]:
        np.testing.assert_allclose(
            loaded.scores(*pair, experts, weights), model.scores(*pair, experts, weights)
        )


def test_split_and_train_file_and_oracle(tmp_path, routing):
    trace = load_routing(routing)
    train, test = split_by_request(trace, test_fraction=0.5)
    assert len(train) == len(test) == 20 and set(train).isdisjoint(test)
    other = write_routing(tmp_path, *two_topics(seed=1), stem="other")
    crossed = evaluate_routing(trace, "table", 1, train_trace=load_routing(other))
    assert crossed["train_requests"] == crossed["test_requests"] == 40 and crossed["split"] != "by request"
    oracle = evaluate_routing(trace, "oracle", 2)
    assert oracle["mean"]["hit_rate"] == oracle["mean"]["load_accuracy"] == 1.0
    with pytest.raises(TraceError, match="distance 3"):
        evaluate_routing(trace, "table", 3)
    with pytest.raises(TraceError, match="strictly between"):
        split_by_request(trace, test_fraction=1.0)


def test_a_profile_trace_folder_is_read_too(tmp_path, routing):
    # given a trace folder as `moeless profile` writes it, built from the same routing
    source = load_routing(routing)
    folder = tmp_path / "trace"
    folder.mkdir()
    np.savez(
        folder / "routing.npz",
        request=source.request,
        position=source.position,
        phase=source.phase,
        experts=source.experts,
        weights=source.weights,
        hidden_rows=np.zeros(0, np.int32),
        hidden=np.zeros((3, 0, 4), np.float16),
    )
    (folder / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in source.prompts))
    meta = {"schema_version": 1, "model": "m", "num_experts": E, "top_k": K, "moe_layers": [0, 1, 2]}
    (folder / "meta.json").write_text(json.dumps(meta))
    trace = load_routing_or_trace(folder)
    from_folder, from_file = evaluate_routing(trace, "table"), evaluate_routing(source, "table")
    for key in ("hit_rate", "set_recall", "load_accuracy"):
        assert from_folder["mean"][key] == from_file["mean"][key]


def test_eval_routing_command(routing):
    assert CLI_METHODS == ROUTING_METHODS
    runner = CliRunner()
    result = runner.invoke(cli, ["predict", "eval-routing", str(routing), "--method", "table", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data["mean"]) == {
        "hit_rate",
        "set_recall",
        "load_accuracy",
        "latency_ms_p50",
        "latency_ms_p99",
    }
    table = runner.invoke(
        cli, ["predict", "eval-routing", str(routing), "--method", "freq", "--distance", "2"]
    )
    assert table.exit_code == 0 and "mean" in table.output
    bad = runner.invoke(
        cli, ["predict", "eval-routing", str(routing), "--method", "table", "--distance", "5"]
    )
    assert bad.exit_code == 1 and "distance 5" in bad.output and len(bad.output.strip().splitlines()) == 1
    assert runner.invoke(cli, ["predict", "eval-routing", "--help"]).exit_code == 0


GPTOSS = SHARED_DATA / "routing" / "gptoss20b_decode.npz"


@pytest.mark.skipif(not GPTOSS.is_file(), reason="needs ../shared/data/routing/gptoss20b_decode.npz")
def test_gpt_oss_routing_reads_and_the_table_beats_the_prior():
    trace = load_routing(GPTOSS)
    assert trace.experts.shape[0] == 24 and trace.num_experts == 32 and len(trace.prompts) == 451
    table = evaluate_routing(trace, "table", 1)
    freq = evaluate_routing(trace, "freq", 1)
    assert table["mean"]["hit_rate"] > freq["mean"]["hit_rate"] + 0.2


def test_simulator_prewarming_takes_a_measured_accuracy(tmp_path):
    from moeless.simulation.policies import PREDICTORS
    from moeless.simulation.simulator import PrewarmModel

    # given the JSON of a load-level and of a token-level evaluation
    kernel = {"method": "kernel", "mean": {"hit_rate": 0.3, "set_recall": 0.71, "load_accuracy": 0.8}}
    cross = {"method": "crosslayer", "mean": {"hit_rate": 0.77, "set_recall": 0.6, "load_accuracy": 0.7}}
    assert PrewarmModel.from_eval(kernel) == PrewarmModel(0.71, "request")
    assert PrewarmModel.from_eval(cross) == PrewarmModel(0.77, "layer")
    with pytest.raises(ValueError, match="unknown predictor method"):
        PrewarmModel.from_eval({"method": "magic", "mean": {}})
    # when the simulate command is given one, the report says which accuracy it used
    loads = {
        "layers": [{"layer": 0, "counts": [5, 3, 1, 1, 1, 1, 2, 0]}, {"layer": 1, "counts": [1, 1, 4, 4] * 2}]
    }
    (tmp_path / "loads.json").write_text(json.dumps(loads | {"top_k": 2}))
    (tmp_path / "eval.json").write_text(json.dumps(kernel))
    common = [
        "simulate",
        "--loads",
        str(tmp_path / "loads.json"),
        "--duration",
        "3",
        "--model",
        "mixtral-8x7b",
    ]
    common += ["--prompt-tokens", "4", "--output-tokens", "2", "--policies", "remoe", "--no-plots"]
    runner = CliRunner()
    result = runner.invoke(
        cli, [*common, "--prewarm-eval", f"remoe={tmp_path / 'eval.json'}", "-o", str(tmp_path / "r")]
    )
    assert result.exit_code == 0, result.output
    assert "remoe pre-warms request-ahead at a measured accuracy of 0.710" in result.output
    assert PREDICTORS["remoe"].hit_rate != 0.71  # the built-in default stays as it was
    bad = runner.invoke(cli, [*common, "--prewarm-eval", "static=x.json", "-o", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "moeless=FILE or remoe=FILE" in bad.output


def test_serve_offers_the_prompt_predictors():
    result = CliRunner().invoke(cli, ["serve", "--help"])
    assert "--predictor [kernel|sps]" in result.output


def test_the_prewarmer_runs_on_kernel_neighbours_and_learns_online():
    from moeless.serving.prewarm import SpsPrewarmer

    # given the pre-warmer of the serving path driven by the kernel predictor
    calls = []
    prior = FrequencyPrior({0: np.array([8.0, 1, 1, 0]), 1: np.array([0.0, 0, 5, 5])})
    kernel = KernelNeighbours(BagOfWords(), prior, bandwidth=0.05, neighbours=1)
    replicas = {(layer, e): [f"f-{layer}-{e}"] for layer in (3, 5) for e in range(4)}
    hook = SpsPrewarmer(kernel, [3, 5], replicas, {}, lambda *c: calls.append(c), top_k=2)
    # when a finished request is learned, the next similar prompt is predicted (and warmed) from it
    hook.after_request("alpha beta", {3: {1: 10}, 5: {3: 4}})
    np.testing.assert_allclose(kernel.predict("alpha beta")[0], [0, 1, 0, 0], atol=1e-6)
    hook.before_request("alpha beta", [1, 2, 3])
    for _ in range(200):  # the warm-ups run in the background
        if len(calls) == 2:
            break
        time.sleep(0.01)
    hook.close()
    assert sorted(calls) == [("f-3-1", 3, 1), ("f-5-3", 5, 3)]
