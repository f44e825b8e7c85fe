"""FastAPI routes over :class:`moeless.serving.backbone.Backbone`: OpenAI completions, health, metrics.

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with a 4xx status
for anything the client can fix (bad JSON, a field out of range, an unknown model, a prompt too
long), 429/503 with ``Retry-After`` when the server is full or stopping.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from backbone_service.metrics import metrics_text
from backbone_service.schemas import CompletionRequest
from moeless.serving.backbone import Backbone
from moeless.serving.generation import Event, Overloaded, SamplingParams, ShuttingDown
from moeless.version import __version__


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


def _error_response(exc: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    kind = "invalid_request_error" if exc.status < 500 else "server_error"
    body = {"error": {"message": str(exc), "type": kind, "param": exc.param, "code": exc.code}}
    return JSONResponse(body, status_code=exc.status, headers=headers)


def _validation_message(error: ValidationError) -> tuple[str, str | None]:
    first = error.errors()[0]
    param = ".".join(str(part) for part in first.get("loc", ())) or None
    return f"{param}: {first['msg']}" if param else first["msg"], param


def create_app(backbone: Backbone) -> FastAPI:
    """The REST app of one loaded backbone."""
    app = FastAPI(title="moeless backbone service", version=__version__)
    app.state.backbone = backbone

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        backbone.stats.inc("requests_invalid" if exc.status < 500 else "requests_failed")
        retry = {"Retry-After": "1"} if exc.status in (429, 503) else None
        return _error_response(exc, retry)

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

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = metrics_text(backbone)
        return Response(body, media_type=content_type)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": backbone.model_name, "object": "model", "owned_by": "moeless"}],
        }

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = _parse(await request.body())
        params, prompts = _check(backbone, body)
        prompts_text = body.prompts()
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        sequences = []
        try:
            for index, prompt_ids in enumerate(prompts):

                def deliver(event: Event, index: int = index) -> None:
                    loop.call_soon_threadsafe(events.put_nowait, (index, event))

                sequences.append(backbone.engine.submit(prompt_ids, params, deliver, prompts_text[index]))
        except Overloaded as exc:
            raise ApiError(429, f"the server is busy ({exc}); retry shortly", "overloaded") from None
        except ShuttingDown as exc:
            raise ApiError(503, str(exc), "shutting_down") from None
        completion_id = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if body.stream:
            return StreamingResponse(
                _stream(events, len(prompts), completion_id, created, backbone.model_name),
                media_type="text/event-stream",
            )
        texts = [""] * len(prompts)
        reasons: list[str | None] = [None] * len(prompts)
        pending = len(prompts)
        while pending:
            index, event = await events.get()
            if event.kind == "text":
                texts[index] += event.text
            elif event.kind == "done":
                reasons[index] = event.finish_reason
                pending -= 1
            else:
                raise ApiError(500, f"generation failed: {event.text}", "generation_failed")
        completion_tokens = sum(len(s.generated) for s in sequences)
        prompt_tokens = sum(len(p) for p in prompts)
        return JSONResponse(
            {
                "id": completion_id,
                "object": "text_completion",
                "created": created,
                "model": backbone.model_name,
                "choices": [
                    {"text": text, "index": i, "logprobs": None, "finish_reason": reasons[i]}
                    for i, text in enumerate(texts)
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )

    return app


def _parse(raw: bytes) -> CompletionRequest:
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8", "invalid_json") from None
    except ValueError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", "invalid_json")
    try:
        return CompletionRequest.model_validate(data)
    except ValidationError as exc:
        message, param = _validation_message(exc)
        raise ApiError(400, message, "invalid_value", param) from None


def _check(backbone: Backbone, body: CompletionRequest) -> tuple[SamplingParams, list[list[int]]]:
    if body.model != backbone.model_name:
        raise ApiError(
            404,
            f"model {body.model!r} is not served here (serving {backbone.model_name!r})",
            "model_not_found",
            "model",
        )
    limit = backbone.config.max_tokens_limit
    if body.max_tokens > limit:
        raise ApiError(
            400,
            f"max_tokens {body.max_tokens} is over this server's limit of {limit}",
            "invalid_value",
            "max_tokens",
        )
    prompts = [backbone.encode(prompt) for prompt in body.prompts()]
    for ids in prompts:
        if not ids:
            raise ApiError(400, "the prompt encodes to no tokens", "invalid_value", "prompt")
        if len(ids) + body.max_tokens > backbone.max_context:
            raise ApiError(
                400,
                f"the prompt is {len(ids)} tokens; with max_tokens {body.max_tokens} it exceeds the model's "
                f"context of {backbone.max_context} tokens",
                "context_length_exceeded",
                "prompt",
            )
    params = SamplingParams(body.max_tokens, body.temperature, body.top_p, body.stops(), body.seed)
    return params, prompts


async def _stream(
    events: asyncio.Queue[tuple[int, Event]], count: int, completion_id: str, created: int, model: str
) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's streaming shape, ending with ``data: [DONE]``."""
    pending = count
    while pending:
        index, event = await events.get()
        if event.kind == "error":
            error = {"error": {"message": f"generation failed: {event.text}", "type": "server_error"}}
            yield f"data: {json.dumps(error)}\n\n"
            break
        finish = event.finish_reason if event.kind == "done" else None
        pending -= event.kind == "done"
        chunk = {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"text": event.text, "index": index, "logprobs": None, "finish_reason": finish}],
        }
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"
