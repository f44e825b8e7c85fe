"""The router hook: predict a request's experts as it arrives and warm the functions that are cold.

:class:`SpsPrewarmer` runs when a request is submitted (before it waits for a batch slot and before
its first layer): Similar-Prompt Search predicts each layer's load; the experts holding 90% of it
are needed; every function hosting one that has not been invoked within ``idle_s`` is presumed
cold and gets a warm-up invoke (one zero row, in the background, at most one in flight per
function and ``max_per_s`` a second). A request that reaches a function still warming waits for
that instance instead of starting a second cold one (Lambda would), so the cold starts of all its
layers overlap instead of coming one layer after the other. The predicted loads are also
published as rolling rates for the re-planner. SPS learns online from every finished request's
routing.

:class:`CrossLayerPrewarmer` runs inside a forward, token by token: as the forward's tokens leave
layer l, the cross-layer model (:class:`~moeless.prediction.crosslayer.CrossLayerModel`, fitted on
the same trace) predicts each token's experts at layer l+d from the experts it chose at layers
<= l, and the functions hosting them that are presumed cold get warm-up invokes through the same
scheduler (the same rate limit, one warm-up in flight per function). A prompt-level prediction
warms a request's likely experts of every layer before it starts; this one catches what the
request's tokens actually head for next, a layer's time (or d layers') ahead of the invoke.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from moeless.prediction.crosslayer import CrossLayerModel
from moeless.prediction.predictors import SimilarPromptSearch, cover_set
from moeless.prediction.prompt_predictors import KernelNeighbours
from moeless.serving.replanner import RollingLoads


class SpsPrewarmer:
    """Args:
    sps: the fitted prompt-level predictor, SPS or kernel neighbours (its layer indices follow
        ``layers``).
    layers: the model's MoE layer ids, in order.
    replicas: (layer id, expert) -> functions hosting it.
    last_used: function -> monotonic time of its last invoke (kept by the dispatcher).
    warm: ``warm(function, layer, expert)`` sends one warm-up invoke (blocking).
    top_k: experts per token (to turn predicted shares into predicted token loads).
    """

    def __init__(
        self,
        sps: SimilarPromptSearch | KernelNeighbours,
        layers: list[int],
        replicas: dict[tuple[int, int], list[str]],
        last_used: dict[str, float],
        warm: Callable[[str, int, int], None],
        top_k: int,
        warming: dict[str, threading.Event] | None = None,
        idle_s: float = 240.0,
        max_per_s: float = 20.0,
        predicted: RollingLoads | None = None,
    ) -> None:
        self.sps = sps
        self.layers = layers
        self.replicas = replicas
        self.last_used = last_used
        self.warm = warm
        self.top_k = top_k
        self.idle_s = idle_s
        self.rate = max_per_s
        self.burst = max(1.0, max_per_s)
        self.predicted = predicted
        self.warmups = 0
        self.skipped_by_rate = 0
        self._warming: dict[str, threading.Event] = warming if warming is not None else {}
        self._tokens = self.burst
        self._refilled = time.monotonic()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="prewarm")

    def before_request(self, prompt: str, prompt_ids: list[int]) -> None:
        prediction = self.sps.predict(prompt)
        now = time.monotonic()
        for index, layer in enumerate(self.layers):
            shares = prediction[index]
            if self.predicted is not None:
                self.predicted.add(
                    layer, {e: float(s) * len(prompt_ids) * self.top_k for e, s in enumerate(shares)}
                )
            for expert in cover_set(shares):
                self.warm_if_cold(layer, int(expert), now)

    def warm_if_cold(self, layer: int, expert: int, now: float) -> None:
        """Schedule a warm-up of the first function hosting the expert if it idled past ``idle_s``."""
        for function in self.replicas.get((layer, expert), [])[:1]:
            if now - self.last_used.get(function, -1e18) > self.idle_s:
                self._schedule(function, layer, expert, now)

    def _schedule(self, function: str, layer: int, expert: int, now: float) -> None:
        with self._lock:
            if function in self._warming:
                return
            self._tokens = min(self.burst, self._tokens + (now - self._refilled) * self.rate)
            self._refilled = now
            if self._tokens < 1:  # token bucket: max_per_s a second, bursts of as many
                self.skipped_by_rate += 1
                return
            self._tokens -= 1
            self._warming[function] = threading.Event()
            self.warmups += 1
            self.last_used[function] = now  # warm from now on, as far as the next requests know
        self._pool.submit(self._run, function, layer, expert)

    def _run(self, function: str, layer: int, expert: int) -> None:
        try:
            self.warm(function, layer, expert)
        finally:
            with self._lock:
                event = self._warming.pop(function, None)
            if event is not None:
                event.set()

    def after_request(self, prompt: str, routing: dict[int, dict[int, int]]) -> None:
        """Learn a finished request's routing (layer id -> {expert: tokens}) online."""
        if not prompt or not all(routing.get(layer) for layer in self.layers):
            return
        experts = len(self.sps.prior.shares(0))
        shares = {}
        for index, layer in enumerate(self.layers):
            counts = np.zeros(experts)
            for expert, tokens in routing[layer].items():
                counts[expert] += tokens
            shares[index] = counts / counts.sum()
        self.sps.learn(prompt, shares)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class CrossLayerPrewarmer:
    """Token-level pre-warming one or more layers ahead (see the module docstring).

    Args:
        model: a fitted cross-layer model of this model's MoE layers (in ``layers`` order).
        layers: the model's MoE layer ids, in order.
        warm_if_cold: ``warm_if_cold(layer, expert, now)``: the scheduler (``SpsPrewarmer``'s).
        distance: how many layers ahead to predict (the model must have been fitted for it).
    """

    def __init__(
        self,
        model: CrossLayerModel,
        layers: list[int],
        warm_if_cold: Callable[[int, int, float], None],
        distance: int = 1,
    ) -> None:
        self.model = model
        self.layers = layers
        self.warm_if_cold = warm_if_cold
        self.distance = distance
        self.predictions = 0
        self._index = {layer: i for i, layer in enumerate(layers)}
        self._local = threading.local()  # each forward runs in its own thread: its tokens' history

    def observe(self, layer: int, experts: np.ndarray, weights: np.ndarray) -> None:
        """A forward's tokens at ``layer``: ``experts``/``weights`` ``[T, k]`` (the router's top-k)."""
        index = self._index.get(layer)
        if index is None:
            return
        history: list[tuple[np.ndarray, np.ndarray]] | None = getattr(self._local, "history", None)
        if index == 0:
            history = self._local.history = []
        elif history is None or len(history) != index:  # a forward this hook did not see start
            self._local.history = None
            return
        history.append((np.asarray(experts, np.int64), np.asarray(weights, np.float32)))
        if (index, self.distance) not in self.model.nets:
            return
        chosen = np.stack([e for e, _ in history], axis=1)  # [T, index + 1, k]
        gates = np.stack([w for _, w in history], axis=1)
        ahead = np.unique(self.model.predict(index, self.distance, chosen, gates))
        self.predictions += 1
        now = time.monotonic()
        for expert in ahead:
            self.warm_if_cold(self.layers[index + self.distance], int(expert), now)
