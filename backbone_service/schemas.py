"""Request and response bodies of the OpenAI routes, and their validation.

Validation is strict (``"max_tokens": "3"``, ``true`` or ``2.0`` is refused, not coerced), unknown
fields are refused, and fields OpenAI has but this server does not implement are accepted only
at their neutral value: a client never gets a silently different answer than it asked for.
The same models document the bodies in ``/openapi.json``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# torch.Generator.manual_seed takes a signed 64-bit seed
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1

DEFAULT_MAX_TOKENS = 16


def _must_be_false(name: str, value: bool) -> bool:
    if value:
        raise ValueError(f"{name} is not supported")
    return value


NonEmpty = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = Field(False, description="send a last chunk with the usage and no choices")


class _Sampling(_Strict):
    """The fields completions and chat completions share."""

    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: NonEmpty | Annotated[list[NonEmpty], Field(max_length=4)] | None = Field(
        None, description="up to 4 non-empty strings"
    )
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="used with stream: true")
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    n: int = Field(1, ge=1, le=1, description="one completion per prompt")
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0, description="not supported: must be 0")
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0, description="not supported: must be 0")
    user: str | None = Field(None, max_length=256)

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: a prompt, a list of prompts, or token ids (one list or several)."""

    prompt: (
        NonEmpty
        | Annotated[list[NonEmpty], Field(min_length=1)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1)]
    ) = Field(description="text, a list of texts, a list of token ids, or a list of such lists")
    max_tokens: int | None = Field(
        None, ge=1, description=f"default {DEFAULT_MAX_TOKENS} (or the server's limit)"
    )
    echo: bool = Field(False, description="not supported: must be false", json_schema_extra={"enum": [False]})
    logprobs: int | None = Field(None, ge=0, le=0, description="not supported: null or 0")

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        return _must_be_false("echo", value)

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: its text, or its token ids."""
        value = self.prompt
        if isinstance(value, str):
            return [value]
        if all(isinstance(p, int) for p in value):
            return [list(value)]  # type: ignore[arg-type]
        return list(value)  # type: ignore[arg-type]

    @property
    def completion_limit(self) -> int | None:
        return self.max_tokens


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``: messages rendered with the tokenizer's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, description="deprecated by OpenAI: max_completion_tokens")
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = Field(
        False, description="not supported: must be false", json_schema_extra={"enum": [False]}
    )

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: bool) -> bool:
        return _must_be_false("logprobs", value)

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


# --- responses (documentation of /openapi.json; the routes build plain dicts) -----------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error, whatever the route: OpenAI's shape."""

    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]
