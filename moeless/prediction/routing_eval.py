"""``moeless predict eval-routing``: predictors judged on per-token routing without hidden states.

Input: a routing file (:mod:`moeless.prediction.routing_file`, e.g. gpt-oss-20b's decode routing) or a
``moeless profile`` trace. Requests are split by request (seeded, ``test_fraction`` held out), or
the predictors train on every request of a second file and are tested on every request of the
first. Methods:

* load-level, before the request runs, from its prompt: ``freq`` (the frequency prior), ``sps``
  (Remoe's Similar-Prompt Search), ``kernel``
  (:class:`moeless.prediction.prompt_predictors.KernelNeighbours`).
  Both prompt methods learn online from each test request after predicting it. Scored on every layer.
* token-level, at layer l for layer l + d, from the token's experts at layers <= l: ``table`` (the
  one-layer transition table), ``crosslayer`` (:class:`moeless.prediction.crosslayer.CrossLayerModel`). Scored
  on target layers d..L-1.
* ``oracle``: the truth.

Metrics per layer and their mean, as ``moeless predict eval``: ``hit_rate``, ``set_recall``,
``load_accuracy``, ``latency_ms_p50``/``p99`` (see :mod:`moeless.prediction.evaluation`); every test token
counts (nothing is sampled).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from moeless.prediction.crosslayer import CrossLayerModel, TransitionTable
from moeless.prediction.predictors import COVER, FrequencyPrior, SimilarPromptSearch, fit_sps, timed_ms
from moeless.prediction.prompt_predictors import KernelNeighbours, fit_kernel, shares_by_request
from moeless.prediction.trace import Trace, TraceError

LOAD_METHODS = ("freq", "sps", "kernel")
TOKEN_METHODS = ("table", "crosslayer")
ROUTING_METHODS = (*LOAD_METHODS, *TOKEN_METHODS, "oracle")
KEYS = ("hit_rate", "set_recall", "load_accuracy", "latency_ms_p50", "latency_ms_p99")


class CachedEmbedder:
    """Embeds each distinct text once (SPS and the kernel see the same prompts)."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder
        self.cache: dict[str, np.ndarray] = {}

    def __call__(self, texts: list[str]) -> np.ndarray:
        new = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if new:
            self.cache.update(zip(new, self.embedder(new), strict=True))
        return np.stack([self.cache[t] for t in texts])


def split_by_request(
    trace: Trace, seed: int = 0, test_fraction: float = 0.3
) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) request ids, sorted; the same permutation as ``predict eval`` at 0.3."""
    if not 0 < test_fraction < 1:
        raise TraceError(f"test fraction {test_fraction} must lie strictly between 0 and 1")
    requests = np.unique(trace.request)
    if len(requests) < 2:
        raise TraceError("a split by request needs at least 2 requests")
    order = np.random.default_rng(seed).permutation(requests)
    cut = min(len(order) - 1, max(1, round(len(order) * test_fraction)))
    return np.sort(order[cut:]), np.sort(order[:cut])


def _tokens_first(trace: Trace, requests: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(experts [T, L, k] int64, weights [T, L, k] float32, request [T]) of ``requests``' tokens."""
    mask = np.isin(trace.request, requests)
    return (
        trace.experts[:, mask].transpose(1, 0, 2).astype(np.int64),
        trace.weights[:, mask].transpose(1, 0, 2).astype(np.float32),
        trace.request[mask],
    )


def _covered(shares: np.ndarray, cover: float = COVER) -> np.ndarray:
    """[..., E] shares -> [..., E] bool: the fewest experts holding ``cover`` of it (cover_set)."""
    order = np.argsort(-shares, axis=-1)
    ranked = np.take_along_axis(shares, order, axis=-1)
    before = np.cumsum(ranked, axis=-1) - ranked
    keep = before < cover
    out = np.zeros(shares.shape, bool)
    np.put_along_axis(out, order, keep, axis=-1)
    return out


def _check_compatible(train: Trace, test: Trace) -> None:
    shape = lambda t: (len(t.layers), t.num_experts, t.experts.shape[2])  # noqa: E731
    if shape(train) != shape(test):
        raise TraceError(
            f"the training routing has (layers, experts, k) {shape(train)}, the test routing {shape(test)}"
        )


