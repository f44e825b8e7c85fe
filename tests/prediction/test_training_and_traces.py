"""Training a small MoE, profiling its routing into a trace, and reducing the trace to loads."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import cli
from moeless.model.training import TrainSpec, train_model
from moeless.prediction.trace import TraceError, load_trace, profile, read_prompts

SMALL = TrainSpec(layers=2, experts=4, hidden=32, intermediate=64, vocab=400, seq_len=32, batch=4, steps=6)


def test_training_is_deterministic_for_a_seed_and_reports_perplexity(tmp_path):
    from safetensors.numpy import load_file

    first = train_model(tmp_path / "a", SMALL, progress=False)
    train_model(tmp_path / "b", SMALL, progress=False)
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert first.steps == 6 and 1 < first.heldout_perplexity < 400 * 2
    assert json.loads((tmp_path / "a" / "training_report.json").read_text())["spec"]["seed"] == 0


def test_profile_records_every_token_of_prefill_and_decode(tiny, tmp_path):
    prompts = ["The quick brown fox", "def f(x): return x"]
    profile(
        tiny.model("mixtral"),
        prompts,
        tmp_path / "trace",
        max_new_tokens=5,
        hidden_sample_rate=0.5,
        progress=False,
    )
    trace = load_trace(tmp_path / "trace")
    assert [p["prompt"] for p in trace.prompts] == prompts
    expected = sum(p["prompt_tokens"] + p["generated_tokens"] for p in trace.prompts)
    assert len(trace.request) == expected
    assert trace.experts.shape == (2, expected, 2) and trace.weights.shape == (2, expected, 2)
    assert set(np.unique(trace.phase)) <= {0, 1} and (trace.phase == 0).sum() == sum(
        p["prompt_tokens"] for p in trace.prompts
    )
    assert trace.hidden.shape == (2, len(trace.hidden_rows), 64)
    loads = trace.loads()
    assert all(counts.sum() == expected * 2 for counts in loads.layers.values())
    decode = trace.loads("decode")
    assert sum(decode.layers[0]) == 2 * (trace.phase == 1).sum()


def test_profile_and_trace_loads_commands(tiny, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello there"}\n{"prompt": "MoE routing"}\n')
    runner = CliRunner()
    result = runner.invoke(
        cli,
        [
            "profile",
            str(tiny.model("mixtral")),
            "--prompts",
            str(prompts),
            "-o",
            str(tmp_path / "t"),
            "--max-new-tokens",
            "3",
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "2 requests" in result.output
    loads = runner.invoke(cli, ["trace", "loads", str(tmp_path / "t"), "-o", str(tmp_path / "loads.json")])
    assert loads.exit_code == 0
    plan = runner.invoke(
        cli,
        [
            "plan",
            "--loads",
            str(tmp_path / "loads.json"),
            "--policy",
            "moeless",
            "--workers",
            "2",
            "--slots",
            "10",
            "-o",
            str(tmp_path / "plan.json"),
        ],
    )
    assert plan.exit_code == 0, plan.output


@pytest.mark.parametrize(
    "text, message", [("", "no prompts"), ("not json\n", "not JSON"), ('{"x": 1}\n', "prompt")]
)
def test_bad_prompt_files(tmp_path, text, message):
    (tmp_path / "p.jsonl").write_text(text)
    with pytest.raises(TraceError, match=message):
        read_prompts(tmp_path / "p.jsonl")
