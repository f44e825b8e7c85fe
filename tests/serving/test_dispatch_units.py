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
    assert stop_holdback("hello wor", ("world",)) == 3
    assert stop_holdback("hello", ("xyz",)) == 0
