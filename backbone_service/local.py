"""The whole service on this machine: a local Lambda host with the expert functions, the backbone
and its REST server, started in order and stopped in reverse (also on Ctrl-C or an error half-way).

Shared by ``moeless serve --local``, ``moeless deploy --local``, the demo and the benchmarks, so that
each of them runs the same assembly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from backbone_service.app import create_app
from backbone_service.server import BackgroundServer
from moeless.errors import MoelessError

if TYPE_CHECKING:
    from moeless.lambda_host.host import LambdaHost
    from moeless.serving.backbone import Backbone, BackboneConfig


@contextmanager
def running_service(
    config: BackboneConfig,
    port: int,
    start_host: Callable[[], LambdaHost] | None = None,
    say: Callable[[str], None] = lambda _message: None,
) -> Iterator[tuple[BackgroundServer, Backbone, LambdaHost | None]]:
    """The local Lambda host (when ``start_host`` is given: its endpoint replaces the config's),
    the backbone and its REST server on 127.0.0.1:``port``; all stopped in reverse order on exit,
    also on Ctrl-C or an error half-way."""
    from moeless.serving.backbone import Backbone

    host = backbone = server = None
    try:
        if start_host is not None:
            host = start_host()
            config = replace(config, lambda_endpoint=host.endpoint_url)
        say("loading the backbone...")
        backbone = Backbone(config)
        try:
            server = BackgroundServer(create_app(backbone), port).start()
        except RuntimeError:
            raise MoelessError(f"cannot listen on 127.0.0.1:{port} (in use?)") from None
        yield server, backbone, host
    finally:
        say("stopping...")
        if server is not None:
            server.stop()
        if backbone is not None:
            backbone.close()
        if host is not None:
            host.stop()
