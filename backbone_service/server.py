"""Running the app with uvicorn: in the foreground (``moeless serve``) or a background thread."""

from __future__ import annotations

import threading
import time
from typing import Any


class BackgroundServer:
    """uvicorn serving ``app`` on 127.0.0.1 from a daemon thread (tests, benchmarks, the demo).

    Args:
        app: the ASGI app.
        port: 0 picks a free port; :attr:`url` tells which.
    """

    def __init__(self, app: Any, port: int = 0, host: str = "127.0.0.1") -> None:
        import uvicorn

        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    def start(self, timeout_s: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start (is the port in use?)")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
