"""``/openapi.json``: the request bodies and every error answer, as the server checks them.

The POST routes read their bodies themselves (off the event loop, with a size limit), so FastAPI
cannot see the body models: they are added here from the pydantic models that validate them,
narrowed to this server (the served model's name; ``max_tokens`` within the server's limit and
the context less one prompt token; token ids within the vocabulary), so that a request valid by
the document is one the server accepts, apart from a prompt too long for the context, which no
schema can say.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from backbone_service.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ErrorResponse,
    TokenizeChatRequest,
    TokenizePromptRequest,
)
from moeless.serving.backbone import Backbone

# path -> the bodies it takes (several: any one of them)
REQUEST_BODIES: dict[str, list[type[BaseModel]]] = {
    "/v1/completions": [CompletionRequest],
    "/v1/chat/completions": [ChatCompletionRequest],
    "/tokenize": [TokenizePromptRequest, TokenizeChatRequest],
    "/detokenize": [DetokenizeRequest],
}

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "malformed or invalid request"},
    404: {"model": ErrorResponse, "description": "the model is not served here"},
    413: {"model": ErrorResponse, "description": "the request body is over the size limit"},
    415: {"model": ErrorResponse, "description": "the request body is not application/json"},
    429: {"model": ErrorResponse, "description": "the server is busy: retry after Retry-After seconds"},
    500: {"model": ErrorResponse, "description": "generation failed"},
    503: {"model": ErrorResponse, "description": "the server is shutting down"},
}
# the routes that read a body and generate nothing
BODY_ERRORS = {status: ERROR_RESPONSES[status] for status in (400, 404, 413, 415)}


def install_openapi(app: FastAPI, backbone: Backbone) -> None:
    """Replace ``app.openapi`` with one that documents the request bodies."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app, backbone)
        return app.openapi_schema

    app.openapi = openapi


def _document(app: FastAPI, backbone: Backbone) -> dict[str, Any]:
    document = get_openapi(title=app.title, version=app.version, routes=app.routes)
    models = [model for bodies in REQUEST_BODIES.values() for model in bodies]
    _, top = models_json_schema(
        [(model, "validation") for model in models], ref_template="#/components/schemas/{model}"
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(top["$defs"])
    for path, bodies in REQUEST_BODIES.items():
        refs = [{"$ref": f"#/components/schemas/{model.__name__}"} for model in bodies]
        document["paths"][path]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": refs[0] if len(refs) == 1 else {"anyOf": refs}}},
        }
    max_tokens = min(backbone.config.max_tokens_limit, backbone.max_context - 1)
    for model in models:
        properties = schemas[model.__name__]["properties"]
        model_name = properties["model"]
        model_name["enum"] = (
            [backbone.model_name] if "default" not in model_name else [backbone.model_name, None]
        )
        for field in ("max_tokens", "max_completion_tokens"):
            if field in properties:
                _bound_integers(properties[field], max_tokens)
    _bound_integers(schemas[CompletionRequest.__name__]["properties"]["prompt"], backbone.vocab_size - 1)
    _bound_integers(schemas[DetokenizeRequest.__name__]["properties"]["tokens"], backbone.vocab_size - 1)
    return document


def _bound_integers(schema: Any, maximum: int) -> None:
    """Give every integer in ``schema`` (anyOf and array items included) the upper bound ``maximum``."""
    if isinstance(schema, dict):
        if schema.get("type") == "integer":
            schema["maximum"] = maximum
        for value in schema.values():
            _bound_integers(value, maximum)
    elif isinstance(schema, list):
        for value in schema:
            _bound_integers(value, maximum)
