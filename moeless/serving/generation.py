"""The generation engine: continuous batching of requests over the split model.

One loop thread runs *steps*. A step takes every active sequence: the ones already decoding run
**one batched forward** (one token each, their KV caches stacked and left-padded,
:class:`~moeless.serving.decode_batch.DecodeBatch`), and each new one runs its prefill forward alone,
all of these concurrently, taking turns on the backbone, with the expert calls of each MoE layer
merged across them (:class:`~moeless.serving.coalesce.StepCoalescer`): one invoke per expert per layer
per step, whatever the number of sequences. Then it samples one token per sequence, streams the
new text, and retires finished sequences. Waiting requests join at the next step boundary, up
to ``max_batch`` in flight; a prefilled sequence joins the decode batch at the step after.

With ``prefill_chunk`` the prefill is **chunked**: a step computes at most that many prompt
tokens, shared by its new sequences in the order they joined (each continues its own cache from
where its last chunk ended; one whose share is 0 waits for a step with room). A long prompt then
delays the decoding batch by one chunk per step rather than by its whole prefill.

With a ``drafter`` and ``speculate`` = k, each decoding sequence carries up to k drafted tokens into
the batched forward, which computes the model's logits after its last token and after each draft
at once (every MoE layer's rows for all of them in the same coalesced invokes);
:func:`~moeless.serving.speculation.verify` keeps the drafts the model agrees with and one token
more, and the batch drops the cache columns of the rest. Greedy output is the same as without
drafts; sampled output has the same distribution.

An unchunked prefill is exactly ``generate``'s, a chunked one equal to it up to float rounding (the
attention over the cache in pieces); the batched decode is ``generate``'s left-padded batch (mask
and position ids), equal to one-at-a-time decoding up to float rounding (see docs/serving.md
for the tolerance and the tie rule).
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import numpy as np

from moeless.serving.coalesce import StepCoalescer
from moeless.serving.decode_batch import DecodeBatch
from moeless.serving.drafting import Draft, Drafter, DraftRequest
from moeless.serving.speculation import target_probs, verify
from moeless.serving.stats import ServingStats

REPLACEMENT_CHAR = "\ufffd"  # an incomplete UTF-8 sequence at the end of the decoded text


class Overloaded(Exception):
    """The waiting queue is full: the caller should retry later (HTTP 429)."""


class ShuttingDown(Exception):
    """The engine is stopping and takes no new requests (HTTP 503)."""


class PrewarmHook(Protocol):
    """The router hook: ``before_request`` as a request arrives, before it queues and before its
    first layer (the predictor warms functions here); ``after_request`` with its routing
    (layer -> tokens per expert) once it finished (the predictor learns here)."""

    def before_request(self, prompt: str, prompt_ids: list[int]) -> None: ...

    def after_request(self, prompt: str, routing: dict[int, Any]) -> None: ...


class NoPrewarm:
    def before_request(self, prompt: str, prompt_ids: list[int]) -> None:
        """No predictor: nothing to warm."""

    def after_request(self, prompt: str, routing: dict[int, Any]) -> None:
        """No predictor: nothing to learn."""


@dataclass(frozen=True)
class SamplingParams:
    """OpenAI's completion parameters that the engine honours."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False  # report each sampled token's log-probability (:attr:`Event.logprobs`)


@dataclass
class Event:
    """What a request's listener receives: ``text`` deltas, then ``done`` or ``error``.

    With ``SamplingParams.logprobs``, a ``text`` or ``done`` event carries ``logprobs``: the
    ``(token_id, logprob)`` of each token sampled since the previous event (a token whose text is
    held back comes with the text that releases it), under the model's own distribution, before
    temperature and top-p, as vLLM reports them. Over a request they are its completion tokens.
    """

    kind: str
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Sequence:
    """One request in the engine."""

    prompt_ids: list[int]
    params: SamplingParams
    on_event: Callable[[Event], None]
    prompt: str = ""
    routing: dict[int, Any] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # of ``generated`` (with params.logprobs)
    reported: int = 0  # tokens of ``generated`` whose logprobs went out in an event
    text: str = ""
    emitted: int = 0
    finish_reason: str | None = None
    error: str | None = None
    cancelled: bool = False
    cache: Any = None  # its own KV cache between its prefill and joining the decode batch
    prefilled: int = 0  # prompt tokens in ``cache`` (its prefill is complete at len(prompt_ids))
    logits: Any = None
    accepted: list[int] = field(default_factory=list)  # tokens a verification forward produced
    generator: Any = None
    submitted_at: float = field(default_factory=time.perf_counter)
    done: threading.Event = field(default_factory=threading.Event)


