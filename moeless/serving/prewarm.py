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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

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
