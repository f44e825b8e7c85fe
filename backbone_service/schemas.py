"""Request and response bodies of the OpenAI routes and of vLLM's tokenizer routes, and their
validation.

Validation is strict (``"max_tokens": "3"``, ``true`` or ``2.5`` is refused, not coerced; ``2.0``
is the integer 2, as in JSON Schema) and unknown fields are refused. Fields OpenAI has but this
server does not implement are accepted at their neutral value, which is what clients written for
vLLM send (``best_of: 1``, ``store: false``), and refused otherwise with a reason (:func:`only`):
a client never gets a silently different answer than it asked for. The same models document the
bodies in ``/openapi.json``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

# torch.Generator.manual_seed takes a signed 64-bit seed
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1

# /v1/completions' default length, as OpenAI and vLLM have it; chat's default is the rest of the
# context (vLLM's), within the server's max_tokens limit
DEFAULT_MAX_TOKENS = 16

# why a value other than the neutral one is refused
ONE_COMPLETION = "this server returns one completion per prompt"
NO_PENALTIES = "penalties are not supported: must be 0"
NO_ALTERNATIVES = "only 0 is supported: the sampled tokens' log-probabilities, without alternatives"
NO_TOOLS = "this server calls no tools"
ONLY_NO_TOOLS = f'only "none" is supported: {NO_TOOLS}'
ONLY_TEXT = 'only {"type": "text"} is supported: this server does not constrain its output'

UNSUPPORTED = "unsupported"  # the pydantic error type whose message says why a value is refused


def unsupported(reason: str) -> PydanticCustomError:
    """A refusal that says why (preferred over pydantic's other errors on the same body)."""
    return PydanticCustomError(UNSUPPORTED, "{reason}", {"reason": reason})


def _json_equal(value: Any, expected: Any) -> bool:
    """Equal as JSON values: ``true`` is not ``1`` (Python says it is), ``0.0`` is ``0``."""
    if isinstance(value, bool) or isinstance(expected, bool):
        return value is expected
    return bool(value == expected)


def only(accepted: Any, reason: str) -> BeforeValidator:
    """A field OpenAI has whose other values this server cannot honour: ``accepted`` (and null,
    where the field's type allows it) passes, anything else is refused with ``reason``, so that a
    client never gets a silently different answer than it asked for."""

    def check(value: Any) -> Any:
        if value is None or _json_equal(value, accepted):
            return value
        raise unsupported(reason)

    return BeforeValidator(check)


def _no_tool_turns(role: Any) -> Any:
    if role in ("tool", "function"):
        raise unsupported(f"{role} turns are not supported: {NO_TOOLS}")
    return role


def _text_parts_only(kind: Any) -> Any:
    if isinstance(kind, str) and kind != "text":
        raise unsupported(f'this model serves text only: a content part\'s type must be "text", not "{kind}"')
    return kind


def _integral(value: Any) -> Any:
    """``2.0`` is the integer 2 as JSON and JSON Schema (the language of /openapi.json) have it,
    and vLLM takes it; ``2.5``, ``"2"`` and ``true`` are still refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# (the bounds come before the validator: so /openapi.json spells them minimum and maximum)
Count = Annotated[int, Field(ge=1), BeforeValidator(_integral)]
TokenId = Annotated[int, Field(ge=0), BeforeValidator(_integral)]
Seed = Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX), BeforeValidator(_integral)]
NonEmpty = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = Field(False, description="send a last chunk with the usage and no choices")


class _Sampling(_Strict):
    """The fields completions and chat completions share."""

    # what the stream_options validator says, for /openapi.json
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
            "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
        }
    )

    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: NonEmpty | Annotated[list[NonEmpty], Field(max_length=4)] | None = Field(
        None, description="up to 4 non-empty strings"
    )
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    seed: Seed | None = None
    n: Annotated[Literal[1], only(1, ONE_COMPLETION)] = 1
    presence_penalty: Annotated[float, Field(ge=0.0, le=0.0), only(0, NO_PENALTIES)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=0.0, le=0.0), only(0, NO_PENALTIES)] = 0.0
    user: str | None = Field(None, max_length=256)

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if value is not None and info.data.get("stream") is not True:
            raise PydanticCustomError(
                "invalid_value", "Stream options can only be defined when `stream=True`."
            )
        return value

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
    max_tokens: Count | None = Field(None, description=f"default {DEFAULT_MAX_TOKENS}")
    echo: Annotated[Literal[False], only(False, "echo is not supported: the prompt is not repeated")] = False
    logprobs: Annotated[Literal[0] | None, only(0, NO_ALTERNATIVES)] = Field(
        None, description="0: each sampled token's log-probability (no alternatives)"
    )
    best_of: Annotated[Literal[1] | None, only(1, ONE_COMPLETION)] = None

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

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None


class TextPart(_Strict):
    type: Annotated[Literal["text"], BeforeValidator(_text_parts_only)]
    text: str


class ChatMessage(_Strict):
    role: Annotated[Literal["system", "developer", "user", "assistant"], BeforeValidator(_no_tool_turns)]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(_Strict):
    type: Literal["text"]


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``: messages rendered with the tokenizer's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Count | None = Field(None, description="deprecated by OpenAI: max_completion_tokens")
    max_completion_tokens: Count | None = Field(
        None, description="default: the rest of the context (within the server's limit)"
    )
    logprobs: bool | None = Field(False, description="each sampled token's log-probability")
    top_logprobs: Annotated[Literal[0] | None, only(0, NO_ALTERNATIVES)] = None
    response_format: Annotated[ResponseFormat | None, only({"type": "text"}, ONLY_TEXT)] = None
    tool_choice: Annotated[Literal["none"] | None, only("none", ONLY_NO_TOOLS)] = None
    parallel_tool_calls: bool | None = Field(None, description=f"no effect: {NO_TOOLS}")
    store: Annotated[Literal[False] | None, only(False, "this server does not store completions")] = None

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)


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


class CompletionLogprobs(BaseModel):
    """Per sampled token: its text, log-probability, itself as the only "top" entry, and where it
    starts in the choice's text."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: CompletionLogprobs | None = None
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


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[dict[str, Any]] = Field(description="always empty: no alternatives")


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    """vLLM's model card: OpenAI's, with the context length and the model it derives from."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: str | None
    max_model_len: int = Field(description="the model's context: prompt and completion tokens together")


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


# --- vLLM's tokenizer routes ------------------------------------------------------------------


class TokenizePromptRequest(_Strict):
    """``POST /tokenize`` of a prompt: its tokens as ``/v1/completions`` counts them."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


class TokenizeChatRequest(_Strict):
    """``POST /tokenize`` of a chat: its templated prompt's tokens, as ``/v1/chat/completions``
    counts them."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_special_tokens: bool = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[TokenId]


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str
