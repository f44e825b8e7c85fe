"""The caller's side of the local host: Lambda's REST API on 127.0.0.1, as boto3 speaks it.

Implemented operations (paths and shapes from botocore's Lambda service model): Invoke
(RequestResponse, Event, DryRun; LogType Tail), Put/Get/Delete/ListProvisionedConcurrencyConfig(s),
Put/Get/DeleteFunctionConcurrency, GetFunction, GetFunctionConfiguration, ListFunctions.
Errors carry ``x-amzn-ErrorType`` so botocore raises the matching exception class, and a body
``{"Type", "Message"}`` spelt as Lambda spells it.

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

from moeless.lambda_host.httpserver import JsonHandler, LocalHTTPServer
from moeless.lambda_host.instance import error_body, function_arn
from moeless.lambda_host.meter import BillingMeter
from moeless.lambda_host.pool import FunctionNotFound, FunctionPool, Throttled

# Lambda's synchronous payload limits (request and response), in bytes
MAX_REQUEST_BYTES = 6 * 1024 * 1024
MAX_RESPONSE_BYTES = 6 * 1024 * 1024 + 100
LATEST = "$LATEST"

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
    name, their bill, and a description of every instance."""

    @property
    def pools(self) -> Mapping[str, FunctionPool]: ...

    @property
    def meter(self) -> BillingMeter: ...

    def pool(self, name: str) -> FunctionPool: ...

    def describe(self) -> dict[str, Any]: ...


class _InvokeApiServer(LocalHTTPServer):
    host: HostedFunctions


