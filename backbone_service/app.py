"""FastAPI routes over :class:`moeless.serving.backbone.Backbone`: OpenAI completions and chat completions,
models, health, metrics.

Every error is in OpenAI's shape (:mod:`backbone_service.errors`): a 4xx for anything the client
can fix (bad JSON, a field out of range or of the wrong type, an unknown model, a prompt too
long, a body too large), 429/503 with ``Retry-After`` when the server is full or stopping.

The event loop only moves bytes: parsing, validation, chat templating and tokenising run in the
thread pool (a 1 MB prompt takes seconds to tokenise; ``/healthz`` must answer meanwhile). A
request's prompts enter the engine all or none, and a client that hangs up has its sequences
cancelled at the next step boundary (no more expert invokes billed for it).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from backbone_service.errors import EndpointError, install_error_handlers
from backbone_service.metrics import metrics_text
from backbone_service.openapi import ERROR_RESPONSES, install_openapi
from backbone_service.schemas import (
    DEFAULT_MAX_TOKENS,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from moeless.model.chat_template import render_chat
from moeless.serving.backbone import Backbone
from moeless.serving.generation import Event, Overloaded, SamplingParams, Sequence, ShuttingDown
from moeless.version import __version__

# Server-sent events are a sequence of records, not one JSON value or string: the schema only
# describes them (an unconstrained schema, so that schema checkers do not parse the stream as one).
STREAM_CONTENT = {
    "text/event-stream": {
        "schema": {"description": "one `data: {chunk JSON}` record per event, then `data: [DONE]`"}
    }
}
CLIENT_GONE = -1  # the index of the event that says the client hung up


@dataclass
class Prepared:
    """A validated request, ready for the engine: one ``(prompt_ids, prompt_text)`` per prompt."""

    body: CompletionRequest | ChatCompletionRequest
    prompts: list[tuple[list[int], str]]
    params: SamplingParams


def create_app(backbone: Backbone) -> FastAPI:
    """The REST app of one loaded backbone."""
    app = FastAPI(title="moeless backbone service", version=__version__)
    app.state.backbone = backbone
    install_error_handlers(app, backbone.stats)
    created = int(time.time())
    card = {"id": backbone.model_name, "object": "model", "created": created, "owned_by": "moeless"}

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        active, waiting = backbone.engine.load()
        return {
            "status": "ok",
            "model": backbone.model_name,
            "device": backbone.device,
            "experts": backbone.config.lambda_endpoint or "aws",
            "active": active,
            "waiting": waiting,
        }

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def metrics() -> Response:
        body, content_type = metrics_text(backbone)
        return Response(body, media_type=content_type)

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model_id}", response_model=ModelCard, responses={404: ERROR_RESPONSES[404]})
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != backbone.model_name:
            raise EndpointError(404, _not_served(backbone, model_id), "model_not_found", "model")
        return card

    @app.post(
        "/v1/completions",
        response_model=None,
        responses={200: {"model": CompletionResponse, "content": STREAM_CONTENT}, **ERROR_RESPONSES},
    )
    async def completions(request: Request) -> Response:
        raw = await read_body(request, backbone.config.max_body_bytes)
        prepared = await run_in_threadpool(prepare_completion, backbone, raw)
        return await _run(request, backbone, prepared, _CompletionShape(backbone.model_name))

    @app.post(
        "/v1/chat/completions",
        response_model=None,
        responses={200: {"model": ChatCompletionResponse, "content": STREAM_CONTENT}, **ERROR_RESPONSES},
    )
    async def chat_completions(request: Request) -> Response:
        raw = await read_body(request, backbone.config.max_body_bytes)
        prepared = await run_in_threadpool(prepare_chat, backbone, raw)
        return await _run(request, backbone, prepared, _ChatShape(backbone.model_name))

    install_openapi(app, backbone)
    return app


# --- reading and checking a request (the thread pool) ----------------------------------------------


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is over ``limit`` bytes (never read whole)."""
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


def parse_body(raw: bytes, model: type[BaseModel]) -> Any:
    """``raw`` as a validated ``model``; every way it can be wrong is a 400 with a reason."""
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
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = str(first["loc"][0]) if first.get("loc") else None
        raise EndpointError(
            400, f"{param}: {first['msg']}" if param else first["msg"], "invalid_value", param
        ) from None


