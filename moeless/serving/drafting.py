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
    """A small causal LM with the target's tokenizer drafts ``k`` tokens per sequence, greedily for
    a greedy request, else sampled from its own distribution at the request's temperature and
    top-p (which speculative sampling then corrects to the target's).

    Each sequence keeps its KV cache of the draft model between steps; a step feeds only the tokens
    generated since, drafts, then crops the drafted tokens off again (the target may reject them).

    Args:
        model_dir: a Hugging Face causal LM folder (config, weights, tokenizer).
        device: where it runs (the backbone's device).
        target_vocab: the target tokenizer's vocabulary (token -> id): the draft's must be the same.
    """

    name = "draft-model"

    def __init__(self, model_dir: Path, device: Any, target_vocab: dict[str, int]) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
            self.model = AutoModelForCausalLM.from_pretrained(
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
        self.model = self.model.to(device).eval()
        self.device = device
        self.caches: dict[str, tuple[Any, int]] = {}  # key -> (draft cache, tokens it holds)

    def propose(self, requests: list[DraftRequest], k: int) -> list[Draft]:
        return [self._draft(request, k) for request in requests]

    def release(self, key: str) -> None:
        self.caches.pop(key, None)

    def _draft(self, request: DraftRequest, k: int) -> Draft:
        import torch
        from transformers import DynamicCache

        from moeless.serving.speculation import target_probs

        cache, cached = self.caches.get(request.key) or (DynamicCache(config=self.model.config), 0)
        for layer in cache.layers:  # drafts are cropped off again: sliding windows must keep what they drop
            if getattr(layer, "is_sliding", False):
                layer.activate_past_recording()
        context = request.context
        if cached >= len(context):  # never more than the context: recompute its last token
            _crop(cache, cached - len(context) + 1)
            cached = len(context) - 1
        tokens: list[int] = []
        probs: list[Any] = []
        feed = context[cached:]
        with torch.inference_mode():
            for _ in range(k):
                out = self.model(
                    torch.tensor([feed], device=self.device), past_key_values=cache, use_cache=True
                )
                logits = out.logits[0, -1].float().cpu()
                if request.temperature == 0:
                    token = int(torch.argmax(logits))
                else:
                    q = target_probs(logits, request.temperature, request.top_p)
                    token = int(torch.multinomial(q, 1, generator=request.generator))
                    probs.append(q)
                tokens.append(token)
                feed = [token]
        _crop(cache, len(tokens) - 1)  # the drafts may be rejected: keep only what the context holds
        self.caches[request.key] = (cache, len(context))
        return Draft(tokens, probs if request.temperature != 0 else None)


def _crop(cache: Any, tokens: int) -> None:
    """Drop the last ``tokens`` of ``cache`` (transformers' ``crop`` takes a negative count)."""
    if tokens > 0:
        cache.crop(-tokens)
