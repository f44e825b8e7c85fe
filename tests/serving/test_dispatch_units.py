"""Join-the-shortest-queue splitting and the cross-sequence coalescer, without any model."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from moeless.serving.coalesce import StepCoalescer
from moeless.serving.dispatch import jsq_split
from moeless.serving.generation import SamplingParams, sample_token, stop_holdback


@pytest.mark.parametrize(
    "tokens, outstanding, expected",
    [
        (5, [3, 0], [1, 4]),
        (4, [0, 0], [2, 2]),
        (3, [0, 0, 0, 0], [1, 1, 1, 0]),
        (0, [2, 1], [0, 0]),
        (10, [10, 0, 5], [0, 8, 2]),
    ],
)
def test_jsq_split_levels_the_queues(tokens, outstanding, expected):
    shares = jsq_split(tokens, outstanding)
    assert shares == expected and sum(shares) == tokens
    loads = [o + s for o, s in zip(outstanding, shares, strict=True)]
    used = [load for load, share in zip(loads, shares, strict=True) if share]
    assert not used or max(used) - min(loads) <= 1


class Recorder:
    """An inner executor that returns each row times (expert + 1) and records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, dict[int, int]]] = []
        self.lock = threading.Lock()

    def run(self, layer, inputs):
        with self.lock:
            self.calls.append((layer, {e: len(r) for e, r in inputs.items()}))
        return {e: r * (e + 1) for e, r in inputs.items()}


def _participant(coalescer: StepCoalescer, layers: list[int], rows: np.ndarray, fail_at: int | None = None):
    coalescer.join()
    try:
        outputs = []
        for layer in layers:
            if layer == fail_at:
                raise RuntimeError("forward failed")
            outputs.append(coalescer.run(layer, {0: rows, 1: rows[:1]}))
        return outputs
    finally:
        coalescer.leave()


def test_coalescer_merges_a_step_into_one_call_per_layer_and_splits_the_results_back():
    inner = Recorder()
    coalescer = StepCoalescer(inner)
    coalescer.begin_step(3)
    rows = [np.full((n, 2), float(n), np.float32) for n in (1, 2, 3)]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda r: _participant(coalescer, [0, 1], r), rows))
    assert [layer for layer, _ in inner.calls] == [0, 1]
    assert inner.calls[0][1] == {0: 6, 1: 3}
    for r, outputs in zip(rows, results, strict=True):
        np.testing.assert_array_equal(outputs[0][0], r * 1)
        np.testing.assert_array_equal(outputs[1][1], r[:1] * 2)


def test_a_participant_that_fails_early_does_not_block_the_others():
    inner = Recorder()
    coalescer = StepCoalescer(inner)
    coalescer.begin_step(2)
    rows = np.ones((2, 2), np.float32)
    with ThreadPoolExecutor(2) as pool:
        good = pool.submit(_participant, coalescer, [0, 1], rows)
        bad = pool.submit(_participant, coalescer, [0, 1], rows, 1)
        assert len(good.result(timeout=10)) == 2
        with pytest.raises(RuntimeError, match="forward failed"):
            bad.result(timeout=10)
    assert [calls for _, calls in inner.calls] == [{0: 4, 1: 2}, {0: 2, 1: 1}]


def test_sampling_and_stop_holdback():
    import torch

    logits = torch.tensor([0.1, 3.0, 0.2])
    assert sample_token(logits, SamplingParams(temperature=0), None) == 1
    generator = torch.Generator().manual_seed(0)
    tiny_nucleus = SamplingParams(temperature=1.0, top_p=0.01)
    assert {sample_token(logits, tiny_nucleus, generator) for _ in range(20)} == {1}
    for tiny in (1e-30, 5e-324):  # found by schemathesis: the softmax of logits / 5e-324 was nan
        assert sample_token(logits, SamplingParams(temperature=tiny), generator) == 1
        assert sample_token(logits, SamplingParams(top_p=tiny), generator) == 1  # all were cut
    assert stop_holdback("hello wor", ("world",)) == 3
    assert stop_holdback("hello", ("xyz",)) == 0


