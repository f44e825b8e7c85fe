"""Every error answer in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``.

Routes raise :class:`EndpointError`; the handlers installed by :func:`install_error_handlers` also turn
FastAPI's own answers (unknown path, wrong method) and any unexpected exception into that shape,
and count each one in ``/metrics``: ``invalid`` for what the client can fix, ``failed`` for a 5xx.
429/503 are counted by the engine (``rejected``) and carry ``Retry-After``.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from moeless.serving.stats import ServingStats

log = logging.getLogger("moeless.backbone_service")

RETRY_STATUSES = (429, 503)
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


class EndpointError(Exception):
    """An error answer: ``status``, a one-line ``message``, OpenAI's ``code`` and ``param``."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(exc: EndpointError) -> JSONResponse:
    headers = {"Retry-After": "1"} if exc.status in RETRY_STATUSES else None
    return JSONResponse(
        error_body(exc.status, str(exc), exc.code, exc.param), status_code=exc.status, headers=headers
    )


def install_error_handlers(app: FastAPI, stats: ServingStats) -> None:
    """Answer every error of ``app`` in OpenAI's shape and count it in ``stats``."""

    def counted(exc: EndpointError) -> JSONResponse:
        if exc.status >= 500 and exc.status not in RETRY_STATUSES:
            stats.inc("requests_failed")
        elif exc.status not in RETRY_STATUSES:
            stats.inc("requests_invalid")
        return error_response(exc)

    @app.exception_handler(EndpointError)
    async def _api_error(request: Request, exc: EndpointError) -> JSONResponse:
        return counted(exc)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "HTTP error"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        response = counted(EndpointError(exc.status_code, message, _HTTP_CODES.get(exc.status_code)))
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return counted(
            EndpointError(400, f"{param}: {first['msg']}" if param else first["msg"], "invalid_value")
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return counted(EndpointError(500, f"internal error: {type(exc).__name__}", "internal_error"))
