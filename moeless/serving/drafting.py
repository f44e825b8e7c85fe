"""Drafters: cheap guesses of a sequence's next tokens, for the engine to verify in one forward.

Per generated token the split model pays one round trip per MoE layer; verifying ``k`` guessed
tokens in one forward costs about the same and yields up to ``k + 1`` tokens. The guesses never
change what is generated (:mod:`moeless.serving.speculation` accepts only what the model itself
would produce, or, sampling, keeps its distribution exactly); a better drafter only means fewer
forwards.

A drafter proposes, for each sequence, up to ``k`` tokens following its context (prompt and
generated tokens) and, when it samples them, the distribution each was drawn from (``None``: the
tokens were chosen deterministically, a one-hot distribution).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from moeless.contracts.environment import DEFAULT_DRAFT_CONFIDENCE
from moeless.errors import DraftModelError

DEFAULT_MAX_NGRAM = 3  # prompt lookup matches the context's last 3, then 2, then 1 tokens


@dataclass
class Draft:
    """Up to ``k`` proposed tokens and, for a sampling drafter, each one's distribution ``[V]``."""

    tokens: list[int] = field(default_factory=list)
    probs: list[Any] | None = None


@dataclass(frozen=True)
class DraftRequest:
    """One sequence to draft for: its id (a drafter may keep state per sequence), its tokens so far
    (prompt, then generated), how it samples, and its random generator (its seed)."""

    key: str
    context: list[int]
    temperature: float = 0.0
    top_p: float = 1.0
    generator: Any = None


class Drafter(Protocol):
    """Proposes the next tokens of several sequences at once (one call per engine step)."""

    name: str

    def propose(self, requests: list[DraftRequest], k: int) -> list[Draft]:
        """For each request, up to ``k`` tokens that may follow its context."""
        ...

    def release(self, key: str) -> None:
        """The sequence ``key`` finished: forget whatever was kept for it."""
        ...


def lookup_continuation(context: list[int], k: int, max_ngram: int = DEFAULT_MAX_NGRAM) -> list[int]:
    """Prompt lookup (n-gram) drafting: the ``k`` tokens that followed the latest earlier
    occurrence of the context's last ``n`` tokens, trying ``n = max_ngram`` down to 1.

    Text that quotes, repeats or edits its prompt (code, extraction, summaries) continues the way an
    earlier passage did; no model is needed. An empty list when nothing matches.
    """
    if k < 1:
        return []
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        tail = context[-n:]
        # the latest earlier occurrence that has at least one token after it
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == tail:
                return context[start + n : start + n + k]
    return []


class PromptLookupDrafter:
    """Drafts by :func:`lookup_continuation`; deterministic (no distributions), stateless."""

    name = "prompt-lookup"

    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM) -> None:
        self.max_ngram = max_ngram

    def propose(self, requests: list[DraftRequest], k: int) -> list[Draft]:
        return [Draft(lookup_continuation(r.context, k, self.max_ngram)) for r in requests]

    def release(self, key: str) -> None:
        """Nothing is kept per sequence."""