def _not_served(backbone: Backbone, name: str) -> str:
    return f"model {name!r} is not served here (serving {backbone.model_name!r})"


def _check_common(backbone: Backbone, body: CompletionRequest | ChatCompletionRequest) -> SamplingParams:
    if body.model != backbone.model_name:
        raise EndpointError(404, _not_served(backbone, body.model), "model_not_found", "model")
    limit = backbone.config.max_tokens_limit
    max_tokens = body.completion_limit or min(DEFAULT_MAX_TOKENS, limit)
    if max_tokens > limit:
        raise EndpointError(
            400,
            f"max_tokens {max_tokens} is over this server's limit of {limit}",
            "invalid_value",
            "max_tokens",
        )
    return SamplingParams(max_tokens, body.temperature, body.top_p, body.stops(), body.seed)


def _check_length(backbone: Backbone, ids: list[int], max_tokens: int, param: str) -> None:
    if not ids:
        raise EndpointError(400, "the prompt encodes to no tokens", "invalid_value", param)
    if len(ids) + max_tokens > backbone.max_context:
        raise EndpointError(
            400,
            f"the prompt is {len(ids)} tokens; with max_tokens {max_tokens} it exceeds the model's "
            f"context of {backbone.max_context} tokens",
            "context_length_exceeded",
            param,
        )


def prepare_completion(backbone: Backbone, raw: bytes) -> Prepared:
    body: CompletionRequest = parse_body(raw, CompletionRequest)
    params = _check_common(backbone, body)
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
            if bad := [i for i in entry if i >= backbone.vocab_size]:
                raise EndpointError(
                    400,
                    f"token id {bad[0]} is outside the vocabulary of {backbone.vocab_size}",
                    "invalid_value",
                    "prompt",
                )
            ids, text = entry, backbone.tokenizer.decode(entry, skip_special_tokens=True)
        _check_length(backbone, ids, params.max_tokens, "prompt")
        prompts.append((ids, text))
    return Prepared(body, prompts, params)


def prepare_chat(backbone: Backbone, raw: bytes) -> Prepared:
    body: ChatCompletionRequest = parse_body(raw, ChatCompletionRequest)
    params = _check_common(backbone, body)
    text = render_chat(backbone.tokenizer, [{"role": m.role, "content": m.text()} for m in body.messages])
    ids = backbone.encode(text, add_special_tokens=False)
    _check_length(backbone, ids, params.max_tokens, "messages")
    return Prepared(body, [(ids, text)], params)


# --- running it (the event loop) -----------------------------------------------------------------


async def _run(request: Request, backbone: Backbone, prepared: Prepared, shape: _Shape) -> Response:
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

    def deliver(index: int, event: Event) -> None:
        loop.call_soon_threadsafe(events.put_nowait, (index, event))

    try:
        sequences = await run_in_threadpool(
            backbone.engine.submit_all, prepared.prompts, prepared.params, deliver
        )
    except Overloaded as exc:
        raise EndpointError(429, f"the server is busy ({exc}); retry shortly", "overloaded") from None
    except ShuttingDown as exc:
        raise EndpointError(503, str(exc), "shutting_down") from None
    watcher = asyncio.create_task(_watch_disconnect(request, events))
    run = _Run(backbone, prepared, sequences, events, watcher)
    if prepared.body.stream:
        return StreamingResponse(run.stream(shape), media_type="text/event-stream")
    try:
        return await run.collect(shape)
    finally:
        run.close()


