"""Token-level prediction from the experts a token already used: layer l+d's top-k from layers <= l.

When a trace carries no hidden states (a real model's routing recorded elsewhere), or the
layer-aware predictor's router copies are not trained, the experts a token chose at the layers it
has already passed are still known, and they are strongly correlated with what it will choose next
(cross-layer affinity; ExFlow, Yao et al. 2024, arXiv 2401.08383; Pre-gated MoE, Hwang et al.,
ISCA 2024, on why a prediction one layer ahead is enough to hide the fetch).

* :class:`TransitionTable`: counts of (expert a at layer l -> expert b at layer l+d) over training
  tokens; a token scores b by summing the rows of its k experts at l. The baseline.
* :class:`CrossLayerModel`: per (l, d) a small network (one hidden ReLU layer, or none: multinomial
  logistic regression) from the gate-weighted one-hot of the token's experts at *every* layer <= l
  to layer l+d's experts, trained with cross-entropy to the actual top-k. Where the table only sees
  one layer and favours popular experts, the model learns which combinations of earlier choices
  point where and normalises for popularity. The hidden size is chosen on a validation part of the
  training tokens; inference is two small matrix products in numpy.

Shapes: ``experts[T, L, k]`` int, ``weights[T, L, k]`` float (router probabilities), T tokens, L MoE
layers in order; E experts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


def one_hot(experts: np.ndarray, num_experts: int, weights: np.ndarray | None = None) -> np.ndarray:
    """[T, L, k] expert ids (and optional weights) -> [T, L, E] float32 (weight, or 1, where chosen)."""
    out = np.zeros((*experts.shape[:-1], num_experts), np.float32)
    values = np.ones(experts.shape, np.float32) if weights is None else weights.astype(np.float32)
    np.put_along_axis(out, experts.astype(np.int64), values, axis=-1)
    return out


def top_k_of(scores: np.ndarray, k: int) -> np.ndarray:
    """[N, E] scores -> [N, k] indices of the k largest (unordered)."""
    return np.argpartition(-scores, k - 1, axis=-1)[..., :k]


@dataclass
class TransitionTable:
    """counts[(l, d)][a, b]: training tokens with expert a at layer l and b at layer l+d."""

    num_experts: int
    top_k: int
    counts: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)

    def fit(self, experts: np.ndarray, distances: tuple[int, ...]) -> TransitionTable:
        layers = experts.shape[1]
        for d in distances:
            for source in range(layers - d):
                pairs = (
                    experts[:, source, :, None].astype(np.int64) * self.num_experts
                    + experts[:, source + d, None, :]
                )
                self.counts[(source, d)] = (
                    np.bincount(pairs.ravel(), minlength=self.num_experts**2)
                    .reshape(self.num_experts, self.num_experts)
                    .astype(float)
                )
        return self

    def scores(self, source: int, distance: int, experts: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """``experts[N, >= source + 1, k]`` -> [N, E] scores for layer source + distance."""
        return one_hot(experts[:, source], self.num_experts) @ self.counts[(source, distance)]

    def predict(self, source: int, distance: int, experts: np.ndarray, weights: np.ndarray) -> np.ndarray:
        return top_k_of(self.scores(source, distance, experts, weights), self.top_k)


def sparse_features(
    source: int, experts: np.ndarray, weights: np.ndarray, num_experts: int
) -> tuple[np.ndarray, np.ndarray]:
    """The gate-weighted one-hot of layers 0..source, as (index [N, (source+1)k] into the
    (source+1)E inputs, weight [N, (source+1)k]): the network's first layer is a weighted row sum."""
    count = len(experts)
    offsets = (np.arange(source + 1) * num_experts)[None, :, None]
    index = (experts[:, : source + 1].astype(np.int64) + offsets).reshape(count, -1)
    return index, weights[:, : source + 1].astype(np.float32).reshape(count, -1)


@dataclass
class _Net:
    """numpy inference of one fitted (l, d) network: sparse inputs -> [N, E] logits."""

    w1: np.ndarray  # [(l+1)E, H or E]
    b1: np.ndarray
    w2: np.ndarray | None = None
    b2: np.ndarray | None = None

    def __call__(self, index: np.ndarray, weight: np.ndarray) -> np.ndarray:
        out = np.matmul(weight[:, None, :], self.w1[index])[:, 0] + self.b1
        if self.w2 is None:
            return out
        return np.maximum(out, 0.0) @ self.w2 + self.b2


