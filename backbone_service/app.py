"""FastAPI routes over :class:`moeless.serving.backbone.Backbone`: OpenAI completions and chat completions,
models, vLLM's health, version and tokenizer routes, metrics.

Every error is in OpenAI's shape (:mod:`backbone_service.errors`): a 4xx for anything the client
can fix (bad JSON, a body that is not JSON, a field out of range or of the wrong type, an unknown
model, a prompt too long, a body too large), 429/503 with ``Retry-After`` when the server is full or
stopping.

The event loop only moves bytes: parsing, validation, chat templating and tokenising run in the
thread pool (:mod:`backbone_service.prepare`; a 1 MB prompt takes seconds to tokenise and
``/healthz`` must answer meanwhile). A request's prompts enter the engine all or none, and a client
that hangs up has its sequences cancelled at the next step boundary (no more expert invokes billed
for it).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from backbone_service.errors import EndpointError, install_error_handlers
from backbone_service.metrics import metrics_text
from backbone_service.openapi import BODY_ERRORS, ERROR_RESPONSES, install_openapi
from backbone_service.prepare import Prepared, check_model, prepare_chat, prepare_completion, read_body
from backbone_service.schemas import (
    ChatCompletionResponse,
    CompletionResponse,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeResponse,
    VersionResponse,
)
from backbone_service.shapes import ChatShape, CompletionShape, Shape, TokenLogprobs
from backbone_service.tokens import detokenize, tokenize
from moeless.serving.backbone import Backbone
from moeless.serving.generation import Event, Overloaded, Sequence, ShuttingDown
from moeless.version import __version__

# Server-sent events are a sequence of records, not one JSON value or string: the schema only
# describes them (an unconstrained schema, so that schema checkers do not parse the stream as one).
STREAM_CONTENT = {
    "text/event-stream": {
        "schema": {"description": "one `data: {chunk JSON}` record per event, then `data: [DONE]`"}
    }
}
CLIENT_GONE = -1  # the index of the event that says the client hung up


def create_app(backbone: Backbone) -> FastAPI:
    """The REST app of one loaded backbone."""
    app = FastAPI(title="moeless backbone service", version=__version__)
    app.state.backbone = backbone
    install_error_handlers(app, backbone.stats)
    name = backbone.model_name
    card = {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "moeless",
        "root": name,
        "parent": None,
        "max_model_len": backbone.max_context,
    }

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        active, waiting = backbone.engine.load()
        return {
            "status": "ok",
            "model": name,
            "device": backbone.device,
            "experts": backbone.config.lambda_endpoint or "aws",
            "active": active,
            "waiting": waiting,
        }

    @app.get(
        "/health",
        response_class=Response,
        responses={
            200: {"description": "the server takes requests (an empty body)"},
            503: ERROR_RESPONSES[503],
        },
    )
    async def health() -> Response:
        """vLLM's liveness probe: 200 and no body while the engine takes requests."""
        if backbone.engine.stopping:
            raise EndpointError(503, "the server is shutting down", "shutting_down")
        return Response(status_code=200)

    @app.get("/version", response_model=VersionResponse)
    async def version() -> dict[str, str]:
        return {"version": __version__}

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
        check_model(backbone, model_id)
        return card

    @app.post(
        "/v1/completions",
        response_model=None,
        responses={200: {"model": CompletionResponse, "content": STREAM_CONTENT}, **ERROR_RESPONSES},
    )
    async def completions(request: Request) -> Response:
        raw = await read_body(request, backbone.config.max_body_bytes)
        prepared = await run_in_threadpool(prepare_completion, backbone, raw)
        return await _run(request, backbone, prepared, CompletionShape(name, _spelling(backbone, prepared)))

    @app.post(
        "/v1/chat/completions",
        response_model=None,
        responses={200: {"model": ChatCompletionResponse, "content": STREAM_CONTENT}, **ERROR_RESPONSES},
    )
    async def chat_completions(request: Request) -> Response:
        raw = await read_body(request, backbone.config.max_body_bytes)
        prepared = await run_in_threadpool(prepare_chat, backbone, raw)
        return await _run(request, backbone, prepared, ChatShape(name, _spelling(backbone, prepared)))

    @app.post("/tokenize", response_model=None, responses={200: {"model": TokenizeResponse}, **BODY_ERRORS})
    async def tokenize_route(request: Request) -> Response:
        raw = await read_body(request, backbone.config.max_body_bytes)
        return JSONResponse(await run_in_threadpool(tokenize, backbone, raw))

    @app.post(
        "/detokenize", response_model=None, responses={200: {"model": DetokenizeResponse}, **BODY_ERRORS}
    )
    async def detokenize_route(request: Request) -> Response:
        raw = await read_body(request, backbone.config.max_body_bytes)
        return JSONResponse(await run_in_threadpool(detokenize, backbone, raw))

    install_openapi(app, backbone)
    return app


def _spelling(backbone: Backbone, prepared: Prepared) -> Any | None:
    """The tokenizer that spells the logprobs' tokens; ``None`` when none were asked for."""
    return backbone.tokenizer if prepared.params.logprobs else None


# --- running it (the event loop) -----------------------------------------------------------------


async def _run(request: Request, backbone: Backbone, prepared: Prepared, shape: Shape) -> Response:
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

    async def collect(self, shape: Shape) -> Response:
        texts = [""] * len(self.sequences)
        reasons: list[str | None] = [None] * len(self.sequences)
        logprobs: list[TokenLogprobs] = [[] for _ in self.sequences]
        pending = len(self.sequences)
        while pending:
            index, event = await self.events.get()
            if index == CLIENT_GONE:
                return Response(status_code=499)  # nobody reads it
            logprobs[index] += event.logprobs
            if event.kind == "text":
                texts[index] += event.text
            elif event.kind == "done":
                reasons[index] = event.finish_reason
                pending -= 1
            elif self.backbone.engine.stopping:
                raise EndpointError(503, event.text, "shutting_down")
            else:
                raise EndpointError(500, f"generation failed: {event.text}", "generation_failed")
        return JSONResponse(shape.whole(texts, reasons, logprobs, self.usage()))

    async def stream(self, shape: Shape) -> AsyncIterator[str]:
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
