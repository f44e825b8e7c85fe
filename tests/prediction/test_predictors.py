"""Expert-load predictors on a trace of a tiny model: metric definitions, the baselines, the
layer-aware predictor's fine-tuning, SPS's online learning."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import cli
from moeless.prediction.evaluation import evaluate, routers_of, split_requests
from moeless.prediction.predictors import FrequencyPrior, GateCopy, LayerAware, SimilarPromptSearch, hit_rate
from moeless.prediction.trace import TraceError, load_trace, profile
from tests.fakes import BagOfWords

PROMPTS = [
    "The import statement searches for a module",
    "A list comprehension consists of brackets",
    "Exceptions raised inside a with statement",
    "Serverless functions scale to zero when idle",
    "def fibonacci(n): return n if n < 2 else",
    "Mixture of experts routes each token",
    "The quick brown fox jumps over the lazy dog",
    "class Point: def __init__(self, x, y):",
    "Generators yield values lazily",
    "Decorators wrap functions",
]


@pytest.fixture(scope="module")
def trace(tiny, tmp_path_factory):
    model = tiny.model("mixtral", layers=4)
    out = tmp_path_factory.mktemp("trace")
    profile(model, PROMPTS, out, max_new_tokens=6, hidden_sample_rate=1.0, progress=False)
    return load_trace(out)


def test_hit_rate_definition():
    assert hit_rate(np.array([[0, 1], [2, 3]]), np.array([[1, 0], [2, 5]])) == 0.75


def test_oracle_is_perfect_and_baselines_are_in_range(trace):
    oracle = evaluate(trace, "oracle", 1)
    assert oracle["mean"]["hit_rate"] == 1.0 and oracle["mean"]["load_accuracy"] == 1.0
    for method in ("freq", "gate"):
        result = evaluate(trace, method, 1)
        for key in ("hit_rate", "set_recall", "load_accuracy"):
            assert 0.0 <= result["mean"][key] <= 1.0
        assert [row["layer"] for row in result["layers"]] == trace.layers[1:]
    assert set(split_requests(trace)[0]).isdisjoint(split_requests(trace)[1])


def test_layer_aware_fine_tunes_only_below_threshold_and_saves(trace, tmp_path):
    gate = evaluate(trace, "gate", 2)
    layer = evaluate(trace, "layer", 2, threshold=1.01, save_dir=tmp_path)  # fine-tune every copy
    assert layer["fine_tuned"] == ["l0_d2", "l1_d2"]
    # on the tokens it was fitted to, a fine-tuned copy beats the unmodified gate (the held-out split
    # of ten prompts is too small to show it; benchmarks/predictors.py measures that on real prompts)
    routers = routers_of(trace)
    hidden, experts = trace.hidden.astype(np.float32), trace.experts[:, trace.hidden_rows]
    fitted = LayerAware(routers, 2, threshold=1.01).fit(hidden, experts, distances=(2,))
    for source in (0, 1):
        tuned = hit_rate(fitted.copies[(source, 2)].top_k(hidden[source], 2), experts[source + 2])
        assert tuned > fitted.train_hit_rate[(source, 2)]
    index = json.loads((tmp_path / "layer_aware.json").read_text())
    assert index["copies"]["l0_d2"]["fine_tuned"] is True
    untouched = evaluate(trace, "layer", 2, threshold=0.0)  # nothing below a 0 threshold
    assert untouched["fine_tuned"] == [] and untouched["mean"]["hit_rate"] == gate["mean"]["hit_rate"]


def test_gate_copy_applies_the_bias():
    copy = GateCopy(np.eye(3, dtype=np.float32), np.array([0.0, 0.0, 10.0], np.float32))
    assert set(copy.top_k(np.array([[1.0, 0.5, 0.0]], np.float32), 2)[0]) == {0, 2}


def test_sps_falls_back_to_the_prior_and_learns_online(trace):
    prior = FrequencyPrior().fit(trace, np.unique(trace.request))
    sps = SimilarPromptSearch(BagOfWords(), prior, neighbours=2, min_similarity=0.9)
    sps.fit(["alpha beta"], [{i: np.eye(8)[0] for i in range(4)}])
    np.testing.assert_allclose(sps.predict("gamma delta")[0], prior.shares(0))  # nothing similar
    np.testing.assert_allclose(sps.predict("alpha beta")[0], np.eye(8)[0])
    sps.learn("gamma delta", {i: np.eye(8)[3] for i in range(4)})
    np.testing.assert_allclose(sps.predict("gamma delta")[1], np.eye(8)[3])


def test_sps_evaluation_with_a_stand_in_embedder(trace):
    result = evaluate(trace, "sps", 1, embedder=BagOfWords())
    assert 0 <= result["mean"]["load_accuracy"] <= 1 and result["test_requests"] == 3


def test_predict_eval_command_json_shape(trace, tmp_path):
    out = CliRunner().invoke(cli, ["predict", "eval", str(tmp_path / "missing"), "--method", "freq"])
    assert out.exit_code != 0
    result = CliRunner().invoke(
        cli, ["predict", "eval", trace_dir(trace), "--method", "gate", "--distance", "3", "--json"]
    )
    data = json.loads(result.stdout)
    assert set(data) >= {"method", "distance", "layers", "mean"}
    assert set(data["layers"][0]) == {
        "layer",
        "hit_rate",
        "set_recall",
        "load_accuracy",
        "latency_ms_p50",
        "latency_ms_p99",
    }
    with pytest.raises(TraceError, match="distance 4"):
        evaluate(trace, "gate", 4)


def trace_dir(trace) -> str:
    return str(trace.meta["trace_dir"])
