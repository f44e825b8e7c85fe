"""The caller's side of the local host: Lambda's REST API on 127.0.0.1, as boto3 speaks it.

Implemented operations (paths and shapes from botocore's Lambda service model): Invoke
(RequestResponse, Event, DryRun; LogType Tail), Put/Get/Delete/ListProvisionedConcurrencyConfig(s),
Put/Get/DeleteFunctionConcurrency, GetFunction, GetFunctionConfiguration, ListFunctions,
ListVersionsByFunction, ListAliases, GetAlias, GetAccountSettings. Errors carry ``x-amzn-ErrorType``
so botocore raises the matching exception class, and a body ``{"Type", "Message"}`` spelt as Lambda
spells it; the host's own errors (no such function or qualifier, a refused concurrency setting, a
throttle) become Lambda's in one place, :meth:`_ApiHandler._dispatch`.

Two paths are the host's own: ``GET /moeless/meter`` (the bill so far) and ``GET /moeless/instances``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import threading
import uuid
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from moeless.lambda_host.account import ConcurrencyRefused
from moeless.lambda_host.httpserver import JsonHandler, LocalHTTPServer
from moeless.lambda_host.instance import error_body
from moeless.lambda_host.meter import BillingMeter
from moeless.lambda_host.pool import FunctionNotFound, FunctionPool, Throttled
from moeless.lambda_host.shapes import alias_configuration, function_configuration
from moeless.lambda_host.versions import (
    LATEST,
    PUBLISHED_VERSION,
    QualifierNotFound,
    Qualifiers,
    function_arn,
)

# Lambda's synchronous payload limits (request and response), in bytes
MAX_REQUEST_BYTES = 6 * 1024 * 1024
MAX_RESPONSE_BYTES = 6 * 1024 * 1024 + 100

Answer = tuple[int, bytes, dict[str, str]]

_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (method, re.compile(f"^{pattern}$"), action)
    for method, pattern, action in [
        ("POST", r"/2015-03-31/functions/(?P<name>[^/]+)/invocations", "invoke"),
        ("PUT", r"/2019-09-30/functions/(?P<name>[^/]+)/provisioned-concurrency", "put_provisioned"),
        ("GET", r"/2019-09-30/functions/(?P<name>[^/]+)/provisioned-concurrency", "get_provisioned"),
        ("DELETE", r"/2019-09-30/functions/(?P<name>[^/]+)/provisioned-concurrency", "delete_provisioned"),
        ("PUT", r"/2017-10-31/functions/(?P<name>[^/]+)/concurrency", "put_concurrency"),
        ("GET", r"/2019-09-30/functions/(?P<name>[^/]+)/concurrency", "get_concurrency"),
        ("DELETE", r"/2017-10-31/functions/(?P<name>[^/]+)/concurrency", "delete_concurrency"),
        ("GET", r"/2015-03-31/functions/?", "list_functions"),
        ("GET", r"/2015-03-31/functions/(?P<name>[^/]+)", "get_function"),
        ("GET", r"/2015-03-31/functions/(?P<name>[^/]+)/configuration", "get_configuration"),
        ("GET", r"/2015-03-31/functions/(?P<name>[^/]+)/versions", "list_versions"),
        ("GET", r"/2015-03-31/functions/(?P<name>[^/]+)/aliases", "list_aliases"),
        ("GET", r"/2015-03-31/functions/(?P<name>[^/]+)/aliases/(?P<alias>[^/]+)", "get_alias"),
        ("GET", r"/2016-08-19/account-settings/?", "account_settings"),
        ("GET", r"/moeless/meter", "meter"),
        ("GET", r"/moeless/instances", "instances"),
    ]
]


class LambdaApiError(Exception):
    """An AWS-shaped error answer."""

    def __init__(self, status: int, error_type: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.error_type, self.extra = status, error_type, extra


class HostedFunctions(Protocol):
    """What the API serves (a :class:`~moeless.lambda_host.host.LambdaHost`): its functions by
    name and their qualifiers, the account's concurrency settings, the bill, and a description of
    every instance."""

    @property
    def pools(self) -> Mapping[str, FunctionPool]: ...

    @property
    def meter(self) -> BillingMeter: ...

    @property
    def qualifiers(self) -> Qualifiers: ...

    def pool(self, name: str) -> FunctionPool: ...

    def set_reserved(self, name: str, count: int | None) -> None: ...

    def set_provisioned(self, name: str, qualifier: str, count: int) -> dict[str, Any]: ...

    def account_settings(self) -> dict[str, Any]: ...

    def describe(self) -> dict[str, Any]: ...


class _InvokeApiServer(LocalHTTPServer):
    host: HostedFunctions


def serve(host: HostedFunctions, port: int = 0) -> LocalHTTPServer:
    """Start the API on 127.0.0.1:``port`` in a background thread; returns the server."""
    server = _InvokeApiServer(("127.0.0.1", port), _ApiHandler)
    server.host = host
    threading.Thread(target=server.serve_forever, name="lambda-api", daemon=True).start()
    return server


def _as_api_error(exc: Exception, function: str) -> LambdaApiError | None:
    """Lambda's answer to one of the host's own errors (``None``: not one of them)."""
    if isinstance(exc, FunctionNotFound):
        message = f"Function not found: {function_arn(function)}"
        return LambdaApiError(404, "ResourceNotFoundException", message)
    if isinstance(exc, QualifierNotFound):
        return LambdaApiError(404, "ResourceNotFoundException", str(exc))
    if isinstance(exc, ConcurrencyRefused):
        return LambdaApiError(400, "InvalidParameterValueException", str(exc))
    if isinstance(exc, Throttled):
        return LambdaApiError(429, "TooManyRequestsException", str(exc), Reason=exc.reason)
    return None


def _json(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body or b"{}")
    except ValueError:
        raise LambdaApiError(
            400, "InvalidRequestContentException", "could not parse the request body as JSON"
        ) from None
    if not isinstance(value, dict):
        raise LambdaApiError(400, "InvalidParameterValueException", "the request body must be a JSON object")
    return value


def _bare(name: str) -> str:
    """The function's name in a plain name, ``name:qualifier``, or an ARN."""
    return name.rsplit(":function:", 1)[-1].split(":", 1)[0]


