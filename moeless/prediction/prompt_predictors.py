"""Request-level load prediction from the prompt, stronger than Similar-Prompt Search.

Remoe's SPS (:class:`moeless.prediction.predictors.SimilarPromptSearch`) averages the routing of the 16 most
similar past prompts, each weighted by its raw cosine similarity. Two things limit it: MiniLM's
cosine similarities of prompts in one format all sit close together (so the weights are nearly
uniform and a far neighbour counts almost as much as a near one), and its neighbourhood size and
weighting are fixed constants.

:class:`KernelNeighbours` is Nadaraya-Watson kernel regression (Nadaraya 1964, Watson 1964) over
*centred* embeddings (the mean of the past prompts' embeddings subtracted, then renormalised, which
spreads the similarities out), with a softmax kernel ``exp(sim / bandwidth)`` over the nearest
``neighbours``, shrunk towards the frequency prior by ``shrink`` (James-Stein style: useful when
neighbours are few or noisy). The neighbours' shares are combined by a blend of their
kernel-weighted mean and their kernel-weighted median per expert (weight ``median``): load accuracy
is 1 - total variation, an L1 loss, whose pointwise minimiser is the median, not the mean; the
median also ignores the odd neighbour whose short answer left noisy shares. Bandwidth, neighbours,
median weight and shrinkage are chosen by leave-one-out validation on the training requests only.
Finished requests join the index online (:meth:`learn`), as in SPS. It has SPS's interface
(``predict``, ``learn``, ``prior``), so the pre-warmer and the re-planner's demand forecast take
either.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moeless.prediction.predictors import FrequencyPrior
from moeless.prediction.trace import Trace

BANDWIDTHS = (0.02, 0.05, 0.1, 0.2, 0.4)
NEIGHBOURS = (4, 8, 16, 32)
SHRINKS = (0.0, 0.1, 0.2, 0.4)
MEDIANS = (0.0, 0.5, 0.7, 1.0)


def load_accuracy(predicted: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """1 - total variation distance over the last axis (shares): [..., E] -> [...]."""
    return 1.0 - 0.5 * np.abs(predicted - actual).sum(axis=-1)


def _kernel_weights(similarity: np.ndarray, bandwidth: float) -> np.ndarray:
    """[..., n] similarities (sorted, best first) -> softmax weights along the last axis."""
    weights = np.exp((similarity - similarity[..., :1]) / bandwidth)
    return weights / weights.sum(axis=-1, keepdims=True)


def weighted_median_shares(weights: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Per expert, the weighted median of the neighbours' shares, renormalised to sum to 1.

    weights [q, k] (rows sum to 1), shares [q, k, L, E] -> [q, L, E].
    """
    order = np.argsort(shares, axis=1)
    ranked = np.take_along_axis(shares, order, axis=1)
    cumulative = np.cumsum(
        np.take_along_axis(np.broadcast_to(weights[:, :, None, None], shares.shape), order, axis=1), axis=1
    )
    middle = np.minimum((cumulative < 0.5).sum(axis=1, keepdims=True), shares.shape[1] - 1)
    median = np.take_along_axis(ranked, middle, axis=1)[:, 0]
    totals = median.sum(axis=-1, keepdims=True)
    return np.where(totals > 0, median / np.maximum(totals, 1e-12), 1.0 / shares.shape[-1])


def kernel_regression(
    similarity: np.ndarray, shares: np.ndarray, neighbours: int, bandwidth: float, median: float = 0.0
) -> np.ndarray:
    """Similarities [q, n] to the indexed requests, their shares [n, L, E] -> [q, L, E]: the softmax
    kernel over the ``neighbours`` most similar, their mean and median blended by ``median``."""
    near = np.argsort(-similarity, axis=1)[:, :neighbours]
    weights = _kernel_weights(np.take_along_axis(similarity, near, axis=1), bandwidth)
    neighbour_shares = shares[near]
    mean = np.einsum("qk,qkle->qle", weights, neighbour_shares)
    if median == 0:
        return mean
    return (1 - median) * mean + median * weighted_median_shares(weights, neighbour_shares)