class ModelDrafter:
    """A small causal LM with the target's tokenizer drafts up to ``k`` tokens per sequence,
    greedily for a greedy request, else sampled from its own distribution at the request's
    temperature and top-p (which speculative sampling then corrects to the target's). A sequence's
    draft stops before the first token the draft gives less than ``min_confidence``; a shorter
    draft never changes what is generated, only how many rows the target verifies.

    The sequences draft together, as the target decodes them (:class:`DecodeBatch`): a step is one
    forward over the tokens each sequence generated since its last draft (its cache keeps what came
    before), then ``k - 1`` one-token forwards, then the drafted columns are trimmed off again (the
    target may reject them). A new sequence's prompt is prefilled alone first.

    Args:
        model_dir: a Hugging Face causal LM folder (config, weights, tokenizer).
        device: where it runs (the backbone's device).
        target_vocab: the target tokenizer's vocabulary (token -> id): the draft's must be the same.
        min_confidence: the draft's probability a drafted token needs (0: always ``k`` tokens).
    """

    name = "draft-model"

    def __init__(
        self,
        model_dir: Path,
        device: Any,
        target_vocab: dict[str, int],
        min_confidence: float = DEFAULT_DRAFT_CONFIDENCE,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from moeless.serving.decode_batch import DecodeBatch

        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=torch.float32, local_files_only=True
            )
        except (OSError, ValueError) as exc:
            raise DraftModelError(
                f"--draft-model {model_dir} is not a causal LM with its tokenizer: {exc}"
            ) from exc
        if tokenizer.get_vocab() != target_vocab:
            raise DraftModelError(
                f"--draft-model {model_dir} has another tokenizer than the served model "
                f"({len(tokenizer.get_vocab())} tokens against {len(target_vocab)}, or the same count "
                "mapped differently): a draft must share the target's tokenizer"
            )
        self.model = model.to(device).eval()
        self.device = device
        self.min_confidence = min_confidence
        self.batch = DecodeBatch(self.model.config)  # members: sequence keys

    @property
    def caches(self) -> list[str]:
        """The sequences whose draft cache is kept."""
        return list(self.batch.members)

    def release(self, key: str) -> None:
        if key in self.batch.members:
            keep = [member for member in self.batch.members if member != key]
            self.batch.rebuild(keep, [])

    def propose(self, requests: list[DraftRequest], k: int) -> list[Draft]:
        import torch

        if k < 1 or not requests:
            return [Draft() for _ in requests]
        by_key = {r.key: r for r in requests}
        with torch.inference_mode():
            self._join(requests, by_key)
            # 1. catch up: each row's tokens since its last draft (at least the one generated last)
            feeds = [
                by_key[key].context[n:] for key, n in zip(self.batch.members, self.batch.lengths, strict=True)
            ]
            width = max(len(feed) for feed in feeds)
            rows = [[*feed, *[feed[-1]] * (width - len(feed))] for feed in feeds]
            logits = self._forward(rows, width)
            self.batch.advanced(self._last_inputs, [len(feed) for feed in feeds])
            last = [logits[b, len(feed) - 1] for b, feed in enumerate(feeds)]
            drafts = [Draft() for _ in self.batch.members]
            drafting = set(range(len(drafts)))  # rows whose draft is still confident
            # 2. up to k tokens, one forward each after the first, while some row still drafts
            extra = 0  # one-token forwards done: the columns to trim afterwards
            for step in range(k):
                for b in sorted(drafting):
                    if not self._choose(drafts[b], last[b], by_key[self.batch.members[b]]):
                        drafting.discard(b)
                if step == k - 1 or not drafting:
                    break
                logits = self._forward(
                    [[d.tokens[-1] if d.tokens else f[-1]] for d, f in zip(drafts, feeds, strict=True)], 1
                )
                self.batch.advanced(self._last_inputs, settle=False)  # the trim below needs every column
                extra += 1
                last = [logits[b, 0] for b in range(len(drafts))]
            self.batch.trim([extra] * len(drafts))  # the drafts may be rejected: keep the contexts only
        found = dict(zip(self.batch.members, drafts, strict=True))
        return [found[r.key] for r in requests]

    def _join(self, requests: list[DraftRequest], by_key: dict[str, DraftRequest]) -> None:
        """Rows for these requests only: finished ones leave, new ones join prefilled (all their
        context but its last token, which the catch-up forward feeds)."""
        import torch
        from transformers import DynamicCache

        keep = [key for key in self.batch.members if key in by_key]
        kept = set(keep)
        joining = []
        for request in requests:
            if request.key in kept:
                continue
            cache = DynamicCache(config=self.model.config)
            prompt = request.context[:-1]
            if prompt:
                self.model(torch.tensor([prompt], device=self.device), past_key_values=cache, use_cache=True)
            joining.append((request.key, cache, len(prompt)))
        if any(length == 0 for _, _, length in joining):  # a one-token context: nothing cached yet
            raise ValueError("a sequence to draft for has no context before its last token")
        self.batch.rebuild(keep, joining)

    def _forward(self, rows: list[list[int]], width: int) -> Any:
        self._last_inputs = self.batch.inputs(rows, self.device, keep_past=True)
        out = self.model(**self._last_inputs, use_cache=True, logits_to_keep=width)
        return out.logits[:, -width:].float().cpu()

    def _choose(self, draft: Draft, logits: Any, request: DraftRequest) -> bool:
        """Add the draft's next token to ``draft`` if the draft gives it ``min_confidence``; whether
        it did (else the draft stops here)."""
        import torch

        from moeless.serving.speculation import target_probs

        if request.temperature == 0:
            probs = torch.softmax(logits, dim=-1)
            token = int(torch.argmax(probs))
            if float(probs[token]) < self.min_confidence:
                return False
            draft.tokens.append(token)
            return True
        q = target_probs(logits, request.temperature, request.top_p)
        token = int(torch.multinomial(q, 1, generator=request.generator))
        if float(q[token]) < self.min_confidence:
            return False
        draft.tokens.append(token)
        draft.probs = [*(draft.probs or []), q]
        return True
