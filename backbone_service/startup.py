"""How the container starts from its environment (the environment contract of
:mod:`moeless.contracts.environment`).

From an ``s3://`` package the task fetches (into MOELESS_ARTIFACTS_CACHE, checksums checked,
resuming what a predecessor on the same instance left there) the plan, the backbone and the
experts it runs in process, not the whole package; an expert it needs only when a function fails
is fetched then, into a cache of at most MOELESS_FALLBACK_CACHE_BYTES.
"""

from __future__ import annotations

from pathlib import Path

from moeless.contracts import environment as E
from moeless.serving.backbone import BackboneConfig

DEFAULT_CACHE = "/opt/moeless/artifacts"


def config_from_env(env: dict[str, str]) -> BackboneConfig:
    """The service's configuration; an S3 package or plan is fetched first (once; a restart resumes)."""
    artifacts, plan = env[E.ARTIFACTS], env.get(E.PLAN) or None
    source = artifacts if artifacts.startswith("s3://") else None
    if source or (plan or "").startswith("s3://"):
        artifacts, plan = _fetch_from_s3(artifacts, plan, Path(env.get(E.ARTIFACTS_CACHE, DEFAULT_CACHE)))
    budget = env.get(E.FALLBACK_CACHE_BYTES)
    return BackboneConfig(
        artifacts=Path(artifacts),
        plan=Path(plan) if plan else None,
        lambda_endpoint=env.get(E.LAMBDA_ENDPOINT) or None,
        qualifier=env.get(E.QUALIFIER, E.ALIAS) or None,
        function_prefix=env.get(E.FUNCTION_PREFIX, ""),
        device=env.get(E.DEVICE, "auto"),
        max_batch=int(env.get(E.MAX_BATCH, E.DEFAULT_MAX_BATCH)),
        replan_interval_s=float(env.get(E.REPLAN_INTERVAL, E.DEFAULT_REPLAN_INTERVAL_S)),
        experts_source=source,
        fallback_cache_bytes=int(budget) if budget else None,
    )


def _fetch_from_s3(artifacts: str, plan: str | None, cache: Path) -> tuple[str, str | None]:
    import boto3

    from moeless.artifacts.store import download_artifacts, download_file
    from moeless.contracts.plan import plan_for

    s3 = boto3.client("s3")
    if plan and plan.startswith("s3://"):
        plan = str(download_file(s3, plan, cache / "plan.json"))
    if artifacts.startswith("s3://"):
        manifest = download_artifacts(s3, artifacts, cache, experts=[])  # the manifest and backbone
        in_process = plan_for(manifest, Path(plan) if plan else None).in_process()
        download_artifacts(s3, artifacts, cache, experts=in_process, backbone=False)
        artifacts = str(cache)
    return artifacts, plan