async def _watch_disconnect(request: Request, events: asyncio.Queue[tuple[int, Event]]) -> None:
    """Tell the request's reader when the client hangs up (the body was read: only
    ``http.disconnect`` can come next)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    events.put_nowait((CLIENT_GONE, Event("cancelled")))


class _Run:
    """One admitted request: reads its sequences' events, cancels what is left when it ends."""

    def __init__(
        self,
        backbone: Backbone,
        prepared: Prepared,
        sequences: list[Sequence],
        events: asyncio.Queue[tuple[int, Event]],
        watcher: asyncio.Task,
    ) -> None:
        self.backbone, self.prepared, self.sequences = backbone, prepared, sequences
        self.events, self.watcher = events, watcher

    def close(self) -> None:
        """Cancel the sequences still running (the client left, or the request failed)."""
        self.watcher.cancel()
        self.backbone.engine.cancel(self.sequences)

    def usage(self) -> dict[str, int]:
        prompt = sum(len(ids) for ids, _ in self.prepared.prompts)
        completion = sum(len(s.generated) for s in self.sequences)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def collect(self, shape: _Shape) -> Response:
        texts = [""] * len(self.sequences)
        reasons: list[str | None] = [None] * len(self.sequences)
        pending = len(self.sequences)
        while pending:
            index, event = await self.events.get()
            if index == CLIENT_GONE:
                return Response(status_code=499)  # nobody reads it
            if event.kind == "text":
                texts[index] += event.text
            elif event.kind == "done":
                reasons[index] = event.finish_reason
                pending -= 1
            elif self.backbone.engine.stopping:
                raise EndpointError(503, event.text, "shutting_down")
            else:
                raise EndpointError(500, f"generation failed: {event.text}", "generation_failed")
        return JSONResponse(shape.whole(texts, reasons, self.usage()))

    async def stream(self, shape: _Shape) -> AsyncIterator[str]:
        """Server-sent events in OpenAI's streaming shape, ending with ``data: [DONE]``."""
        include_usage = self.prepared.body.include_usage
        try:
            for index in range(len(self.sequences)):
                if first := shape.opening(index):
                    yield _sse(first, include_usage)
            pending = len(self.sequences)
            while pending:
                index, event = await self.events.get()
                if index == CLIENT_GONE:
                    return
                if event.kind == "error":
                    message = f"generation failed: {event.text}"
                    yield _sse(
                        {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
                    )
                    break
                pending -= event.kind == "done"
                yield _sse(shape.chunk(index, event), include_usage)
            else:
                if include_usage:
                    yield _sse(shape.usage_chunk(self.usage()))
            yield "data: [DONE]\n\n"
        finally:
            self.close()


def _sse(chunk: dict[str, Any], include_usage: bool = False) -> str:
    if include_usage and "usage" not in chunk:
        chunk["usage"] = None
    return f"data: {json.dumps(chunk)}\n\n"


class _Shape:
    """How one route spells its answers (completions and chat completions differ only here)."""

    prefix = ""
    kind = ""
    chunk_kind = ""

    def __init__(self, model: str) -> None:
        self.model, self.id, self.created = model, f"{self.prefix}-{uuid.uuid4().hex}", int(time.time())

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, texts: list[str], reasons: list[str | None], usage: dict[str, int]) -> dict[str, Any]:
        choices = [
            self.choice(i, text, reason) for i, (text, reason) in enumerate(zip(texts, reasons, strict=True))
        ]
        return self._head(self.kind) | {"choices": choices, "usage": usage}

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        return self._head(self.chunk_kind) | {"choices": [], "usage": usage}

    def opening(self, index: int) -> dict[str, Any] | None:
        return None

    def choice(self, index: int, text: str, reason: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def chunk(self, index: int, event: Event) -> dict[str, Any]:
        raise NotImplementedError


class _CompletionShape(_Shape):
    prefix, kind, chunk_kind = "cmpl", "text_completion", "text_completion"

    def choice(self, index: int, text: str, reason: str | None) -> dict[str, Any]:
        return {"text": text, "index": index, "logprobs": None, "finish_reason": reason}

    def chunk(self, index: int, event: Event) -> dict[str, Any]:
        finish = event.finish_reason if event.kind == "done" else None
        return self._head(self.chunk_kind) | {"choices": [self.choice(index, event.text, finish)]}


class _ChatShape(_Shape):
    prefix, kind, chunk_kind = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def choice(self, index: int, text: str, reason: str | None) -> dict[str, Any]:
        message = {"role": "assistant", "content": text}
        return {"index": index, "message": message, "logprobs": None, "finish_reason": reason}

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
            "logprobs": None,
            "finish_reason": event.finish_reason if done else None,
        }
        return self._head(self.chunk_kind) | {"choices": [choice]}