def serve(host: HostedFunctions, port: int = 0) -> LocalHTTPServer:
    """Start the API on 127.0.0.1:``port`` in a background thread; returns the server."""
    server = _InvokeApiServer(("127.0.0.1", port), _ApiHandler)
    server.host = host
    threading.Thread(target=server.serve_forever, name="lambda-api", daemon=True).start()
    return server


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
                    status, payload, headers = getattr(self, f"_{action}")(body, query, **params)
                    break
            else:
                raise LambdaApiError(404, "UnknownOperationException", f"no operation at {method} {url.path}")
        except LambdaApiError as exc:
            if exc.status == 413:
                self.close_connection = True  # the body was not read
            status, headers = exc.status, {"x-amzn-ErrorType": exc.error_type}
            payload = json.dumps({"Type": "User", "Message": str(exc), **exc.extra}).encode()
        self.send_json(status, payload, headers | {"x-amzn-RequestId": request_id})

    def _pool(self, name: str) -> Any:
        try:
            return self.server.host.pool(name)
        except FunctionNotFound:
            raise LambdaApiError(
                404, "ResourceNotFoundException", f"Function not found: {function_arn(name)}"
            ) from None

    @staticmethod
    def _qualifier(name: str, query: dict[str, str]) -> str:
        """``Qualifier`` from the query, or from ``name:qualifier`` / a qualified ARN."""
        bare = name.rsplit(":function:", 1)[-1]
        return query.get("Qualifier") or (bare.split(":", 1)[1] if ":" in bare else LATEST)

    @staticmethod
    def _json(body: bytes) -> dict[str, Any]:
        try:
            value = json.loads(body or b"{}")
        except ValueError:
            raise LambdaApiError(
                400, "InvalidRequestContentException", "could not parse the request body as JSON"
            ) from None
        if not isinstance(value, dict):
            raise LambdaApiError(
                400, "InvalidParameterValueException", "the request body must be a JSON object"
            )
        return value

    # --- Invoke ------------------------------------------------------------------------------------

    def _invoke(self, body: bytes, query: dict[str, str], name: str) -> tuple[int, bytes, dict[str, str]]:
        pool = self._pool(name)
        qualifier = self._qualifier(name, query)
        invocation_type = self.headers.get("X-Amz-Invocation-Type", "RequestResponse")
        try:
            json.loads(body or b"null")
        except ValueError:
            raise LambdaApiError(
                400, "InvalidRequestContentException", "Could not parse request body into json"
            ) from None
        version = {"X-Amz-Executed-Version": LATEST if qualifier == LATEST else qualifier}
        if invocation_type == "DryRun":
            return 204, b"", version
        if invocation_type == "Event":
            threading.Thread(target=self._invoke_quietly, args=(pool, body, qualifier), daemon=True).start()
            return 202, b"", version
        if invocation_type != "RequestResponse":
            raise LambdaApiError(
                400, "InvalidParameterValueException", f"unknown InvocationType {invocation_type!r}"
            )
        try:
            result = pool.invoke(body, qualifier, log_tail=self.headers.get("X-Amz-Log-Type") == "Tail")
        except Throttled as exc:
            raise LambdaApiError(429, "TooManyRequestsException", str(exc), Reason=exc.reason) from None
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
    def _invoke_quietly(pool: Any, body: bytes, qualifier: str) -> None:
        # an async invoke that is throttled is dropped here (AWS would retry it for hours)
        with contextlib.suppress(Throttled):
            pool.invoke(body, qualifier)

    # --- concurrency ---------------------------------------------------------------------------

    def _put_provisioned(
        self, body: bytes, query: dict[str, str], name: str
    ) -> tuple[int, bytes, dict[str, str]]:
        pool = self._pool(name)
        qualifier = self._qualifier(name, query)
        if qualifier == LATEST:
            raise LambdaApiError(
                400,
                "InvalidParameterValueException",
                "Provisioned Concurrency Configs cannot be applied to unpublished function versions.",
            )
        count = self._json(body).get("ProvisionedConcurrentExecutions")
        if not isinstance(count, int) or count < 1:
            raise LambdaApiError(
                400, "InvalidParameterValueException", "ProvisionedConcurrentExecutions must be >= 1"
            )
        try:
            status = pool.set_provisioned(qualifier, count)
        except ValueError as exc:
            raise LambdaApiError(409, "ResourceConflictException", str(exc)) from None
        return 202, json.dumps(status).encode(), {}

    def _get_provisioned(
        self, body: bytes, query: dict[str, str], name: str
    ) -> tuple[int, bytes, dict[str, str]]:
        pool = self._pool(name)
        if "List" in query:  # ListProvisionedConcurrencyConfigs shares the path, with ?List=ALL
            return self._list_provisioned(pool, name)
        qualifier = self._qualifier(name, query)
        try:
            return 200, json.dumps(pool.provisioned_status(qualifier)).encode(), {}
        except KeyError:
            raise LambdaApiError(
                404,
                "ProvisionedConcurrencyConfigNotFoundException",
                f"No Provisioned Concurrency Config found for this function: {function_arn(name, qualifier)}",
            ) from None

    @staticmethod
    def _list_provisioned(pool: Any, name: str) -> tuple[int, bytes, dict[str, str]]:
        bare = name.rsplit(":function:", 1)[-1].split(":", 1)[0]
        configs = [
            {"FunctionArn": function_arn(bare, qualifier), **pool.provisioned_status(qualifier)}
            for qualifier in sorted(pool.provisioned)
        ]
        return 200, json.dumps({"ProvisionedConcurrencyConfigs": configs}).encode(), {}

    def _delete_provisioned(
        self, body: bytes, query: dict[str, str], name: str
    ) -> tuple[int, bytes, dict[str, str]]:
        pool = self._pool(name)
        qualifier = self._qualifier(name, query)
        try:
            pool.delete_provisioned(qualifier)
        except KeyError:
            raise LambdaApiError(
                404, "ResourceNotFoundException", f"No Provisioned Concurrency Config for {qualifier}"
            ) from None
        return 204, b"", {}

    def _put_concurrency(
        self, body: bytes, query: dict[str, str], name: str
    ) -> tuple[int, bytes, dict[str, str]]:
        pool = self._pool(name)
        count = self._json(body).get("ReservedConcurrentExecutions")
        if not isinstance(count, int) or count < 0:
            raise LambdaApiError(
                400, "InvalidParameterValueException", "ReservedConcurrentExecutions must be >= 0"
            )
        try:
            pool.set_reserved(count)
        except ValueError as exc:
            raise LambdaApiError(409, "ResourceConflictException", str(exc)) from None
        return 200, json.dumps({"ReservedConcurrentExecutions": count}).encode(), {}

    def _get_concurrency(
        self, body: bytes, query: dict[str, str], name: str
    ) -> tuple[int, bytes, dict[str, str]]:
        reserved = self._pool(name).config.reserved_concurrency
        answer = {} if reserved is None else {"ReservedConcurrentExecutions": reserved}
        return 200, json.dumps(answer).encode(), {}

    def _delete_concurrency(
        self, body: bytes, query: dict[str, str], name: str
    ) -> tuple[int, bytes, dict[str, str]]:
        self._pool(name).set_reserved(None)
        return 204, b"", {}

    # --- descriptions ----------------------------------------------------------------------------

    def _configuration(self, name: str) -> dict[str, Any]:
        config = self._pool(name).config
        return {
            "FunctionName": config.name,
            "FunctionArn": function_arn(config.name),
            "PackageType": "Image",
            "MemorySize": config.memory_mb,
            "Timeout": int(config.timeout_s),
            "Version": LATEST,
            "State": "Active",
            "Environment": {"Variables": dict(config.environment)},
        }

    def _list_functions(self, body: bytes, query: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
        functions = [self._configuration(name) for name in self.server.host.pools]
        return 200, json.dumps({"Functions": functions}).encode(), {}

    def _get_function(
        self, body: bytes, query: dict[str, str], name: str
    ) -> tuple[int, bytes, dict[str, str]]:
        answer: dict[str, Any] = {"Configuration": self._configuration(name)}
        reserved = self._pool(name).config.reserved_concurrency
        if reserved is not None:
            answer["Concurrency"] = {"ReservedConcurrentExecutions": reserved}
        return 200, json.dumps(answer).encode(), {}

    def _get_configuration(
        self, body: bytes, query: dict[str, str], name: str
    ) -> tuple[int, bytes, dict[str, str]]:
        return 200, json.dumps(self._configuration(name)).encode(), {}

    def _meter(self, body: bytes, query: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
        return 200, json.dumps(self.server.host.meter.snapshot()).encode(), {}

    def _instances(self, body: bytes, query: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
        return 200, json.dumps(self.server.host.describe()).encode(), {}
