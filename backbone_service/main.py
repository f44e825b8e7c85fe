"""The container's entry point: ``uvicorn backbone_service.main:app``, configured by environment.

MOELESS_ARTIFACTS         the package: a folder, or ``s3://bucket/prefix`` fetched (checksums
                          checked, resuming) into MOELESS_ARTIFACTS_CACHE at start
MOELESS_ARTIFACTS_CACHE   where an S3 package is fetched to (default /opt/moeless/artifacts)
MOELESS_PLAN              plan.json: a path or ``s3://bucket/key`` (optional)
MOELESS_FUNCTION_PREFIX   the deployed functions' name prefix (``moeless-STAGE-``; set by the CDK app)
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

DEFAULT_CACHE = "/opt/moeless/artifacts"


def config_from_env(env: dict[str, str]) -> BackboneConfig:
    """The service's configuration; an S3 package or plan is fetched first (once; a restart resumes)."""
    artifacts, plan = env["MOELESS_ARTIFACTS"], env.get("MOELESS_PLAN") or None
    if artifacts.startswith("s3://") or (plan or "").startswith("s3://"):
        artifacts, plan = _fetch_from_s3(
            artifacts, plan, Path(env.get("MOELESS_ARTIFACTS_CACHE", DEFAULT_CACHE))
        )
    return BackboneConfig(
        artifacts=Path(artifacts),
        plan=Path(plan) if plan else None,
        lambda_endpoint=env.get("MOELESS_LAMBDA_ENDPOINT") or None,
        qualifier=env.get("MOELESS_QUALIFIER", "live") or None,
        function_prefix=env.get("MOELESS_FUNCTION_PREFIX", ""),
        device=env.get("MOELESS_DEVICE", "auto"),
        max_batch=int(env.get("MOELESS_MAX_BATCH", "16")),
        replan_interval_s=float(env.get("MOELESS_REPLAN_INTERVAL", "60")),
    )


def _fetch_from_s3(artifacts: str, plan: str | None, cache: Path) -> tuple[str, str | None]:
    import boto3

    from moeless.artifact_store import download_artifacts, download_file

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