def sample_token(logits: Any, params: SamplingParams, generator: Any) -> int:
    """Greedy at temperature 0; otherwise temperature-scaled nucleus (top-p) sampling."""
    import torch

    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = target_probs(logits, params.temperature, params.top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


def token_logprob(logits: Any, token: int) -> float:
    """``token``'s log-probability under the softmax of ``logits`` (float64: no underflow to -inf)."""
    import torch

    return float(torch.log_softmax(logits.double(), dim=-1)[token])


def prefill_shares(remaining: list[int], chunk: int | None) -> list[int]:
    """The prompt tokens each new sequence computes in one step, in join order: all it has left
    (``remaining``), or with ``chunk`` that many in all, shared first come first (the simulator
    chunks the same way)."""
    left = math.inf if chunk is None else chunk
    shares = []
    for tokens in remaining:
        share = int(max(0, min(tokens, left)))
        shares.append(share)
        left -= share
    return shares


def stop_holdback(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of ``text`` that might begin a stop string (not yet safe to stream)."""
    held = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:k]):
                held = k
                break
    return held


class GenerationEngine:
    """Continuous-batching generation over a (split) causal LM.

    Args:
        model: a transformers causal LM (its experts calling ``coalescer`` when split).
        tokenizer: the model's tokenizer (decoding completions).
        coalescer: merges expert calls across the sequences of a step; ``None`` for an unsplit model.
        eos_ids: token ids that end a completion.
        max_batch: sequences per step.
        max_waiting: queued requests beyond the batch before :class:`Overloaded`.
        stats: request/token counters and latency.
        prewarm: the router hook, called as a request is admitted.
        prefill_chunk: prompt tokens per step across its new sequences (chunked prefill);
            ``None``: each new sequence's whole prompt in its first step.
        drafter: proposes each decoding sequence's next tokens (``None``: no speculation).
        speculate: the most drafted tokens a sequence carries into one forward (0: off).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        coalescer: StepCoalescer | None,
        eos_ids: set[int],
        max_batch: int = 16,
        max_waiting: int = 256,
        stats: ServingStats | None = None,
        prewarm: PrewarmHook | None = None,
        prefill_chunk: int | None = None,
        drafter: Drafter | None = None,
        speculate: int = 0,
    ) -> None:
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1 token, not {prefill_chunk}")
        if speculate < 0 or (speculate and drafter is None):
            raise ValueError(f"speculate must be 0, or at least 1 with a drafter, not {speculate}")
        self.model = model
        self.drafter = drafter if speculate else None
        self.speculate = speculate
        self.prefill_chunk = prefill_chunk
        self.tokenizer = tokenizer
        self.coalescer = coalescer
        self.eos_ids = eos_ids
        self.max_batch = max_batch
        self.max_waiting = max_waiting
        self.stats = stats or ServingStats()
        self.prewarm = prewarm or NoPrewarm()
        self.device = next(model.parameters()).device
        self._waiting: deque[Sequence] = deque()
        self._active: list[Sequence] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._decoding = DecodeBatch(model.config)
        self._pool = ThreadPoolExecutor(max_batch, thread_name_prefix="forward")
        # one forward computes at a time (the others wait for experts): no core oversubscription
        self._backbone = threading.Lock()
        if coalescer is not None:
            coalescer.share_backbone(self._backbone)
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._thread.start()

    # --- requests -----------------------------------------------------------------------------

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_event: Callable[[Event], None],
        prompt: str = "",
    ) -> Sequence:
        """Queue a request; its events go to ``on_event`` (from the engine thread)."""
        return self.submit_all([(prompt_ids, prompt)], params, lambda _index, event: on_event(event))[0]

    def submit_all(
        self,
        requests: list[tuple[list[int], str]],
        params: SamplingParams,
        on_event: Callable[[int, Event], None],
    ) -> list[Sequence]:
        """Queue the prompts of one request, all or none: when they do not all fit the waiting
        queue, :class:`Overloaded` is raised and nothing was queued (a refused request leaves
        nothing running). ``requests`` is ``(prompt_ids, prompt_text)`` per prompt; events go to
        ``on_event(index, event)``."""
        import torch

        if any(not ids for ids, _text in requests):
            raise ValueError("a prompt of no tokens has nothing to continue from")
        sequences = [
            Sequence(list(ids), params, partial(on_event, index), text)
            for index, (ids, text) in enumerate(requests)
        ]
        for sequence in sequences:
            if params.seed is not None:
                sequence.generator = torch.Generator().manual_seed(params.seed)
        with self._cond:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if len(self._waiting) + len(sequences) > self.max_waiting:
                self.stats.inc("requests_rejected")
                raise Overloaded(
                    f"{len(self._waiting)} prompts are already waiting (at most {self.max_waiting})"
                )
        for sequence in sequences:
            self.prewarm.before_request(sequence.prompt, sequence.prompt_ids)
        with self._cond:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            self._waiting.extend(sequences)
            self._cond.notify()
        return sequences

    def cancel(self, sequences: list[Sequence]) -> None:
        """Drop requests nobody waits for any more (the client hung up, or the request failed).

        A waiting sequence leaves the queue now; an active one is dropped at the next step
        boundary, so it costs no further forward and no further expert invoke. Finished ones are
        left alone. Each dropped sequence counts as ``requests_cancelled``.
        """
        with self._cond:
            for sequence in sequences:
                if not sequence.done.is_set():
                    sequence.cancelled = True
            queued = [s for s in self._waiting if s.cancelled]
            if queued:
                self._waiting = deque(s for s in self._waiting if not s.cancelled)
            for sequence in queued:
                self._drop(sequence)

    def _drop_cancelled(self) -> None:
        """At a step boundary (lock held): retire the active sequences that were cancelled."""
        for sequence in [s for s in self._active if s.cancelled and not s.done.is_set()]:
            self._drop(sequence)
        self._active = [s for s in self._active if not s.done.is_set()]

    def _drop(self, sequence: Sequence) -> None:
        self._release(sequence)
        sequence.cache = None
        sequence.logits = None
        sequence.finish_reason = "cancelled"
        self.stats.inc("requests_cancelled")
        sequence.done.set()

    @property
    def stopping(self) -> bool:
        """The engine is stopping: failures from now on are the shutdown's, not the request's."""
        return self._stopping

    def load(self) -> tuple[int, int]:
        """(active, waiting) sequences."""
        with self._cond:
            return len(self._active), len(self._waiting)

    def stop(self) -> None:
        """Fail queued and in-flight requests explicitly, then stop the loop."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
        self._pool.shutdown(wait=True)

    # --- the loop -----------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._waiting and not self._active:
                    self._cond.wait()
                if self._stopping:
                    for sequence in [*self._active, *self._waiting]:
                        self._fail(sequence, "the server shut down before the request finished")
                    self._active.clear()
                    self._waiting.clear()
                    self._decoding.clear()
                    return
                self._drop_cancelled()
                while self._waiting and len(self._active) < self.max_batch:
                    self._active.append(self._waiting.popleft())
                batch = list(self._active)
            if not batch:  # every active sequence was cancelled
                continue
            try:
                self._step(batch)
            except Exception as exc:  # a step that breaks fails its sequences; the engine goes on
                self._decoding.clear()
                for sequence in batch:
                    if not sequence.done.is_set():
                        self._fail(sequence, f"{type(exc).__name__}: {exc}")
            with self._cond:
                self._active = [s for s in self._active if not s.done.is_set()]

    def _step(self, batch: list[Sequence]) -> None:
        # 1. The decode batch: finished rows leave, the sequences prefilled last step join.
        present = {id(sequence) for sequence in batch}
        keep = [s for s in self._decoding.members if id(s) in present]
        joining = [s for s in batch if s.cache is not None and s.prefilled == len(s.prompt_ids)]
        self._decoding.rebuild(keep, [(s, s.cache, len(s.prompt_ids)) for s in joining])
        for sequence in joining:
            sequence.cache = None
        decoding = list(self._decoding.members)
        in_batch = {id(s) for s in decoding}
        prefilling = self._prefill_chunks([s for s in batch if id(s) not in in_batch])
        # 2. One batched decode forward and one prefill (chunk) forward per new sequence, concurrently.
        if self.coalescer is not None:
            self.coalescer.begin_step(len(prefilling) + (1 if decoding else 0))
        futures: list[tuple[Sequence | None, Future[None]]] = [
            (s, self._pool.submit(self._prefill, s, tokens)) for s, tokens in prefilling
        ]
        if decoding:
            futures.append((None, self._pool.submit(self._decode, decoding)))
        # 3. Sample, stream, retire; a failed forward fails only the sequences it carried.
        for alone, future in futures:
            carried = decoding if alone is None else [alone]
            try:
                future.result()
            except Exception as exc:  # one request's failure must not take the others down
                if alone is None:
                    self._decoding.clear()  # some layers may hold the new column, others not
                for failed in carried:
                    self._fail(failed, f"{type(exc).__name__}: {exc}")
                continue
            for done in carried:
                if done.prefilled < len(done.prompt_ids):  # a chunk: no token until the last one
                    continue
                try:
                    self._advance(done)
                except Exception as exc:  # sampling or decoding one sequence: fail it, not the engine
                    self._fail(done, f"{type(exc).__name__}: {exc}")

    def _prefill_chunks(self, new: list[Sequence]) -> list[tuple[Sequence, int]]:
        """The prompt tokens each new sequence computes in this step: the rest of its prompt, or
        with ``prefill_chunk`` that many in all, shared in join order (later ones wait)."""
        remaining = [len(s.prompt_ids) - s.prefilled for s in new]
        shares = prefill_shares(remaining, self.prefill_chunk)
        return [(s, tokens) for s, tokens in zip(new, shares, strict=True) if tokens > 0]

    def _prefill(self, sequence: Sequence, tokens: int) -> None:
        """The next ``tokens`` of the prompt in a forward alone, on the sequence's own cache (all of
        them at once: exactly ``generate``'s prefill); the logits of the last chunk's last token."""
        start = sequence.prefilled
        out = self._forward(
            sequence.routing,
            input_ids=[sequence.prompt_ids[start : start + tokens]],
            past_key_values=sequence.cache,
        )
        sequence.cache = out.past_key_values
        sequence.prefilled = start + tokens
        if sequence.prefilled == len(sequence.prompt_ids):
            sequence.logits = out.logits[0, -1].float().cpu()

    def _decode(self, decoding: list[Sequence]) -> None:
        """One token for every decoding sequence, in one forward over the stacked caches; with a
        drafter, each sequence's drafts verified in that forward too."""
        drafts = self._drafts(decoding)
        width = 1 + max((len(d.tokens) for d in drafts), default=0)
        rows = [
            [s.generated[-1], *_padded(d.tokens, width - 1, s.generated[-1])]
            for s, d in zip(decoding, drafts, strict=True)
        ]
        inputs = self._decoding.inputs(rows, self.device)
        routing = [s.routing for s in decoding for _ in range(width)]  # one per token row, row-major
        # a short draft's padding rows: no expert computes them, and nothing reads their logits
        fillers = (
            np.array(
                [b * width + j for b, d in enumerate(drafts) for j in range(1 + len(d.tokens), width)],
                dtype=np.int64,
            )
            if width > 1
            else None
        )
        out = self._forward(routing, logits_to_keep=width, fillers=fillers, **inputs)
        logits = out.logits[:, -width:].float().cpu()
        self.stats.inc("decode_forwards")
        self.stats.inc("decode_verifications", len(decoding))  # one per sequence: its tokens per forward
        if self.drafter is None:
            self._decoding.advanced(inputs)
            for row, sequence in enumerate(decoding):
                sequence.logits = logits[row, -1]
            self.stats.inc("decode_tokens", len(decoding))
            return
        kept = []
        for row, (sequence, draft) in enumerate(zip(decoding, drafts, strict=True)):
            params = sequence.params
            tokens = verify(
                logits[row, : 1 + len(draft.tokens)],
                draft.tokens,
                params.temperature,
                params.top_p,
                sequence.generator,
                draft.probs or [None] * len(draft.tokens),
            )
            sequence.accepted, sequence.logits = tokens, logits[row, : len(tokens)]
            kept.append(len(tokens))
            self.stats.inc("decode_tokens", len(tokens))
            self._count_acceptance(
                self._draft_slots(sequence), len(draft.tokens), min(len(tokens) - 1, len(draft.tokens))
            )
        self._decoding.advanced(inputs, kept)

    def _count_acceptance(self, slots: int, proposed: int, accepted: int) -> None:
        """The drafter's acceptance, per draft position ``i`` (1-based): ``draft_tried_i`` counts the
        drafts at ``i`` verified with every earlier one accepted, ``draft_accepted_i`` those kept;
        ``draft_room_i`` the verifications with room for a draft at ``i`` (``slots``) and one at
        ``i - 1``, ``draft_carried_i`` those that carried one (a drafter may stop short: no
        lookup match, an unsure draft model). Their ratios are what the simulator replays
        (:meth:`moeless.simulation.speculation.Acceptance.from_counters`)."""
        self.stats.inc("draft_tokens_proposed", proposed)
        self.stats.inc("draft_tokens_accepted", accepted)
        for position in range(1, min(slots, proposed + 1) + 1):
            self.stats.inc(f"draft_room_{position}")
            if position <= proposed:
                self.stats.inc(f"draft_carried_{position}")
        for position in range(1, min(accepted + 1, proposed) + 1):
            self.stats.inc(f"draft_tried_{position}")
            if position <= accepted:
                self.stats.inc(f"draft_accepted_{position}")

    def _draft_slots(self, sequence: Sequence) -> int:
        """The drafts ``sequence`` may carry into this forward: at most ``speculate``, and fewer than
        the tokens it may still generate (the token after the drafts is generated too)."""
        return min(self.speculate, max(0, sequence.params.max_tokens - len(sequence.generated) - 1))

    def _drafts(self, decoding: list[Sequence]) -> list[Draft]:
        """Each decoding sequence's drafts, no more than its :meth:`_draft_slots`."""
        if self.drafter is None:
            return [Draft() for _ in decoding]
        k = max(self._draft_slots(s) for s in decoding)
        if k < 1:
            return [Draft() for _ in decoding]
        drafts = self.drafter.propose(
            [
                DraftRequest(
                    s.id, s.prompt_ids + s.generated, s.params.temperature, s.params.top_p, s.generator
                )
                for s in decoding
            ],
            k,
        )
        for sequence, draft in zip(decoding, drafts, strict=True):
            room = self._draft_slots(sequence)
            del draft.tokens[room:]
            if draft.probs is not None:
                del draft.probs[room:]
        return drafts

    def _forward(
        self,
        routing: dict[int, Any] | list[dict[int, Any]],
        logits_to_keep: int = 1,
        fillers: Any = None,
        **inputs: Any,
    ) -> Any:
        """One model forward as a step participant (``routing``: per sequence, or per token row;
        ``fillers``: rows no expert needs to compute)."""
        import torch

        if self.coalescer is not None:
            self.coalescer.join(routing, fillers)
        self._backbone.acquire()
        try:
            if not torch.is_tensor(inputs["input_ids"]):
                inputs["input_ids"] = torch.tensor(inputs["input_ids"], device=self.device)
            with torch.inference_mode():
                return self.model(**inputs, use_cache=True, logits_to_keep=logits_to_keep)
        finally:
            self._backbone.release()
            if self.coalescer is not None:
                self.coalescer.leave()

    def _advance(self, sequence: Sequence) -> None:
        """Generate the sequence's next token, or the tokens its verification forward accepted."""
        if sequence.accepted:
            tokens, rows = sequence.accepted, sequence.logits
            sequence.accepted, sequence.logits = [], None
            for token, logits in zip(tokens, rows, strict=True):
                if self._emit(sequence, token, logits):
                    return
            return
        token = sample_token(sequence.logits, sequence.params, sequence.generator)
        logits, sequence.logits = sequence.logits, None
        self._emit(sequence, token, logits)

    def _emit(self, sequence: Sequence, token: int, logits: Any) -> bool:
        """Append ``token`` (chosen from ``logits``), stream what is safe; True once finished."""
        if token in self.eos_ids:
            self._finish(sequence, "stop")
            return True
        if sequence.params.logprobs:
            sequence.logprobs.append(token_logprob(logits, token))
        sequence.generated.append(token)
        text = self.tokenizer.decode(sequence.generated, skip_special_tokens=True)
        stops = sequence.params.stop
        hits = [text.find(stop) for stop in stops if stop and stop in text]
        if hits:
            sequence.text = text[: min(hits)]
            self._finish(sequence, "stop")
            return True
        sequence.text = text
        if len(sequence.generated) >= sequence.params.max_tokens:
            self._finish(sequence, "length")
            return True
        safe = len(text.rstrip(REPLACEMENT_CHAR)) - stop_holdback(text, stops)
        if safe > sequence.emitted:
            sequence.on_event(
                Event("text", text[sequence.emitted : safe], logprobs=self._unreported(sequence))
            )
            sequence.emitted = safe
        return False

    @staticmethod
    def _unreported(sequence: Sequence) -> list[tuple[int, float]]:
        """The sampled tokens and logprobs not yet sent in an event (none without params.logprobs)."""
        if not sequence.params.logprobs:
            return []
        start, sequence.reported = sequence.reported, len(sequence.generated)
        return list(zip(sequence.generated[start:], sequence.logprobs[start:], strict=True))

    def _release(self, sequence: Sequence) -> None:
        if self.drafter is not None:
            self.drafter.release(sequence.id)

    def _finish(self, sequence: Sequence, reason: str) -> None:
        self._release(sequence)
        sequence.finish_reason = reason
        sequence.cache = None
        if len(sequence.text) > sequence.emitted:
            sequence.on_event(
                Event("text", sequence.text[sequence.emitted :], logprobs=self._unreported(sequence))
            )
            sequence.emitted = len(sequence.text)
        self.stats.inc("requests_completed")
        self.stats.inc("prompt_tokens", len(sequence.prompt_ids))
        self.stats.inc("completion_tokens", len(sequence.generated))
        self.stats.observe_request(time.perf_counter() - sequence.submitted_at)
        self.prewarm.after_request(sequence.prompt, sequence.routing)
        sequence.done.set()
        sequence.on_event(Event("done", finish_reason=reason, logprobs=self._unreported(sequence)))

    def _fail(self, sequence: Sequence, message: str) -> None:
        self._release(sequence)
        sequence.error = message
        sequence.cache = None
        self.stats.inc("requests_failed")
        sequence.done.set()
        sequence.on_event(Event("error", text=message))


def _padded(tokens: list[int], width: int, filler: int) -> list[int]:
    """``tokens`` padded to ``width`` with their last token (else ``filler``): every row of a step has
    as many tokens; the padding goes to no expert and is never verified."""
    return [*tokens, *[tokens[-1] if tokens else filler] * (width - len(tokens))]
