"""The container's entry point: ``uvicorn backbone_service.main:app``, configured by environment.

The variables and their defaults are the environment contract of
:mod:`moeless.contracts.environment`; an ``s3://`` package or plan is fetched (checksums checked,
resuming) into MOELESS_ARTIFACTS_CACHE at start.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from pathlib import Path

from backbone_service.app import create_app
from moeless.contracts import environment as E
from moeless.serving.backbone import Backbone, BackboneConfig

DEFAULT_CACHE = "/opt/moeless/artifacts"


def config_from_env(env: dict[str, str]) -> BackboneConfig:
    """The service's configuration; an S3 package or plan is fetched first (once; a restart resumes)."""
    artifacts, plan = env[E.ARTIFACTS], env.get(E.PLAN) or None
    if artifacts.startswith("s3://") or (plan or "").startswith("s3://"):
        artifacts, plan = _fetch_from_s3(artifacts, plan, Path(env.get(E.ARTIFACTS_CACHE, DEFAULT_CACHE)))
    return BackboneConfig(
        artifacts=Path(artifacts),
        plan=Path(plan) if plan else None,
        lambda_endpoint=env.get(E.LAMBDA_ENDPOINT) or None,
        qualifier=env.get(E.QUALIFIER, E.ALIAS) or None,
        function_prefix=env.get(E.FUNCTION_PREFIX, ""),
        device=env.get(E.DEVICE, "auto"),
        max_batch=int(env.get(E.MAX_BATCH, E.DEFAULT_MAX_BATCH)),
        replan_interval_s=float(env.get(E.REPLAN_INTERVAL, E.DEFAULT_REPLAN_INTERVAL_S)),
    )


def _fetch_from_s3(artifacts: str, plan: str | None, cache: Path) -> tuple[str, str | None]:
    import boto3

    from moeless.artifacts.store import download_artifacts, download_file

    s3 = boto3.client("s3")
    if artifacts.startswith("s3://"):
        download_artifacts(s3, artifacts, cache)  # the backbone, and every expert for the fallback
        artifacts = str(cache)
    if plan and plan.startswith("s3://"):
        plan = str(download_file(s3, plan, cache / "plan.json"))
    return artifacts, plan


backbone = Backbone(config_from_env(dict(os.environ)))
app = create_app(backbone)


@asynccontextmanager
async def _lifespan(_app):
    yield
    backbone.close()


app.router.lifespan_context = _lifespan
