"""The container's entry point: ``uvicorn backbone_service.main:app``, configured by environment.

MOELESS_ARTIFACTS         the package (a folder; the image syncs it from S3 at start)
MOELESS_PLAN              plan.json (optional)
MOELESS_LAMBDA_ENDPOINT   a local host's URL; unset on AWS
MOELESS_QUALIFIER         alias to invoke (default ``live``)
MOELESS_DEVICE            auto | cuda | cpu
MOELESS_MAX_BATCH         sequences per step (default 16)
MOELESS_REPLAN_INTERVAL   seconds between re-provisioning from observed loads (default 60; 0: never)
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from pathlib import Path

from backbone_service.app import create_app
from moeless.serving import Backbone, BackboneConfig


def config_from_env(env: dict[str, str]) -> BackboneConfig:
    return BackboneConfig(
        artifacts=Path(env["MOELESS_ARTIFACTS"]),
        plan=Path(env["MOELESS_PLAN"]) if env.get("MOELESS_PLAN") else None,
        lambda_endpoint=env.get("MOELESS_LAMBDA_ENDPOINT") or None,
        qualifier=env.get("MOELESS_QUALIFIER", "live") or None,
        device=env.get("MOELESS_DEVICE", "auto"),
        max_batch=int(env.get("MOELESS_MAX_BATCH", "16")),
        replan_interval_s=float(env.get("MOELESS_REPLAN_INTERVAL", "60")),
    )


backbone = Backbone(config_from_env(dict(os.environ)))
app = create_app(backbone)


@asynccontextmanager
async def _lifespan(_app):
    yield
    backbone.close()


app.router.lifespan_context = _lifespan
