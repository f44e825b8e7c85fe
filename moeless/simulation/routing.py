"""Where a simulated step's tokens go: per MoE layer of the whole model, tokens per expert.

Two sources, one interface (:class:`StepRouting`): a step asks for the counts ``[layers, experts]``
of some sequences' prefill tokens or decode tokens, over **every MoE layer of the model**.

* :class:`SampledRouting` draws tokens from a loads file's per-layer shares. A step of fewer than
  ``EXACT_TOKENS`` tokens picks ``top_k`` *distinct* experts per token (Gumbel top-k); a larger one
  (a long prefill) draws its ``tokens x top_k`` selections from the shares at once (a multinomial),
  which lets a token pick an expert twice: tokens per expert are right in expectation, and the
  number of distinct experts of a prefill this large is saturated either way.
* :class:`RecordedRouting` replays per-token routing as recorded (a ``moeless profile`` trace or a
  ``STEM.npz`` routing file): the n-th simulated request replays recorded request ``n mod R``, its
  j-th decode token the request's j-th recorded token (cycled when the output is longer). A
  prefill replays the recorded prefill rows when the prompt has the recorded length; otherwise
  (routing files record decode tokens only, arrival traces have their own prompt lengths) its
  tokens are drawn from that request's own recorded shares per layer, so prompt-dependence stays.

Where the data records only some layers, each unrecorded MoE layer of the model takes the routing
of the recorded layer nearest in relative depth (:func:`layer_map`, listed in the report).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from moeless.contracts.loads import Loads, shares
from moeless.errors import SimulationError

EXACT_TOKENS = 64


class StepRouting(Protocol):
    """Counts of routed tokens for one step's sequences over the model's MoE layers."""

    top_k: int
    layers: list[int]

    @property
    def num_experts(self) -> int:
        """Routed experts per layer."""
        ...

    def prefill(
        self, source: int, tokens: int, rng: np.random.Generator, chunk: slice | None = None
    ) -> np.ndarray:
        """[layers, experts] tokens of one prompt of ``tokens`` tokens (request ``source``), or of
        its ``chunk`` of them (a step of a chunked prefill)."""
        ...

    def decode(self, sources: list[int], positions: list[int], rng: np.random.Generator) -> np.ndarray:
        """[layers, experts] tokens of one decode token per sequence (its request and its index)."""
        ...

    def loads(self) -> Loads:
        """The routing's expected loads on the model's layers (what the planner plans for)."""
        ...

    def describe(self) -> str:
        """One report line: what the routing replays and how layers are mapped."""
        ...


def layer_map(recorded: list[int], recorded_span: int, model_layers: list[int], model_span: int) -> list[int]:
    """For each of ``model_layers`` (block indices out of ``model_span`` blocks), the index into
    ``recorded`` (block indices out of ``recorded_span``) whose routing it takes: itself when
    recorded, else the recorded layer nearest in relative depth (ties to the shallower)."""
    if not recorded:
        raise SimulationError("the routing records no layers")
    if list(recorded) == list(model_layers):
        return list(range(len(recorded)))
    depth = np.array([(r + 0.5) / max(recorded_span, 1) for r in recorded])
    chosen = []
    for layer in model_layers:
        if layer in recorded and recorded_span == model_span:
            chosen.append(recorded.index(layer))
            continue
        chosen.append(int(np.argmin(np.abs(depth - (layer + 0.5) / max(model_span, 1)))))
    return chosen


def _describe_map(recorded: list[int], chosen: list[int], model_layers: list[int]) -> str:
    copied = [(m, recorded[c]) for m, c in zip(model_layers, chosen, strict=True) if m != recorded[c]]
    if not copied:
        return f"all {len(model_layers)} MoE layers recorded"
    runs: dict[int, list[int]] = {}
    for model_layer, source in copied:
        runs.setdefault(source, []).append(model_layer)
    parts = [f"{_span(layers)} <- recorded {source}" for source, layers in sorted(runs.items())]
    return (
        f"{len(model_layers)} MoE layers, {len(model_layers) - len(copied)} recorded; "
        f"unrecorded layers copy the nearest recorded one: {'; '.join(parts)}"
    )


def _span(layers: list[int]) -> str:
    return f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0])


def sample_counts(p: np.ndarray, tokens: int, top_k: int, rng: np.random.Generator) -> np.ndarray:
    """[layers, experts] counts of ``tokens`` tokens each choosing ``top_k`` experts per layer from
    shares ``p`` [layers, experts] (rows sum to 1); see the module docstring for the two regimes."""
    layers, experts = p.shape
    if tokens <= 0:
        return np.zeros((layers, experts), np.int64)
    k = min(top_k, experts)
    if tokens < EXACT_TOKENS:
        keys = np.log(np.maximum(p, 1e-300))[None] + rng.gumbel(size=(tokens, layers, experts))
        chosen = np.argpartition(-keys, k - 1, axis=2)[:, :, :k]  # [tokens, layers, k]
        flat = (chosen + np.arange(layers)[None, :, None] * experts).ravel()
        return np.bincount(flat, minlength=layers * experts).reshape(layers, experts)
    return rng.multinomial(tokens * k, p)


def resampled_shares(counts: np.ndarray, experts: int, rng: np.random.Generator) -> np.ndarray:
    """A layer's skew carried onto ``experts`` experts: the recorded shares' Lorenz curve (sorted
    shares, cumulated over the fraction of experts) read at ``experts`` even steps, then the
    experts shuffled. The hot-expert concentration is kept; which expert is hot is not."""
    ordered = np.sort(shares(counts))[::-1]
    curve = np.concatenate([[0.0], np.cumsum(ordered)])
    at = np.interp(np.linspace(0, 1, experts + 1), np.linspace(0, 1, len(ordered) + 1), curve)
    return rng.permutation(np.diff(at))


@dataclass
class SampledRouting:
    """Tokens drawn from per-layer shares (``shares[layers, experts]``, model layer order)."""

    shares: np.ndarray
    top_k: int
    layers: list[int]
    mapping: str

    @property
    def num_experts(self) -> int:
        return int(self.shares.shape[1])

    @classmethod
    def from_loads(
        cls,
        loads: Loads,
        top_k: int,
        model_layers: list[int],
        model_span: int,
        experts: int | None = None,
        seed: int = 0,
    ) -> SampledRouting:
        """The loads' shares on the model's layers; with ``experts`` (a model with another expert
        count), each layer's skew is carried onto that many experts (:func:`resampled_shares`)."""
        recorded = sorted(loads.layers)
        span = int(loads.meta.get("num_model_layers") or model_span)
        chosen = layer_map(recorded, span, model_layers, model_span)
        mapping = _describe_map(recorded, chosen, model_layers)
        if experts is None or experts == loads.num_experts:
            table = np.stack([shares(loads.layers[recorded[c]]) for c in chosen])
        else:
            rng = np.random.default_rng(seed)
            table = np.stack([resampled_shares(loads.layers[recorded[c]], experts, rng) for c in chosen])
            mapping += (
                f"; each layer's skew over {loads.num_experts} experts carried onto {experts} "
                "(sorted shares' Lorenz curve resampled, experts shuffled)"
            )
        return cls(table, top_k, list(model_layers), mapping)

    def prefill(
        self, source: int, tokens: int, rng: np.random.Generator, chunk: slice | None = None
    ) -> np.ndarray:
        return sample_counts(self.shares, _chunk_length(tokens, chunk), self.top_k, rng)

    def decode(self, sources: list[int], positions: list[int], rng: np.random.Generator) -> np.ndarray:
        return sample_counts(self.shares, len(sources), self.top_k, rng)

    def loads(self) -> Loads:
        """The shares as loads on the model's layers (what the planner plans for)."""
        return Loads(
            {layer: self.shares[i] * 1e6 for i, layer in enumerate(self.layers)}, {"top_k": self.top_k}
        )

    def describe(self) -> str:
        return f"sampled from the loads' shares, top-{self.top_k}; {self.mapping}"


