"""The container's entry point: ``uvicorn backbone_service.main:app``, configured by environment.

Configured by :func:`backbone_service.startup.config_from_env`, which says what is fetched at start.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager

from backbone_service.app import create_app
from backbone_service.startup import config_from_env
from moeless.serving.backbone import Backbone

backbone = Backbone(config_from_env(dict(os.environ)))
app = create_app(backbone)


@asynccontextmanager
async def _lifespan(_app):
    yield
    backbone.close()


app.router.lifespan_context = _lifespan
