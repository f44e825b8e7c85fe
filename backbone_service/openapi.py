"""``/openapi.json``: the request bodies and every error answer, as the server checks them.

The POST routes read their bodies themselves (off the event loop, with a size limit), so FastAPI
cannot see the body models: they are added here from the pydantic models that validate them,
narrowed to this server (the served model's name, the ``max_tokens`` limit, the vocabulary), so
that a request valid by the document is one the server accepts, apart from a prompt too long for
the context, which no schema can say.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from backbone_service.schemas import ChatCompletionRequest, CompletionRequest, ErrorResponse
from moeless.serving.backbone import Backbone

REQUEST_BODIES = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "malformed or invalid request"},
    404: {"model": ErrorResponse, "description": "the model is not served here"},
    413: {"model": ErrorResponse, "description": "the request body is over the size limit"},
    429: {"model": ErrorResponse, "description": "the server is busy: retry after Retry-After seconds"},
    500: {"model": ErrorResponse, "description": "generation failed"},
    503: {"model": ErrorResponse, "description": "the server is shutting down"},
}


def install_openapi(app: FastAPI, backbone: Backbone) -> None:
    """Replace ``app.openapi`` with one that documents the request bodies."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app, backbone)
        return app.openapi_schema

    app.openapi = openapi


def _document(app: FastAPI, backbone: Backbone) -> dict[str, Any]:
    document = get_openapi(title=app.title, version=app.version, routes=app.routes)
    _, top = models_json_schema(
        [(model, "validation") for model in REQUEST_BODIES.values()],
        ref_template="#/components/schemas/{model}",
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(top["$defs"])
    for path, model in REQUEST_BODIES.items():
        document["paths"][path]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
        properties = schemas[model.__name__]["properties"]
        properties["model"]["enum"] = [backbone.model_name]
        for field in ("max_tokens", "max_completion_tokens"):
            if field in properties:
                _bound_integers(properties[field], backbone.config.max_tokens_limit)
    _bound_integers(schemas[CompletionRequest.__name__]["properties"]["prompt"], backbone.vocab_size - 1)
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