def evaluate_routing(
    trace: Trace,
    method: str,
    distance: int = 1,
    seed: int = 0,
    train_trace: Trace | None = None,
    test_fraction: float = 0.3,
    embedder: Any = None,
    save_dir: Path | None = None,
) -> dict[str, Any]:
    """Score ``method`` on ``trace``'s test requests; returns the JSON of ``eval-routing --json``."""
    if method not in ROUTING_METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(ROUTING_METHODS)}")
    layers, experts_count, k = len(trace.layers), trace.num_experts, trace.experts.shape[2]
    if not 1 <= distance < layers:
        raise TraceError(
            f"distance {distance} needs at least {distance + 1} MoE layers (the routing has {layers})"
        )
    # 1. who trains, who is tested
    if train_trace is None:
        train_trace = trace
        train, test = split_by_request(trace, seed, test_fraction)
    else:
        _check_compatible(train_trace, trace)
        train, test = np.unique(train_trace.request), np.unique(trace.request)
    test_experts, test_weights, token_request = _tokens_first(trace, test)
    row = np.searchsorted(test, token_request)  # token -> its request's row in ``test``
    actual_shares = shares_by_request(trace, test)  # [R, L, E]
    prior = FrequencyPrior().fit(train_trace, train)
    extra: dict[str, Any] = {}
    latency: dict[int, tuple[float, float]] = {}
    predicted_shares: np.ndarray | None = None  # load-level: [R, L, E]
    predicted_topk: dict[int, np.ndarray] = {}  # token-level: target layer -> [T, k]
    targets = list(range(layers)) if method in LOAD_METHODS else list(range(distance, layers))

    # 2. predict
    if method == "freq":
        predicted_shares = np.broadcast_to(
            np.stack([prior.shares(i) for i in range(layers)]), actual_shares.shape
        )
        for t in targets:
            latency[t] = timed_ms(lambda t=t: prior.shares(t))
    elif method in ("sps", "kernel"):
        from moeless.prediction.predictors import Embedder

        embed = CachedEmbedder(embedder or Embedder())
        prompts = {p["request"]: p["prompt"] for p in trace.prompts}
        train_prompts = {p["request"]: p["prompt"] for p in train_trace.prompts}
        predictor: SimilarPromptSearch | KernelNeighbours
        if method == "sps":
            predictor = fit_sps(train_trace, train, embed, prior)
        else:
            kernel = fit_kernel(train_trace, train, embed, prior)
            extra["settings"] = {
                "bandwidth": kernel.bandwidth,
                "neighbours": kernel.neighbours,
                "median": kernel.median,
                "shrink": kernel.shrink,
                "leave_one_out_load_accuracy": max(kernel.validation.values(), default=None),
            }
            predictor = kernel
        embed([train_prompts[int(r)] for r in train])
        vectors = embed([prompts[int(r)] for r in test])
        rows = []
        for i, vector in enumerate(vectors):
            prediction = predictor.predict("", vector)
            rows.append(np.stack([prediction[j] for j in range(layers)]))
            predictor.learn("", dict(enumerate(actual_shares[i])), vector)
        predicted_shares = np.stack(rows)
        uncached = embed.embedder
        probe = prompts[int(test[0])]
        p50, p99 = timed_ms(lambda: predictor.predict("", uncached([probe])[0]), runs=20)
        extra["latency_ms_per_request"] = {"p50": p50, "p99": p99}
        for t in targets:
            latency[t] = (p50 / layers, p99 / layers)
    elif method in TOKEN_METHODS:
        train_experts, train_weights, train_request = _tokens_first(train_trace, train)
        started = time.perf_counter()
        if method == "table":
            model: Any = TransitionTable(experts_count, k).fit(train_experts, (distance,))
        else:
            model = CrossLayerModel(experts_count, k, seed=seed).fit(
                train_experts, train_weights, (distance,), groups=train_request
            )
            extra["hidden_size"] = model.hidden[distance]
            extra["validation_hit_rate"] = {str(h): v for h, v in model.validation[distance].items()}
            if save_dir is not None:
                extra["saved"] = str(model.save(save_dir))
        extra["fit_s"] = round(time.perf_counter() - started, 2)
        for t in targets:
            source = t - distance
            predicted_topk[t] = model.predict(source, distance, test_experts, test_weights)
            one_e, one_w = test_experts[:1], test_weights[:1]
            latency[t] = timed_ms(lambda s=source, e=one_e, w=one_w: model.predict(s, distance, e, w))
    else:  # oracle
        for t in targets:
            latency[t] = (0.0, 0.0)

    # 3. score
    per_layer = []
    for t in targets:
        actual = test_experts[:, t]
        used = actual_shares[:, t] > 0
        if predicted_shares is not None:
            shares = predicted_shares[:, t]
            predicted = np.argsort(-shares, axis=-1)[:, :k][row]
            chosen = _covered(shares)
        else:
            predicted = actual if method == "oracle" else predicted_topk[t]
            counts = np.zeros((len(test), experts_count))
            np.add.at(counts, (np.repeat(row, k), predicted.ravel()), 1.0)
            shares = counts / np.maximum(counts.sum(axis=-1, keepdims=True), 1)
            chosen = counts > 0
        hits = (predicted[:, :, None] == actual[:, None, :]).any(axis=2).mean(axis=1)
        per_layer.append(
            {
                "layer": trace.layers[t],
                "hit_rate": float(hits.mean()),
                "set_recall": float(((chosen & used).sum(axis=1) / used.sum(axis=1)).mean()),
                "load_accuracy": float((1 - 0.5 * np.abs(shares - actual_shares[:, t]).sum(axis=1)).mean()),
                "latency_ms_p50": latency[t][0],
                "latency_ms_p99": latency[t][1],
            }
        )
    return {
        "method": method,
        "distance": distance,
        "layers": per_layer,
        "mean": {key: float(np.mean([r[key] for r in per_layer])) for key in KEYS},
        "train_requests": len(train),
        "test_requests": len(test),
        "test_tokens": len(token_request),
        "split": "by request" if train_trace is trace else "train file / test file",
    } | extra
