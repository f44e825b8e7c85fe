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
from typing import Any, Protocol

DEFAULT_MAX_NGRAM = 3  # prompt lookup matches the context's last 3, then 2, then 1 tokens


@dataclass
class Draft:
    """Up to ``k`` proposed tokens and, for a sampling drafter, each one's distribution ``[V]``."""

    tokens: list[int] = field(default_factory=list)
    probs: list[Any] | None = None


class Drafter(Protocol):
    """Proposes the next tokens of several sequences at once (one call per engine step)."""

    name: str

    def propose(
        self, contexts: list[list[int]], k: int, params: list[Any], generators: list[Any]
    ) -> list[Draft]:
        """For each context (token ids, prompt then generated), up to ``k`` next tokens."""
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
    """Drafts by :func:`lookup_continuation`; deterministic (no distributions)."""

    name = "prompt-lookup"

    def __init__(self, max_ngram: int = DEFAULT_MAX_NGRAM) -> None:
        self.max_ngram = max_ngram

    def propose(
        self, contexts: list[list[int]], k: int, params: list[Any], generators: list[Any]
    ) -> list[Draft]:
        return [Draft(lookup_continuation(context, k, self.max_ngram)) for context in contexts]