def _asked_qualifier(name: str, query: dict[str, str]) -> str | None:
    """``Qualifier`` from the query, or from ``name:qualifier`` / a qualified ARN (``None``: none)."""
    bare = name.rsplit(":function:", 1)[-1]
    return query.get("Qualifier") or (bare.split(":", 1)[1] if ":" in bare else None)


def _qualifier(name: str, query: dict[str, str]) -> str:
    """The qualifier asked for, ``$LATEST`` when none was."""
    return _asked_qualifier(name, query) or LATEST


def _reply(value: Any, status: int = 200) -> Answer:
    return status, json.dumps(value).encode(), {}


class _ApiHandler(JsonHandler):
    server: _InvokeApiServer

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        request_id = str(uuid.uuid4())
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        try:
            if length > MAX_REQUEST_BYTES:
                raise LambdaApiError(
                    413,
                    "RequestTooLargeException",
                    f"Request must be smaller than {MAX_REQUEST_BYTES} bytes for the Invoke operation",
                )
            body = self.rfile.read(length)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            for route_method, pattern, action in _ROUTES:
                match = pattern.match(url.path)
                if match and route_method == method:
                    params = {k: unquote(v) for k, v in match.groupdict().items()}
                    try:
                        status, payload, headers = getattr(self, f"_{action}")(body, query, **params)
                    except Exception as exc:
                        error = _as_api_error(exc, _bare(params.get("name", "")))
                        if error is None:
                            raise
                        raise error from None
                    break
            else:
                raise LambdaApiError(404, "UnknownOperationException", f"no operation at {method} {url.path}")
        except LambdaApiError as exc:
            if exc.status == 413:
                self.close_connection = True  # the body was not read
            status, headers = exc.status, {"x-amzn-ErrorType": exc.error_type}
            payload = json.dumps({"Type": "User", "Message": str(exc), **exc.extra}).encode()
        self.send_json(status, payload, headers | {"x-amzn-RequestId": request_id})

    @property
    def _host(self) -> HostedFunctions:
        return self.server.host

    def _version(self, pool: FunctionPool, qualifier: str) -> str:
        return self._host.qualifiers.version_of(pool.config.name, qualifier)

    # --- Invoke ------------------------------------------------------------------------------------

    def _invoke(self, body: bytes, query: dict[str, str], name: str) -> Answer:
        pool = self._host.pool(name)
        qualifier = _qualifier(name, query)
        version = {"X-Amz-Executed-Version": self._version(pool, qualifier)}
        invocation_type = self.headers.get("X-Amz-Invocation-Type", "RequestResponse")
        try:
            json.loads(body or b"null")
        except ValueError:
            raise LambdaApiError(
                400, "InvalidRequestContentException", "Could not parse request body into json"
            ) from None
        if invocation_type == "DryRun":
            return 204, b"", version
        if invocation_type == "Event":
            threading.Thread(target=self._invoke_quietly, args=(pool, body, qualifier), daemon=True).start()
            return 202, b"", version
        if invocation_type != "RequestResponse":
            raise LambdaApiError(
                400, "InvalidParameterValueException", f"unknown InvocationType {invocation_type!r}"
            )
        result = pool.invoke(body, qualifier, log_tail=self.headers.get("X-Amz-Log-Type") == "Tail")
        headers = dict(version)
        payload, function_error = result.body, result.function_error
        if len(payload) > MAX_RESPONSE_BYTES:
            payload = error_body(
                "Function.ResponseSizeTooLarge",
                f"Response payload size ({len(payload)} bytes) exceeded maximum allowed payload size "
                f"({MAX_RESPONSE_BYTES} bytes).",
            )
            function_error = "Unhandled"
        if function_error:
            headers["X-Amz-Function-Error"] = function_error
        if result.log_tail:
            headers["X-Amz-Log-Result"] = base64.b64encode(result.log_tail.encode()).decode()
        return 200, payload, headers

    @staticmethod
    def _invoke_quietly(pool: FunctionPool, body: bytes, qualifier: str) -> None:
        # an async invoke that is throttled is dropped here (AWS would retry it for hours)
        with contextlib.suppress(Throttled):
            pool.invoke(body, qualifier)

    # --- concurrency ---------------------------------------------------------------------------

    @staticmethod
    def _published(qualifier: str, message: str) -> None:
        """Provisioned concurrency lives on published versions and aliases, never on ``$LATEST``."""
        if qualifier == LATEST:
            raise LambdaApiError(400, "InvalidParameterValueException", message)

    def _put_provisioned(self, body: bytes, query: dict[str, str], name: str) -> Answer:
        qualifier = _qualifier(name, query)
        self._published(
            qualifier, "Provisioned Concurrency Configs cannot be applied to unpublished function versions."
        )
        count = _json(body).get("ProvisionedConcurrentExecutions")
        if not isinstance(count, int) or count < 1:
            raise LambdaApiError(
                400, "InvalidParameterValueException", "ProvisionedConcurrentExecutions must be >= 1"
            )
        try:
            return _reply(self._host.set_provisioned(name, qualifier, count), 202)
        except ValueError as exc:
            raise LambdaApiError(409, "ResourceConflictException", str(exc)) from None

    def _get_provisioned(self, body: bytes, query: dict[str, str], name: str) -> Answer:
        pool = self._host.pool(name)
        if "List" in query:  # ListProvisionedConcurrencyConfigs shares the path, with ?List=ALL
            configs = [
                {"FunctionArn": function_arn(pool.config.name, q), **pool.provisioned_status(q)}
                for q in sorted(pool.provisioned)
            ]
            return _reply({"ProvisionedConcurrencyConfigs": configs})
        qualifier = _qualifier(name, query)
        self._published(qualifier, "The function resource provided must be an alias or a published version.")
        self._version(pool, qualifier)
        try:
            return _reply(pool.provisioned_status(qualifier))
        except KeyError:
            raise LambdaApiError(
                404,
                "ProvisionedConcurrencyConfigNotFoundException",
                "No Provisioned Concurrency Config found for this function: "
                f"{function_arn(pool.config.name, qualifier)}",
            ) from None

    def _delete_provisioned(self, body: bytes, query: dict[str, str], name: str) -> Answer:
        pool = self._host.pool(name)
        qualifier = _qualifier(name, query)
        self._published(qualifier, "The function resource provided must be an alias or a published version.")
        self._version(pool, qualifier)
        try:
            pool.delete_provisioned(qualifier)
        except KeyError:
            raise LambdaApiError(
                404, "ResourceNotFoundException", f"No Provisioned Concurrency Config for {qualifier}"
            ) from None
        return 204, b"", {}

    def _put_concurrency(self, body: bytes, query: dict[str, str], name: str) -> Answer:
        count = _json(body).get("ReservedConcurrentExecutions")
        if not isinstance(count, int) or count < 0:
            raise LambdaApiError(
                400, "InvalidParameterValueException", "ReservedConcurrentExecutions must be >= 0"
            )
        try:
            self._host.set_reserved(name, count)
        except ValueError as exc:
            raise LambdaApiError(409, "ResourceConflictException", str(exc)) from None
        return _reply({"ReservedConcurrentExecutions": count})

    def _get_concurrency(self, body: bytes, query: dict[str, str], name: str) -> Answer:
        reserved = self._host.pool(name).config.reserved_concurrency
        return _reply({} if reserved is None else {"ReservedConcurrentExecutions": reserved})

    def _delete_concurrency(self, body: bytes, query: dict[str, str], name: str) -> Answer:
        self._host.set_reserved(name, None)
        return 204, b"", {}

    def _account_settings(self, body: bytes, query: dict[str, str]) -> Answer:
        return _reply(self._host.account_settings())

    # --- functions, versions, aliases ------------------------------------------------------------

    def _configuration(self, name: str, query: dict[str, str]) -> dict[str, Any]:
        """The configuration of the version ``name`` (and its ``Qualifier``) runs."""
        pool = self._host.pool(name)
        asked = _asked_qualifier(name, query)
        return function_configuration(pool.config, self._version(pool, asked or LATEST), asked)

    def _list_functions(self, body: bytes, query: dict[str, str]) -> Answer:
        return _reply({"Functions": [function_configuration(p.config) for p in self._host.pools.values()]})

    def _get_function(self, body: bytes, query: dict[str, str], name: str) -> Answer:
        answer: dict[str, Any] = {"Configuration": self._configuration(name, query)}
        reserved = self._host.pool(name).config.reserved_concurrency
        if reserved is not None:
            answer["Concurrency"] = {"ReservedConcurrentExecutions": reserved}
        return _reply(answer)

    def _get_configuration(self, body: bytes, query: dict[str, str], name: str) -> Answer:
        return _reply(self._configuration(name, query))

    def _list_versions(self, body: bytes, query: dict[str, str], name: str) -> Answer:
        config = self._host.pool(name).config
        versions = [function_configuration(config, v, v) for v in (LATEST, PUBLISHED_VERSION)]
        return _reply({"Versions": versions})

    def _list_aliases(self, body: bytes, query: dict[str, str], name: str) -> Answer:
        function = self._host.pool(name).config.name
        alias = alias_configuration(function, self._host.qualifiers.alias, PUBLISHED_VERSION)
        wanted = query.get("FunctionVersion", PUBLISHED_VERSION) == PUBLISHED_VERSION
        return _reply({"Aliases": [alias] if wanted else []})

    def _get_alias(self, body: bytes, query: dict[str, str], name: str, alias: str) -> Answer:
        pool = self._host.pool(name)
        if alias != self._host.qualifiers.alias:
            raise QualifierNotFound(f"Cannot find alias arn: {function_arn(pool.config.name, alias)}")
        return _reply(alias_configuration(pool.config.name, alias, PUBLISHED_VERSION))

    # --- the host's own ------------------------------------------------------------------------

    def _meter(self, body: bytes, query: dict[str, str]) -> Answer:
        return _reply(self._host.meter.snapshot())

    def _instances(self, body: bytes, query: dict[str, str]) -> Answer:
        return _reply(self._host.describe())