class KernelNeighbours:
    """Kernel-weighted nearest prompts -> per-layer expert shares, shrunk towards the prior.

    Args:
        embedder: text -> unit vectors [n, D].
        prior: the frequency prior (its layer indices are the predicted layers).
        bandwidth, neighbours, median, shrink: the kernel's settings (``fit`` chooses them unless
            given ``tune=False``).
    """

    def __init__(
        self,
        embedder: Any,
        prior: FrequencyPrior,
        bandwidth: float = 0.1,
        neighbours: int = 16,
        shrink: float = 0.0,
        median: float = 0.0,
    ) -> None:
        self.embedder = embedder
        self.prior = prior
        self.bandwidth = bandwidth
        self.neighbours = neighbours
        self.shrink = shrink
        self.median = median
        self.centre = np.zeros(0, np.float32)
        self.vectors = np.zeros((0, 0), np.float32)  # centred, unit
        self.shares = np.zeros((0, 0, 0))  # [n, L, E]
        self.validation: dict[str, float] = {}

    def centred(self, vectors: np.ndarray) -> np.ndarray:
        """Raw embeddings [..., D] -> centred on the indexed prompts' mean, unit length."""
        out = np.asarray(vectors, np.float32) - self.centre
        return out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-9)

    def _prior_array(self) -> np.ndarray:
        return np.stack([self.prior.shares(i) for i in sorted(self.prior.counts)])

    def fit(
        self,
        prompts: list[str],
        shares: np.ndarray,
        vectors: np.ndarray | None = None,
        tune: bool = True,
        medians: tuple[float, ...] = MEDIANS,
    ) -> KernelNeighbours:
        """Index past requests: ``shares[n, L, E]`` per prompt; choose the settings by leave-one-out
        (``medians`` are the median weights tried: ``(0.0,)`` keeps the kernel mean alone)."""
        raw = self.embedder(prompts) if vectors is None else np.asarray(vectors, np.float32)
        assert len(raw) == len(shares), "one shares row per prompt"
        self.centre = raw.mean(axis=0) if len(raw) > 1 else np.zeros(raw.shape[1], np.float32)
        self.vectors = self.centred(raw)
        self.shares = np.asarray(shares, float)
        if tune and len(raw) > 2:
            self._tune(medians)
        return self

    def _tune(self, medians: tuple[float, ...]) -> None:
        """Grid search on leave-one-out load accuracy over the indexed requests."""
        similarity = self.vectors @ self.vectors.T
        np.fill_diagonal(similarity, -np.inf)
        order = np.argsort(-similarity, axis=1)
        prior = self._prior_array()
        best = (-1.0, self.bandwidth, self.neighbours, self.median, self.shrink)
        for neighbours in NEIGHBOURS:
            k = min(neighbours, len(order) - 1)
            near = order[:, :k]
            sims = np.take_along_axis(similarity, near, axis=1)
            neighbour_shares = self.shares[near]
            for bandwidth in BANDWIDTHS:
                weights = _kernel_weights(sims, bandwidth)
                mean = np.einsum("nk,nkle->nle", weights, neighbour_shares)
                middle = weighted_median_shares(weights, neighbour_shares) if any(medians) else mean
                for median in medians:
                    kernel = (1 - median) * mean + median * middle
                    for shrink in SHRINKS:
                        accuracy = float(
                            load_accuracy((1 - shrink) * kernel + shrink * prior, self.shares).mean()
                        )
                        setting = (
                            f"bandwidth={bandwidth} neighbours={neighbours} median={median} shrink={shrink}"
                        )
                        self.validation[setting] = accuracy
                        if accuracy > best[0]:
                            best = (accuracy, bandwidth, neighbours, median, shrink)
        _, self.bandwidth, self.neighbours, self.median, self.shrink = best

    def predict_array(self, vector: np.ndarray) -> np.ndarray:
        """One raw (uncentred) embedding -> [L, E] predicted shares."""
        prior = self._prior_array()
        if not len(self.shares):
            return prior
        similarity = (self.vectors @ self.centred(vector))[None]
        kernel = kernel_regression(similarity, self.shares, self.neighbours, self.bandwidth, self.median)[0]
        return (1 - self.shrink) * kernel + self.shrink * prior

    def predict(self, prompt: str, vector: np.ndarray | None = None) -> dict[int, np.ndarray]:
        """Per layer index: predicted shares (SimilarPromptSearch's interface)."""
        query = self.embedder([prompt])[0] if vector is None else vector
        return dict(enumerate(self.predict_array(query)))

    def learn(self, prompt: str, shares: dict[int, np.ndarray], vector: np.ndarray | None = None) -> None:
        """Add a finished request to the index (the centre and settings stay as fitted)."""
        raw = self.embedder([prompt])[0] if vector is None else vector
        row = np.stack([shares[i] for i in sorted(shares)])[None]
        if not len(self.shares):
            self.centre = np.zeros(len(raw), np.float32)
            self.vectors, self.shares = self.centred(raw)[None], row
            return
        self.vectors = np.vstack([self.vectors, self.centred(raw)[None]])
        self.shares = np.concatenate([self.shares, row])


def fit_kernel(
    trace: Trace,
    requests: np.ndarray,
    embedder: Any,
    prior: FrequencyPrior | None = None,
    vectors: np.ndarray | None = None,
) -> KernelNeighbours:
    """:class:`KernelNeighbours` over ``requests`` of ``trace`` (prompts, per-layer shares), tuned."""
    prompts = {p["request"]: p["prompt"] for p in trace.prompts}
    return KernelNeighbours(embedder, prior or FrequencyPrior().fit(trace, requests)).fit(
        [prompts[int(r)] for r in requests], shares_by_request(trace, requests), vectors
    )


def shares_by_request(trace: Trace, requests: np.ndarray) -> np.ndarray:
    """[len(requests), L, E]: each request's share of its tokens' selections per expert and layer
    (uniform for a request with no tokens); the vectorised form of ``predictors.request_shares``."""
    requests = np.asarray(requests)
    row_of = {int(r): i for i, r in enumerate(requests)}
    mine = np.isin(trace.request, requests)
    rows = np.array([row_of[int(r)] for r in trace.request[mine]], np.int64)
    layers, _, k = trace.experts.shape
    counts = np.zeros((len(requests), layers, trace.num_experts))
    for i in range(layers):
        np.add.at(counts[:, i], (np.repeat(rows, k), trace.experts[i][mine].ravel().astype(np.int64)), 1.0)
    totals = counts.sum(axis=-1, keepdims=True)
    return np.where(totals > 0, counts / np.maximum(totals, 1), 1.0 / trace.num_experts)
