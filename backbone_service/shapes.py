"""How completions and chat completions spell their answers, whole or as server-sent chunks (the
two routes differ only here), with the sampled tokens' log-probabilities when asked for.

A token is shown as its own decoded text; a token that is part of a multi-byte character shows
as U+FFFD, as in vLLM (its ``bytes`` are those of that text).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from moeless.serving.generation import Event

TokenLogprobs = list[tuple[int, float]]  # (token id, logprob) per sampled token


def _spell(tokenizer: Any, logprobs: TokenLogprobs) -> list[str]:
    """Each token's own text."""
    return [tokenizer.decode([token]) for token, _ in logprobs]


class Shape:
    """One request's answer. ``tokenizer`` spells the logprobs' tokens; ``None``: the request
    asked for no logprobs, and every choice's ``logprobs`` is null."""

    prefix = ""
    kind = ""
    chunk_kind = ""

    def __init__(self, model: str, tokenizer: Any | None) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.id, self.created = f"{self.prefix}-{uuid.uuid4().hex}", int(time.time())

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(
        self,
        texts: list[str],
        reasons: list[str | None],
        logprobs: list[TokenLogprobs],
        usage: dict[str, int],
    ) -> dict[str, Any]:
        choices = [
            self.choice(i, text, reason, self.logprobs(i, tokens))
            for i, (text, reason, tokens) in enumerate(zip(texts, reasons, logprobs, strict=True))
        ]
        return self._head(self.kind) | {"choices": choices, "usage": usage}

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        return self._head(self.chunk_kind) | {"choices": [], "usage": usage}

    def opening(self, index: int) -> dict[str, Any] | None:
        return None

    def choice(self, index: int, text: str, reason: str | None, logprobs: Any) -> dict[str, Any]:
        raise NotImplementedError

    def chunk(self, index: int, event: Event) -> dict[str, Any]:
        raise NotImplementedError

    def logprobs(self, index: int, logprobs: TokenLogprobs) -> dict[str, Any] | None:
        """The ``logprobs`` of choice ``index`` for these tokens (its next ones, when streaming)."""
        raise NotImplementedError


class CompletionShape(Shape):
    prefix, kind, chunk_kind = "cmpl", "text_completion", "text_completion"

    def __init__(self, model: str, tokenizer: Any | None) -> None:
        super().__init__(model, tokenizer)
        self.offsets: dict[int, int] = {}  # per choice: where its next token starts in its text

    def choice(self, index: int, text: str, reason: str | None, logprobs: Any) -> dict[str, Any]:
        return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": reason}

    def chunk(self, index: int, event: Event) -> dict[str, Any]:
        finish = event.finish_reason if event.kind == "done" else None
        choice = self.choice(index, event.text, finish, self.logprobs(index, event.logprobs))
        return self._head(self.chunk_kind) | {"choices": [choice]}

    def logprobs(self, index: int, logprobs: TokenLogprobs) -> dict[str, Any] | None:
        """OpenAI's legacy shape; ``logprobs: 0`` gives each position the sampled token alone."""
        if self.tokenizer is None:
            return None
        tokens, offsets = _spell(self.tokenizer, logprobs), []
        for token in tokens:
            offsets.append(self.offsets.get(index, 0))
            self.offsets[index] = offsets[-1] + len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [logprob for _, logprob in logprobs],
            "top_logprobs": [{token: logprob} for token, (_, logprob) in zip(tokens, logprobs, strict=True)],
            "text_offset": offsets,
        }


class ChatShape(Shape):
    prefix, kind, chunk_kind = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def choice(self, index: int, text: str, reason: str | None, logprobs: Any) -> dict[str, Any]:
        message = {"role": "assistant", "content": text}
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": reason}

    def opening(self, index: int) -> dict[str, Any]:
        delta = {"role": "assistant", "content": ""}
        return self._head(self.chunk_kind) | {
            "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]
        }

    def chunk(self, index: int, event: Event) -> dict[str, Any]:
        done = event.kind == "done"
        delta = {} if done else {"content": event.text}
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": self.logprobs(index, event.logprobs),
            "finish_reason": event.finish_reason if done else None,
        }
        return self._head(self.chunk_kind) | {"choices": [choice]}

    def logprobs(self, index: int, logprobs: TokenLogprobs) -> dict[str, Any] | None:
        """``top_logprobs: 0``: no alternatives."""
        if self.tokenizer is None:
            return None
        content = [
            {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}
            for token, (_, logprob) in zip(_spell(self.tokenizer, logprobs), logprobs, strict=True)
        ]
        return {"content": content}
