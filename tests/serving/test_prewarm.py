"""The router hook: SPS predictions turned into warm-up invokes, bounded and learned online."""

from __future__ import annotations

import threading
import time

import numpy as np

from moeless.prediction.predictors import FrequencyPrior, SimilarPromptSearch, cover_set
from moeless.serving.prewarm import SpsPrewarmer
from moeless.serving.replanner import RollingLoads
from tests.fakes import BagOfWords


class Prior(FrequencyPrior):
    def __init__(self) -> None:
        super().__init__({0: np.array([8.0, 1, 1, 0]), 1: np.array([0.0, 0, 5, 5])})


def make(last_used=None, max_per_s=100.0, warming=None):
    calls: list[tuple[str, int, int]] = []
    done = threading.Event()

    def warm(function, layer, expert):
        calls.append((function, layer, expert))
        done.set()

    sps = SimilarPromptSearch(BagOfWords(), Prior())
    replicas = {(layer, e): [f"f-{layer}-{e}"] for layer in (3, 5) for e in range(4)}
    hook = SpsPrewarmer(
        sps,
        [3, 5],
        replicas,
        last_used if last_used is not None else {},
        warm,
        top_k=2,
        warming=warming,
        idle_s=60,
        max_per_s=max_per_s,
        predicted=RollingLoads(4),
    )
    return hook, calls


def test_needed_experts_cover_ninety_percent():
    assert cover_set(np.array([0.5, 0.3, 0.15, 0.05])) == [0, 1, 2]
    assert cover_set(np.array([0.95, 0.05])) == [0]


def test_cold_predicted_functions_are_warmed_once_and_recent_ones_are_not():
    hook, calls = make(last_used={"f-3-0": time.monotonic()})
    hook.before_request("anything at all", [1, 2, 3])
    hook.close()
    warmed = {function for function, _, _ in calls}
    # layer 3 (index 0): the prior's 80/10/10 needs experts 0 and 1 (90%); expert 0 was just used
    assert warmed == {"f-3-1", "f-5-2", "f-5-3"}
    assert hook.warmups == 3 and hook.predicted.snapshot().layers[3][0] > 0


def test_warm_ups_are_rate_limited():
    hook, _ = make(max_per_s=2.0)
    hook.before_request("x", [1])
    hook.close()
    assert hook.warmups == 2 and hook.skipped_by_rate == 2


def test_a_warming_function_is_marked_until_its_warm_up_returns():
    warming: dict[str, threading.Event] = {}
    release = threading.Event()
    hook, _ = make(warming=warming)
    hook.warm = lambda function, layer, expert: release.wait(5)
    hook.before_request("x", [1])
    assert warming and all(not event.is_set() for event in warming.values())
    events = list(warming.values())
    release.set()
    hook.close()
    assert all(event.is_set() for event in events) and not warming


def test_finished_requests_are_learned_online():
    hook, _ = make()
    hook.after_request("alpha beta", {3: {1: 10}, 5: {0: 4}})
    prediction = hook.sps.predict("alpha beta")
    np.testing.assert_allclose(prediction[0], [0, 1, 0, 0])
    hook.after_request("partial", {3: {1: 1}})  # a layer without routing: not learned
    assert len(hook.sps.shares) == 1


def test_the_cross_layer_pre_warmer_warms_what_each_tokens_experts_so_far_point_to():
    from moeless.prediction.crosslayer import CrossLayerModel
    from moeless.serving.prewarm import CrossLayerPrewarmer

    # GIVEN routing where a token at expert e of layer 3 always goes on to expert (e + 1) % 4 at 5
    rng = np.random.default_rng(0)
    first = rng.integers(0, 4, size=(2000, 1))
    experts = np.stack([first, (first + 1) % 4], axis=1)  # [T, 2 layers, k=1]
    model = CrossLayerModel(4, 1, hidden_sizes=(0,), epochs=20).fit(experts, np.ones(experts.shape), (1,))
    warmed: list[tuple[int, int]] = []
    hook = CrossLayerPrewarmer(model, [3, 5], lambda layer, expert, now: warmed.append((layer, expert)))
    # WHEN a forward's two tokens leave layer 3 at experts 2 and 0, then reach layer 5
    hook.observe(3, np.array([[2], [0]]), np.ones((2, 1)))
    hook.observe(5, np.array([[3], [1]]), np.ones((2, 1)))
    # THEN layer 5's experts 3 and 1 were warmed once each, and the last layer predicts nothing
    assert sorted(warmed) == [(5, 1), (5, 3)] and hook.predictions == 1
    # and a forward seen from its middle (another thread, no layer 3 yet) predicts nothing
    other = threading.Thread(target=hook.observe, args=(5, np.array([[0]]), np.ones((1, 1))))
    other.start()
    other.join()
    assert len(warmed) == 2
