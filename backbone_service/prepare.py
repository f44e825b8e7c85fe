"""Reading and checking a request body, in the thread pool: JSON content type and size limit, strict
validation, the served model, token ids, chat templating, tokenising and the context.

Each way a body can be wrong is an :class:`~backbone_service.errors.EndpointError` whose message
names the field as a path into the body (``messages[1].role``) and says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from backbone_service.errors import EndpointError
from backbone_service.schemas import (
    DEFAULT_MAX_TOKENS,
    UNSUPPORTED,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
)
from moeless.model.chat_template import render_chat
from moeless.serving.backbone import Backbone
from moeless.serving.generation import SamplingParams

JSON = "application/json"


@dataclass
class Prepared:
    """A validated request, ready for the engine: one ``(prompt_ids, prompt_text)`` per prompt."""

    body: CompletionRequest | ChatCompletionRequest
    prompts: list[tuple[list[int], str]]
    params: SamplingParams


# --- the body ------------------------------------------------------------------------------------


async def read_body(request: Request, limit: int) -> bytes:
    """The body of a JSON request (415 for another content type), refused with 413 as soon as it
    is over ``limit`` bytes (never read whole)."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != JSON:
        shown = f"{media_type!r}" if media_type else "none"
        raise EndpointError(
            415, f"the request body must be {JSON} (Content-Type: {shown})", "unsupported_media_type"
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise EndpointError(
            413, f"the request body is {declared} bytes; the limit is {limit}", "request_too_large"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise EndpointError(
                413, f"the request body is over the limit of {limit} bytes", "request_too_large"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def read_json(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object; every way it is not one is a 400 with a reason."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise EndpointError(400, "the request body is not UTF-8", "invalid_json") from None
    except RecursionError:
        raise EndpointError(400, "the request body is nested too deeply", "invalid_json") from None
    except ValueError as exc:
        raise EndpointError(400, f"the request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(data, dict):
        raise EndpointError(400, "the request body must be a JSON object", "invalid_json")
    try:  # "\ud800" is valid JSON, but no UTF-8 text: the tokenizer would fail on it
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise EndpointError(
            400, "a string in the request body has a lone surrogate (\\ud800-\\udfff)", "invalid_value"
        ) from None
    return data


def validate(data: dict[str, Any], model: type[BaseModel]) -> Any:
    """``data`` as a ``model``, or a 400 naming the field and saying why: a refusal of ours
    (:func:`backbone_service.schemas.unsupported`) before pydantic's first error."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        first = next((e for e in errors if e["type"] == UNSUPPORTED), errors[0])
        param = field_path(data, first["loc"], first["type"] == "missing") or None
        raise EndpointError(
            400, f"{param}: {first['msg']}" if param else first["msg"], "invalid_value", param
        ) from None


def parse_body(raw: bytes, model: type[BaseModel]) -> Any:
    """``raw`` as a validated ``model``."""
    return validate(read_json(raw), model)


def field_path(data: Any, loc: tuple[int | str, ...], missing: bool = False) -> str:
    """pydantic's error location as a path into ``data``, ``messages[0].content[1].type``.

    pydantic puts the member of a union it tried into the location (``content``, ``str``): only
    the keys and indexes found in ``data`` are kept, and the last key of a ``missing`` field.
    """
    path, node, last = "", data, len(loc) - 1
    for depth, key in enumerate(loc):
        if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            path, node = f"{path}[{key}]", node[key]
        elif isinstance(node, dict) and (key in node or (missing and depth == last)):
            path, node = f"{path}.{key}" if path else str(key), node.get(key)
    return path


# --- the served model, lengths, token ids ---------------------------------------------------------


def check_model(backbone: Backbone, name: str | None) -> None:
    """404 unless ``name`` is the served model (``None``: the request need not say)."""
    if name is not None and name != backbone.model_name:
        message = f"model {name!r} is not served here (serving {backbone.model_name!r})"
        raise EndpointError(404, message, "model_not_found", "model")


def check_vocabulary(backbone: Backbone, ids: list[int], param: str) -> None:
    if bad := [i for i in ids if i >= backbone.vocab_size]:
        raise EndpointError(
            400,
            f"token id {bad[0]} is outside the vocabulary of {backbone.vocab_size}",
            "invalid_value",
            param,
        )


def _requested_max_tokens(backbone: Backbone, body: CompletionRequest | ChatCompletionRequest) -> int | None:
    limit = backbone.config.max_tokens_limit
    if body.completion_limit is not None and body.completion_limit > limit:
        raise EndpointError(
            400,
            f"max_tokens {body.completion_limit} is over this server's limit of {limit}",
            "invalid_value",
            "max_tokens",
        )
    return body.completion_limit


def _rest_of_context(backbone: Backbone, ids: list[int], param: str) -> int:
    """Chat's default ``max_tokens``, as vLLM's: the context the prompt leaves, within the limit."""
    room = backbone.max_context - len(ids)
    if room < 1:
        raise EndpointError(
            400,
            f"the prompt is {len(ids)} tokens; it leaves no room in the model's context of "
            f"{backbone.max_context} tokens",
            "context_length_exceeded",
            param,
        )
    return min(room, backbone.config.max_tokens_limit)


def _check_length(backbone: Backbone, ids: list[int], max_tokens: int, param: str) -> None:
    if len(ids) + max_tokens > backbone.max_context:
        raise EndpointError(
            400,
            f"the prompt is {len(ids)} tokens; with max_tokens {max_tokens} it exceeds the model's "
            f"context of {backbone.max_context} tokens",
            "context_length_exceeded",
            param,
        )


def _check_nonempty(ids: list[int], param: str) -> None:
    if not ids:
        raise EndpointError(400, "the prompt encodes to no tokens", "invalid_value", param)


def _sampling(body: CompletionRequest | ChatCompletionRequest, max_tokens: int) -> SamplingParams:
    return SamplingParams(
        max_tokens, body.temperature, body.top_p, body.stops(), body.seed, logprobs=body.wants_logprobs
    )


# --- the two generation routes --------------------------------------------------------------------


def prepare_completion(backbone: Backbone, raw: bytes) -> Prepared:
    body: CompletionRequest = parse_body(raw, CompletionRequest)
    check_model(backbone, body.model)
    requested = _requested_max_tokens(backbone, body)
    max_tokens = requested or min(DEFAULT_MAX_TOKENS, backbone.config.max_tokens_limit)
    entries = body.prompts()
    limit = backbone.config.max_prompts
    if len(entries) > limit:
        raise EndpointError(
            400,
            f"prompt has {len(entries)} prompts; this server takes at most {limit}",
            "invalid_value",
            "prompt",
        )
    prompts = []
    for entry in entries:
        if isinstance(entry, str):
            ids, text = backbone.encode(entry), entry
        else:
            check_vocabulary(backbone, entry, "prompt")
            ids, text = entry, backbone.tokenizer.decode(entry, skip_special_tokens=True)
        _check_nonempty(ids, "prompt")
        _check_length(backbone, ids, max_tokens, "prompt")
        prompts.append((ids, text))
    return Prepared(body, prompts, _sampling(body, max_tokens))


def chat_prompt(backbone: Backbone, messages: list[ChatMessage]) -> str:
    """The prompt of a chat: its messages in the tokenizer's chat template, ready for the reply."""
    return render_chat(backbone.tokenizer, [{"role": m.role, "content": m.text()} for m in messages])


def prepare_chat(backbone: Backbone, raw: bytes) -> Prepared:
    body: ChatCompletionRequest = parse_body(raw, ChatCompletionRequest)
    check_model(backbone, body.model)
    requested = _requested_max_tokens(backbone, body)
    text = chat_prompt(backbone, body.messages)
    ids = backbone.encode(text, add_special_tokens=False)
    _check_nonempty(ids, "messages")
    max_tokens = requested or _rest_of_context(backbone, ids, "messages")
    _check_length(backbone, ids, max_tokens, "messages")
    return Prepared(body, [(ids, text)], _sampling(body, max_tokens))
