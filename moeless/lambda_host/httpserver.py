"""The HTTP plumbing both host APIs share: a threaded server on 127.0.0.1 and a JSON reply."""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class LocalHTTPServer(ThreadingHTTPServer):
    """One thread per connection; closing does not wait for connections parked in long polls."""

    daemon_threads = True
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A peer that goes away (an instance killed mid-poll, a client timing out) is not an error."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class JsonHandler(BaseHTTPRequestHandler):
    """Keep-alive HTTP/1.1 with Nagle off (small replies must not wait for delayed ACKs)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the host meters and logs invocations itself."""

    def send_json(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        # awslambdaric's client fails on a /next response without Content-Type
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