def _train(
    index: np.ndarray,
    weight: np.ndarray,
    inputs: int,
    targets: np.ndarray,
    num_experts: int,
    hidden: int,
    epochs: int,
    seed: int,
) -> _Net:
    """Adam on softmax cross-entropy to the actual top-k (each of the k experts 1/k of the mass)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small batches: one thread is faster than many fighting for cores
    try:
        return _adam(index, weight, inputs, targets, num_experts, hidden, epochs, seed)
    finally:
        torch.set_num_threads(threads)


def _adam(
    index: np.ndarray,
    weight: np.ndarray,
    inputs: int,
    targets: np.ndarray,
    num_experts: int,
    hidden: int,
    epochs: int,
    seed: int,
) -> _Net:
    import torch

    torch.manual_seed(seed)
    index_t, weight_t = torch.from_numpy(index), torch.from_numpy(weight)
    goal = torch.zeros(len(index), num_experts)
    goal.scatter_(1, torch.from_numpy(targets.astype(np.int64)), 1.0 / targets.shape[1])
    first = torch.nn.EmbeddingBag(inputs, hidden or num_experts, mode="sum")
    torch.nn.init.normal_(first.weight, std=0.05)
    bias = torch.nn.Parameter(torch.zeros(hidden or num_experts))
    second = torch.nn.Linear(hidden, num_experts) if hidden else None
    params = [first.weight, bias, *(second.parameters() if second is not None else [])]
    optimizer = torch.optim.Adam(params, lr=5e-3)
    generator = torch.Generator().manual_seed(seed)
    batch = 1024

    def forward(rows: torch.Tensor) -> torch.Tensor:
        out = first(index_t[rows], per_sample_weights=weight_t[rows]) + bias
        return second(torch.relu(out)) if second is not None else out

    for _ in range(epochs):
        order = torch.randperm(len(index), generator=generator)
        for start in range(0, len(index), batch):
            rows = order[start : start + batch]
            loss = -(goal[rows] * torch.log_softmax(forward(rows), dim=-1)).sum(dim=-1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    w1, b1 = first.weight.detach().numpy().copy(), bias.detach().numpy().copy()
    if second is None:
        return _Net(w1, b1)
    return _Net(w1, b1, second.weight.detach().numpy().T.copy(), second.bias.detach().numpy().copy())


def _hits(predicted: np.ndarray, actual: np.ndarray) -> float:
    return float((predicted[:, :, None] == actual[:, None, :]).any(axis=2).mean(axis=1).mean())


class CrossLayerModel:
    """Per (source layer l, distance d): layers 0..l's gate-weighted experts -> layer l+d's top-k.

    Args:
        num_experts: E.
        top_k: k.
        hidden_sizes: candidates for the hidden layer (0: logistic regression), chosen by validation.
        epochs: passes over the training tokens.
        max_tokens: each (l, d) trains on at most this many tokens (a seeded sample), which bounds the
            fitting time (about 4 s per pair on one busy core at the default).
        seed: fixes the validation split, the sample and the initialisation.
    """

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_sizes: tuple[int, ...] = (0, 128),
        epochs: int = 3,
        max_tokens: int = 40_000,
        seed: int = 0,
    ) -> None:
        self.num_experts = num_experts
        self.top_k = top_k
        self.hidden_sizes = hidden_sizes
        self.epochs = epochs
        self.max_tokens = max_tokens
        self.seed = seed
        self.nets: dict[tuple[int, int], _Net] = {}
        self.hidden: dict[int, int] = {}  # distance -> chosen hidden size
        self.validation: dict[int, dict[int, float]] = {}  # distance -> hidden size -> hit rate

    def fit(
        self,
        experts: np.ndarray,
        weights: np.ndarray,
        distances: tuple[int, ...],
        groups: np.ndarray | None = None,
    ) -> CrossLayerModel:
        """Fit every (l, d) on ``experts``/``weights`` [T, L, k] of the training tokens.

        The hidden size per d is the candidate with the best hit rate on a validation 20% of the
        training ``groups`` (requests; tokens of one request stay together), measured on the middle source
        layer; every pair is then fitted with the chosen size on (a sample of) all training tokens.
        """
        assert experts.shape == weights.shape and experts.ndim == 3, "experts/weights must be [T, L, k]"
        tokens, layers, _ = experts.shape
        groups = np.arange(tokens) if groups is None else groups
        names = np.unique(groups)
        held = np.random.default_rng(self.seed).permutation(names)[: max(1, len(names) // 5)]
        validation = np.isin(groups, held)
        fitting = ~validation if validation.any() and (~validation).any() else np.ones(tokens, bool)
        fitting, everything = self._sample(fitting), self._sample(np.ones(tokens, bool))
        for d in distances:
            if layers - d < 1:
                raise ValueError(f"distance {d} needs at least {d + 1} layers (the routing has {layers})")
            probes = [(layers - d - 1) // 2]
            scores = {}
            for hidden in self.hidden_sizes:
                if len(self.hidden_sizes) == 1:
                    scores[hidden] = float("nan")
                    break
                hits = []
                for source in probes:
                    index, weight = sparse_features(source, experts, weights, self.num_experts)
                    net = self._train(
                        source, index[fitting], weight[fitting], experts[fitting, source + d], hidden
                    )
                    logits = net(index[validation], weight[validation])
                    hits.append(_hits(top_k_of(logits, self.top_k), experts[validation, source + d]))
                scores[hidden] = float(np.mean(hits))
            self.validation[d] = scores
            self.hidden[d] = (
                max(scores, key=lambda h: (scores[h], -h)) if len(scores) > 1 else self.hidden_sizes[0]
            )
            for source in range(layers - d):
                index, weight = sparse_features(
                    source, experts[everything], weights[everything], self.num_experts
                )
                self.nets[(source, d)] = self._train(
                    source, index, weight, experts[everything, source + d], self.hidden[d]
                )
        return self

    def _sample(self, mask: np.ndarray) -> np.ndarray:
        """Row indices of ``mask``, at most ``max_tokens`` of them (seeded), in order."""
        rows = np.flatnonzero(mask)
        if len(rows) <= self.max_tokens:
            return rows
        return np.sort(np.random.default_rng(self.seed).choice(rows, self.max_tokens, replace=False))

    def _train(
        self, source: int, index: np.ndarray, weight: np.ndarray, targets: np.ndarray, hidden: int
    ) -> _Net:
        inputs = (source + 1) * self.num_experts
        return _train(index, weight, inputs, targets, self.num_experts, hidden, self.epochs, self.seed)

    def scores(self, source: int, distance: int, experts: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """``experts``/``weights`` [N, >= source+1, k] -> [N, E] logits for layer source + distance."""
        return self.nets[(source, distance)](*sparse_features(source, experts, weights, self.num_experts))

    def predict(self, source: int, distance: int, experts: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """[N, k] predicted experts at layer source + distance."""
        return top_k_of(self.scores(source, distance, experts, weights), self.top_k)

    def save(self, directory: Path) -> Path:
        """``directory/crosslayer.safetensors`` plus ``crosslayer.json`` (sizes and validation)."""
        from safetensors.numpy import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for (source, d), net in self.nets.items():
            for name in ("w1", "b1", "w2", "b2"):
                value = getattr(net, name)
                if value is not None:
                    tensors[f"l{source}_d{d}.{name}"] = np.ascontiguousarray(value, np.float32)
        save_file(tensors, str(directory / "crosslayer.safetensors"))
        (directory / "crosslayer.json").write_text(
            json.dumps(
                {
                    "num_experts": self.num_experts,
                    "top_k": self.top_k,
                    "hidden": {str(d): h for d, h in self.hidden.items()},
                    "validation_hit_rate": {
                        str(d): {str(h): v for h, v in s.items()} for d, s in self.validation.items()
                    },
                },
                indent=1,
            )
        )
        return directory / "crosslayer.safetensors"

    @classmethod
    def load(cls, directory: Path) -> CrossLayerModel:
        """The model :meth:`save` wrote."""
        from safetensors.numpy import load_file

        directory = Path(directory)
        index = json.loads((directory / "crosslayer.json").read_text())
        model = cls(index["num_experts"], index["top_k"])
        model.hidden = {int(d): h for d, h in index["hidden"].items()}
        tensors = load_file(str(directory / "crosslayer.safetensors"))
        for key in tensors:
            pair, name = key.split(".")
            if name != "w1":
                continue
            source, d = (int(part[1:]) for part in pair.split("_"))
            model.nets[(source, d)] = _Net(
                tensors[key], tensors[f"{pair}.b1"], tensors.get(f"{pair}.w2"), tensors.get(f"{pair}.b2")
            )
        return model