def test_bundle_slices_puts_one_slice_per_expert_in_each_invoke_within_the_row_limit():
    from moeless.planning.packing import bundle_slices

    assert bundle_slices([(0, 0, 5), (0, 5, 9), (1, 0, 3)], 100) == [[(0, 0, 5), (1, 0, 3)], [(0, 5, 9)]]
    assert bundle_slices([(0, 0, 6), (1, 0, 6), (2, 0, 3)], 10) == [[(0, 0, 6), (2, 0, 3)], [(1, 0, 6)]]
    assert bundle_slices([], 10) == []


class RecordingLambda:
    """A boto3 ``lambda`` client stand-in: the functions run in-process; every invoke is recorded
    as (function, layer, experts); ``failing`` functions answer a function error."""

    def __init__(self, artifacts, failing: set[str] = frozenset()) -> None:
        import io

        from moeless.experts.function import ExpertFunction

        self.function = ExpertFunction(str(artifacts), None, threads=1, log_stream=io.StringIO())
        self.failing = failing
        self.calls: list[tuple[str, int, list[int]]] = []
        self.lock = threading.Lock()

    def invoke(self, FunctionName, Payload, **_):
        import io
        import json

        from moeless.contracts.payload import payload_json

        event = json.loads(Payload)
        with self.lock:
            self.calls.append((FunctionName, event["layer"], event.get("experts", [event.get("expert")])))
        if FunctionName in self.failing:
            return {"FunctionError": "Unhandled", "Payload": io.BytesIO(b'{"errorMessage": "boom"}')}
        return {"Payload": io.BytesIO(payload_json(self.function.invoke(event)))}


def _grouped_dispatcher(artifacts, failing=frozenset(), per_function=4):
    from moeless.contracts.manifest import load_manifest
    from moeless.contracts.plan import one_function_per_expert
    from moeless.planning.packing import pack_within_layer
    from moeless.serving.dispatch import LambdaDispatcher

    manifest = load_manifest(artifacts)
    n = manifest.num_experts
    plan = pack_within_layer(
        one_function_per_expert(manifest),
        per_function,
        lambda _: np.eye(n),
        lambda _: np.ones(n),
        lambda _: 1769,
    )
    client = RecordingLambda(artifacts, failing)
    return LambdaDispatcher(artifacts, manifest, plan, client, qualifier=None, backoff_s=0.0), client, plan


def test_experts_sharing_a_function_travel_in_one_invoke_and_come_back_in_token_order(tiny):
    from moeless.experts.runtime import OnnxExpertPool

    artifacts = tiny.package("mixtral")
    dispatcher, client, plan = _grouped_dispatcher(artifacts)
    rng = np.random.default_rng(2)
    inputs = {
        e: rng.standard_normal((n, 64), dtype=np.float32) for e, n in {0: 3, 1: 1, 5: 4, 6: 2, 7: 5}.items()
    }
    try:
        outputs = dispatcher.run(1, inputs)
    finally:
        dispatcher.close()
    expected = OnnxExpertPool(artifacts).run(1, inputs)
    for expert, rows in expected.items():
        np.testing.assert_allclose(outputs[expert], rows, rtol=1e-6, atol=1e-6)
    hosts = {f.name: {e for _, e in f.experts} for f in plan.functions if f.experts[0][0] == 1}
    used = {name for name, _, _ in client.calls}
    assert len(client.calls) == len(used) == sum(1 for h in hosts.values() if h & set(inputs))
    for name, layer, experts in client.calls:  # one invoke per function, carrying all its experts
        assert layer == 1 and set(experts) == hosts[name] & set(inputs)


def test_a_failing_bundle_is_retried_then_its_experts_run_in_process(tiny):
    from moeless.experts.runtime import OnnxExpertPool

    artifacts = tiny.package("mixtral")
    dispatcher, client, _ = _grouped_dispatcher(artifacts, failing={"moeless-l000-b0000"})
    inputs = {e: np.full((2, 64), e + 1.0, np.float32) for e in range(8)}
    try:
        outputs = dispatcher.run(0, inputs)
    finally:
        dispatcher.close()
    expected = OnnxExpertPool(artifacts).run(0, inputs)
    for expert, rows in expected.items():
        np.testing.assert_allclose(outputs[expert], rows, rtol=1e-6, atol=1e-6)
    failed = [c for c in client.calls if c[0] == "moeless-l000-b0000"]
    assert len(failed) == dispatcher.attempts and dispatcher.stats.get("fallbacks") == 1
