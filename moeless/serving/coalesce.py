"""Continuous batching at the expert boundary: the sequences of one engine step share invokes.

Each sequence of a step runs its backbone forward in its own thread. At every MoE layer its
``run(layer, rows)`` call waits here until every sequence still in the step has reached the same
layer, then one call per needed expert carries all of their rows, and each sequence gets its own
rows' outputs back. Per-invoke overhead is paid once per layer per step, not once per sequence.

A participant is one forward: one sequence's prefill, or the batched decode of many sequences.
Its ``routing`` (what each of its sequences sent to which expert, for the router hook) is one
dict, or a list with one dict per token row of its forward; the split model reports each
layer's token rows per expert with :meth:`StepCoalescer.record_tokens`.

A participant that finishes (or fails) its forward ``leave()``s, so nobody waits for it at layers
it will not reach. With :meth:`StepCoalescer.share_backbone`, the forwards take turns on the
backbone (one computes while the others wait at a layer), so they do not oversubscribe the cores.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from moeless.experts.runtime import ExpertExecutor

Routing = dict[int, dict[int, int]]  # layer -> expert -> tokens


@dataclass
class _Submission:
    inputs: dict[int, np.ndarray]
    outputs: dict[int, np.ndarray] | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class StepCoalescer:
    """An :class:`ExpertExecutor` that merges the expert calls of concurrent forwards.

    Args:
        inner: the executor that runs the merged calls (the Lambda dispatcher, or onnxruntime).
    """

    def __init__(self, inner: ExpertExecutor) -> None:
        self.inner = inner
        self._cond = threading.Condition()
        self._participants = 1
        self._left: list[set[int]] = []  # layers reached by each participant that has left
        self._pending: dict[int, list[_Submission]] = {}
        self._local = threading.local()
        self._backbone: threading.Lock | None = None
        # called with (layer, experts [T, k], weights [T, k]) of each forward's tokens at each layer
        self.routing_observer: Callable[[int, np.ndarray, np.ndarray], None] | None = None

    def share_backbone(self, lock: threading.Lock) -> None:
        """Participants hold ``lock`` while they compute and release it while waiting here."""
        self._backbone = lock

    def begin_step(self, participants: int) -> None:
        """Start a step of ``participants`` forwards (each then calls :meth:`join` in its thread)."""
        with self._cond:
            if self._pending:
                raise RuntimeError("a step began while the previous one still waits at a layer")
            self._participants = participants
            self._left = []

    def join(self, routing: Routing | list[Routing] | None = None, fillers: np.ndarray | None = None) -> None:
        """Called by each participant's thread before its forward; ``routing`` (layer -> tokens per
        expert) accumulates what this participant sends: one dict for all its token rows, or one
        dict per token row (a batched decode: row ``b`` is sequence ``b``'s token). ``fillers``:
        token rows whose output nobody reads (a verification's padding past a short draft): the
        split model sends them to no expert (:meth:`filler_rows`)."""
        self._local.layers = set()
        self._local.routing = routing
        self._local.fillers = fillers

    def filler_rows(self) -> np.ndarray | None:
        """The calling forward's rows that need no expert (see :meth:`join`)."""
        return getattr(self._local, "fillers", None)

    def record_tokens(self, layer: int, tokens: dict[int, np.ndarray]) -> None:
        """The calling participant's token rows (indices into its forward's ``[T, H]`` hidden states)
        sent to each expert of ``layer``: counted into its ``routing``."""
        routing = getattr(self._local, "routing", None)
        if routing is None or getattr(self._local, "layers", None) is None:
            return
        for expert, rows in tokens.items():
            owners = [routing] * len(rows) if isinstance(routing, dict) else [routing[int(t)] for t in rows]
            for owner in owners:
                counts = owner.setdefault(layer, {})
                counts[expert] = counts.get(expert, 0) + 1

    def observe_routing(self, layer: int, experts: np.ndarray, weights: np.ndarray) -> None:
        """The calling forward's router choices at ``layer`` (``[T, k]``), for the routing observer."""
        if self.routing_observer is not None:
            self.routing_observer(layer, experts, weights)

    def leave(self) -> None:
        """Called by each participant's thread after its forward, also when it failed."""
        ready = []
        layers, self._local.layers = getattr(self._local, "layers", None) or set(), None
        with self._cond:
            self._left.append(layers)
            for layer in list(self._pending):
                if len(self._pending[layer]) >= self._expected(layer):
                    ready.append((layer, self._pending.pop(layer)))
        for layer, batch in ready:
            self._execute(layer, batch)

    def _expected(self, layer: int) -> int:
        return self._participants - sum(1 for layers in self._left if layer not in layers)

    def run(self, layer: int, inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        submission = _Submission(inputs)
        layers = getattr(self._local, "layers", None)
        if layers is None:  # not part of a step (direct use): run alone
            return self.inner.run(layer, inputs)
        with self._cond:
            layers.add(layer)
            batch = self._pending.setdefault(layer, [])
            batch.append(submission)
            ready = len(batch) >= self._expected(layer)
            if ready:
                del self._pending[layer]
        if self._backbone is not None:
            self._backbone.release()
        try:
            if ready:
                self._execute(layer, batch)
            submission.done.wait()
        finally:
            if self._backbone is not None:
                self._backbone.acquire()
        if submission.error is not None:
            raise submission.error
        assert submission.outputs is not None
        return submission.outputs

    def _execute(self, layer: int, batch: list[_Submission]) -> None:
        """One inner call with every submission's rows, concatenated per expert in arrival order."""
        try:
            merged: dict[int, list[np.ndarray]] = {}
            for submission in batch:
                for expert, rows in submission.inputs.items():
                    merged.setdefault(expert, []).append(rows)
            outputs = self.inner.run(layer, {e: np.concatenate(parts) for e, parts in merged.items()})
            offsets = dict.fromkeys(merged, 0)
            for submission in batch:
                submission.outputs = {}
                for expert, rows in submission.inputs.items():
                    start = offsets[expert]
                    submission.outputs[expert] = outputs[expert][start : start + len(rows)]
                    offsets[expert] = start + len(rows)
        except BaseException as exc:  # every waiting forward must learn of the failure
            for submission in batch:
                submission.error = exc
        finally:
            for submission in batch:
                submission.done.set()
