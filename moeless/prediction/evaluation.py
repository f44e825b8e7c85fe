"""``moeless predict eval``: how well each predictor foresees routing, on held-out requests.

The trace's requests are split (fixed seed) into train (70%) and test (30%). Predictors fit on the
train requests; ``sps`` then also learns online from each test request after predicting it.
Metrics, per target layer t. Token-level predictors (``gate``, ``layer``, ``oracle``) read layer
t - d's router input, so they are scored on the tokens whose router inputs the trace sampled;
load-level ones (``freq``, ``sps``) predict a request's load before it runs and are scored on all
of its tokens:

* ``hit_rate``      mean over tokens of |predicted top-k ∩ actual top-k| / k;
* ``set_recall``    mean over requests of |P ∩ A| / |A|, A the experts the request's tokens used, P
                    the union of predicted top-k (token-level) or the fewest experts holding 90% of
                    the predicted load (load-level);
* ``load_accuracy`` mean over requests of 1 - TV(predicted shares, actual shares), TV = ½ Σ |p - q|:
                    the figure the planner consumes;
* ``latency_ms``    p50/p99 of one prediction for one layer (``sps``: its per-request embedding and
                    search divided over the layers it serves).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from moeless.prediction.predictors import (
    METHODS,
    Embedder,
    FrequencyPrior,
    LayerAware,
    cover_set,
    fit_sps,
    request_shares,
    timed_ms,
)
from moeless.prediction.trace import Trace, TraceError, load_model, router_weights

TEST_FRACTION = 0.3


def split_requests(trace: Trace, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    requests = np.unique(trace.request)
    order = np.random.default_rng(seed).permutation(requests)
    cut = max(1, round(len(order) * TEST_FRACTION))
    return np.sort(order[cut:]), np.sort(order[:cut])


def routers_of(trace: Trace) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:
    model, _, _ = load_model(Path(trace.meta["model"]))
    by_layer = router_weights(model)
    missing = [layer for layer in trace.layers if layer not in by_layer]
    if missing:
        raise TraceError(f"no linear router found for layers {missing} of {trace.meta['model']}")
    return {i: by_layer[layer] for i, layer in enumerate(trace.layers)}


def evaluate(
    trace: Trace,
    method: str,
    distance: int = 1,
    seed: int = 0,
    embedder: Any = None,
    threshold: float = 0.9,
    save_dir: Path | None = None,
) -> dict[str, Any]:
    """Score ``method`` on ``trace``; returns the JSON of ``moeless predict eval --json``."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    layers = len(trace.layers)
    if not 1 <= distance < layers:
        raise TraceError(
            f"distance {distance} needs at least {distance + 1} MoE layers (the trace has {layers})"
        )
    if not len(trace.hidden_rows):
        raise TraceError("the trace has no sampled router inputs: profile with --hidden-sample > 0")
    k = trace.experts.shape[2]
    train, test = split_requests(trace, seed)
    sampled_request = trace.request[trace.hidden_rows]
    train_rows = np.isin(sampled_request, train)
    test_rows = np.isin(sampled_request, test)
    targets = list(range(distance, layers))

    prior = FrequencyPrior().fit(trace, train)
    predicted_topk: dict[int, np.ndarray] = {}  # target layer -> [test sampled tokens, k]
    request_prediction: dict[int, dict[int, np.ndarray]] = {}  # request -> layer -> shares
    latency: dict[int, tuple[float, float]] = {}
    extra: dict[str, Any] = {}

    if method in ("gate", "layer"):
        predictor = LayerAware(routers_of(trace), k, threshold if method == "layer" else 1.1)
        if method == "layer":
            predictor.fit(
                trace.hidden[:, train_rows].astype(np.float32),
                trace.experts[:, trace.hidden_rows[train_rows]],
                distances=(distance,),
                seed=seed,
            )
            extra["fine_tuned"] = [f"l{s}_d{d}" for (s, d), c in predictor.copies.items() if c.fine_tuned]
            if save_dir is not None:
                extra["saved"] = str(predictor.save(save_dir))
        for t in targets:
            source = t - distance
            copy = predictor.copies.get((source, distance)) or predictor.unmodified(source, distance)
            hidden = trace.hidden[source, test_rows].astype(np.float32)
            predicted_topk[t] = copy.top_k(hidden, k)
            one = hidden[:1]
            latency[t] = timed_ms(lambda copy=copy, one=one: copy.top_k(one, k))
    else:
        if method == "sps":
            embedder = embedder or Embedder()
            prompts = {p["request"]: p["prompt"] for p in trace.prompts}
            sps = fit_sps(trace, train, embedder, prior)
            vectors = embedder([prompts[int(r)] for r in test])
            actual = [request_shares(trace, test, i) for i in range(layers)]
            for r, vector in zip(test, vectors, strict=True):
                request_prediction[int(r)] = sps.predict("", vector)
                sps.learn("", {i: actual[i][int(r)] for i in range(layers)}, vector)
            p50, p99 = timed_ms(lambda: sps.predict(prompts[int(test[0])]), runs=20)
            extra["latency_ms_per_request"] = {"p50": p50, "p99": p99}
            extra["fallbacks_to_prior"] = None
            for t in targets:
                latency[t] = (p50 / layers, p99 / layers)
        elif method == "freq":
            for r in test:
                request_prediction[int(r)] = {i: prior.shares(i) for i in range(layers)}
            for t in targets:
                latency[t] = timed_ms(lambda t=t: prior.shares(t))
        else:  # oracle
            for t in targets:
                latency[t] = (0.0, 0.0)

    rows = []
    test_tokens = trace.hidden_rows[test_rows]
    token_request = trace.request[test_tokens]
    for t in targets:
        actual = trace.experts[t][test_tokens].astype(np.int64)
        if method == "oracle":
            predicted = actual
        elif method in ("gate", "layer"):
            predicted = predicted_topk[t]
        else:
            predicted = (
                np.stack([np.argsort(-request_prediction[int(r)][t])[:k] for r in token_request])
                if len(token_request)
                else actual[:0]
            )
        recalls, accuracies = [], []
        whole = request_shares(trace, test, t) if method in ("sps", "freq") else {}
        for r in np.unique(token_request):
            mine = token_request == r
            if method in ("gate", "layer", "oracle"):
                used = set(actual[mine].ravel().tolist())
                actual_shares = (
                    np.bincount(actual[mine].ravel(), minlength=trace.num_experts) / actual[mine].size
                )
                chosen = set(predicted[mine].ravel().tolist())
                shares = (
                    np.bincount(predicted[mine].ravel(), minlength=trace.num_experts) / predicted[mine].size
                )
            else:
                actual_shares = whole[int(r)]
                used = set(np.flatnonzero(actual_shares).tolist())
                shares = request_prediction[int(r)][t]
                chosen = set(cover_set(shares))
            recalls.append(len(chosen & used) / len(used))
            accuracies.append(1 - 0.5 * float(np.abs(shares - actual_shares).sum()))
        hits = (
            (predicted[:, :, None] == actual[:, None, :]).any(axis=2).sum(axis=1) / k
            if len(actual)
            else [np.nan]
        )
        rows.append(
            {
                "layer": trace.layers[t],
                "hit_rate": float(np.mean(hits)),
                "set_recall": float(np.mean(recalls)),
                "load_accuracy": float(np.mean(accuracies)),
                "latency_ms_p50": latency[t][0],
                "latency_ms_p99": latency[t][1],
            }
        )
    keys = ("hit_rate", "set_recall", "load_accuracy", "latency_ms_p50", "latency_ms_p99")
    return {
        "method": method,
        "distance": distance,
        "layers": rows,
        "mean": {key: float(np.mean([row[key] for row in rows])) for key in keys},
        "train_requests": len(train),
        "test_requests": len(test),
        "test_tokens": len(test_tokens),
    } | {key: value for key, value in extra.items() if value is not None}