@dataclass
class RecordedRouting:
    """Per-token routing replayed as recorded (see the module docstring).

    ``decode_rows[r]``: request r's decode tokens' experts ``[T_r, recorded layers, k]``;
    ``prefill_rows[r]``: its prefill tokens' (``[P_r, layers, k]``, empty when not recorded).
    """

    decode_rows: list[np.ndarray]
    prefill_rows: list[np.ndarray]
    num_experts: int
    top_k: int
    layers: list[int]
    chosen: list[int]  # per model layer, the recorded layer index it replays
    mapping: str
    source: str
    lengths: list[tuple[int, int]] = field(default_factory=list)  # per request: prompt, output tokens

    @classmethod
    def from_trace(
        cls, trace: Any, model_layers: list[int] | None = None, model_span: int = 0
    ) -> RecordedRouting:
        """From a :class:`~moeless.prediction.trace.Trace` (profile folder or routing file)."""
        recorded = list(trace.layers)
        model_layers = list(model_layers) if model_layers is not None else recorded
        span = int(trace.meta.get("num_model_layers") or (max(recorded) + 1))
        chosen = layer_map(recorded, span, model_layers, model_span or span)
        experts = np.asarray(trace.experts)  # [recorded layers, N, k]
        decode, prefill, lengths = [], [], []
        recorded_lengths = {
            int(row["request"]): (int(row.get("prompt_tokens") or 0), int(row.get("generated_tokens") or 0))
            for row in trace.prompts
            if isinstance(row, dict) and "request" in row
        }
        ids = np.unique(trace.request)
        if not len(ids):
            raise SimulationError("the routing holds no requests")
        order = np.lexsort((trace.position, trace.request))
        for request in ids:
            rows = order[trace.request[order] == request]
            phase = trace.phase[rows]
            decode_rows = experts[:, rows[phase == 1]].transpose(1, 0, 2)
            prefill_rows = experts[:, rows[phase == 0]].transpose(1, 0, 2)
            if not len(decode_rows):
                decode_rows = prefill_rows
            decode.append(np.ascontiguousarray(decode_rows.astype(np.int64)))
            prefill.append(np.ascontiguousarray(prefill_rows.astype(np.int64)))
            prompt, generated = recorded_lengths.get(int(request), (0, 0))
            lengths.append((prompt or max(len(prefill_rows), 1), max(generated, len(decode_rows), 1)))
        return cls(
            decode,
            prefill,
            int(trace.num_experts),
            int(trace.meta["top_k"]),
            model_layers,
            chosen,
            _describe_map(recorded, chosen, model_layers),
            str(trace.meta.get("trace_dir", "trace")),
            lengths,
        )

    def _counts(self, rows: np.ndarray) -> np.ndarray:
        """[layers, experts] counts of recorded rows ``[n, recorded layers, k]`` on the model's layers."""
        picked = rows[:, self.chosen, :]  # [n, model layers, k]
        flat = (picked + np.arange(len(self.chosen))[None, :, None] * self.num_experts).ravel()
        return np.bincount(flat, minlength=len(self.chosen) * self.num_experts).reshape(
            len(self.chosen), self.num_experts
        )

    def prefill(
        self, source: int, tokens: int, rng: np.random.Generator, chunk: slice | None = None
    ) -> np.ndarray:
        r = source % len(self.decode_rows)
        if len(self.prefill_rows[r]) == tokens:
            return self._counts(self.prefill_rows[r][chunk or slice(None)])
        counts = self._counts(self.decode_rows[r]).astype(float)
        shares = counts / counts.sum(axis=1, keepdims=True)
        return sample_counts(shares, _chunk_length(tokens, chunk), self.top_k, rng)

    def decode(self, sources: list[int], positions: list[int], rng: np.random.Generator) -> np.ndarray:
        rows = []
        for source, position in zip(sources, positions, strict=True):
            recorded = self.decode_rows[source % len(self.decode_rows)]
            rows.append(recorded[position % len(recorded)])
        return self._counts(np.stack(rows))

    def loads(self) -> Loads:
        """Every recorded token's routing on the model's layers (what the planner plans for)."""
        counts = np.zeros((len(self.layers), self.num_experts), np.int64)
        for rows in [*self.decode_rows, *self.prefill_rows]:
            if len(rows):
                counts += self._counts(rows)
        return Loads(
            {layer: np.asarray(counts[i], float) for i, layer in enumerate(self.layers)},
            {"top_k": self.top_k},
        )

    def describe(self) -> str:
        return (
            f"per-token routing replayed from {self.source} ({len(self.decode_rows)} requests, cycled), "
            f"top-{self.top_k}; {self.mapping}"
        )


def _chunk_length(tokens: int, chunk: slice | None) -> int:
    """How many of a prompt's ``tokens`` its ``chunk`` holds (all of them for ``None``)."""
    return tokens if chunk is None else len(range(tokens)[chunk])
