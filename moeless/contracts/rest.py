"""The REST contract between the backbone service and the API Gateway in front of it: every public
route the service answers, so that the gateway routes each of them and none is left to
API Gateway's 403 (``tests/deployment/test_rest_routes.py`` holds both sides to this list).

Left off on purpose: ``/metrics`` (operators scrape it inside the VPC; request counts and costs
are not the public's business) and FastAPI's ``/docs``, ``/redoc`` and ``/openapi.json`` (a
browser UI and its spec, served to whoever runs the service locally).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # FastAPI's form: ``/v1/models/{model_id}``
    body: str | None = None  # the JSON body's kind, checked at the gateway: "completion", "chat"
    streams: bool = False  # may answer server-sent events


PUBLIC_ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/completions", body="completion", streams=True),
    Route("POST", "/v1/chat/completions", body="chat", streams=True),
    Route("GET", "/v1/models"),
    Route("GET", "/v1/models/{model_id}"),
    Route("POST", "/tokenize"),
    Route("POST", "/detokenize"),
    Route("GET", "/healthz"),
    Route("GET", "/health"),
    Route("GET", "/version"),
)

PRIVATE_PATHS = ("/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
"""Paths the service answers that the gateway does not route (see the module's docstring)."""
