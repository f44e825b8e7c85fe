"""What one deployment is: the package, the plan and the knobs, read from the CDK context.

Context keys (``cdk.json`` holds the defaults; ``moeless deploy`` and ``-c KEY=VALUE`` override):

    moeless:artifacts              the package folder (output of ``moeless package``); required
    moeless:plan                   plan.json; default: one function per expert
    moeless:stage                  deployment name (letters, digits; no "-"); prefixes stacks, functions, keys
    moeless:expertCode             ``s3``: one image, experts fetched from S3 at init; ``image``:
                                   each function's experts baked into its own image
    moeless:imageTag               deploy images pushed to the Artifacts stack's ECR repositories
                                   under this tag, instead of building them from the Dockerfiles
    moeless:backboneInstanceType   EC2 GPU instance type of the backbone (one task per instance);
                                   default: the one the plan was sized for, else g5.xlarge
    moeless:backboneMaxTasks       most backbone tasks when scaling on load (instances: one more);
                                   at least the plan's backbone count, which is the service's start
    moeless:fallbackCacheGiB       experts a backbone task keeps for its in-process fallback (LRU)
    moeless:maxAzs                 availability zones of the VPC
    moeless:throttleRateLimit      API requests per second (usage plan)
    moeless:throttleBurstLimit     API burst (usage plan)
    moeless:quotaPerDay            API requests per key per day (usage plan)
    moeless:target                 ``aws`` (default), or ``localstack``: the profile an emulator can
                                   run (see :mod:`moeless_cdk.profile`)
    moeless:backboneUrl            with ``localstack``: where the API's routes send requests (a
                                   backbone service on this machine, e.g. ``moeless serve --local``)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from aws_cdk import Aws

from moeless.contracts.environment import EXPERT_TIMEOUT_S
from moeless.contracts.manifest import Manifest, load_manifest
from moeless.contracts.plan import Plan, plan_for
from moeless.deployment.stage import StageNameError, StageNames, check_stage
from moeless.errors import MoelessError
from moeless_cdk.profile import Target

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BACKBONE_INSTANCE = "g5.xlarge"  # a plan without a backbone (analytic, or version 1)
EXPERT_CODES = ("s3", "image")


class DeployConfigError(MoelessError):
    """The CDK context does not describe a deployable configuration."""


@dataclass(frozen=True)
class DeployConfig:
    """One deployment: ``plan`` as the planner wrote it; ``deployed_plan`` with this stage's names."""

    artifacts: Path
    manifest: Manifest
    plan: Plan
    stage: str = "dev"
    expert_code: str = "s3"
    image_tag: str | None = None
    backbone_instance_type: str | None = None  # None: the plan's, else DEFAULT_BACKBONE_INSTANCE
    backbone_max_tasks: int = 2
    fallback_cache_gib: float = 4.0
    max_azs: int = 2
    throttle_rate_limit: float = 50.0
    throttle_burst_limit: int = 100
    quota_per_day: int = 100_000
    expert_timeout_s: int = EXPERT_TIMEOUT_S
    target: Target = Target.AWS
    backbone_url: str | None = None

    def __post_init__(self) -> None:
        try:
            check_stage(self.stage)
        except StageNameError as exc:
            raise DeployConfigError(str(exc)) from None
        if self.expert_code not in EXPERT_CODES:
            raise DeployConfigError(
                f"moeless:expertCode must be one of {EXPERT_CODES}, not {self.expert_code!r}"
            )
        if (self.target is Target.LOCALSTACK) != (self.backbone_url is not None):
            raise DeployConfigError(
                "moeless:backboneUrl goes with moeless:target=localstack, and only with it: the "
                "emulator's API sends requests to that URL (on AWS, to the backbone's load balancer)"
            )

        sized = self.plan.backbone.instance if self.plan.backbone else None
        if self.backbone_instance_type and sized and self.backbone_instance_type != sized:
            raise DeployConfigError(
                f"the plan was sized for a {sized} backbone, moeless:backboneInstanceType says "
                f"{self.backbone_instance_type}: plan again on an instance catalogue that offers "
                "only it (moeless plan --instances FILE), or drop the key"
            )

    @property
    def instance_type(self) -> str:
        """The backbone's EC2 instance type: the plan's, or the one the context names."""
        sized = self.plan.backbone.instance if self.plan.backbone else None
        return self.backbone_instance_type or sized or DEFAULT_BACKBONE_INSTANCE

    @property
    def backbone_tasks(self) -> int:
        """Backbone tasks the service starts with: as many as the plan was sized for."""
        return self.plan.backbone.count if self.plan.backbone else 1

    @property
    def max_tasks(self) -> int:
        """Most tasks when scaling on load: never fewer than the plan's backbones."""
        return max(self.backbone_max_tasks, self.backbone_tasks)

    @property
    def emulated(self) -> bool:
        """Whether this is the LocalStack profile (see :data:`moeless_cdk.profile.LEFT_OUT_ON_LOCALSTACK`)."""
        return self.target is Target.LOCALSTACK

    @property
    def names(self) -> StageNames:
        return StageNames(self.stage)

    @cached_property
    def deployed_plan(self) -> Plan:
        return self.plan.prefixed(self.names.function_prefix)

    @property
    def bucket_name(self) -> str:
        """The artifacts bucket, named by stage, account and region: every stack (and ``moeless
        deploy``) knows it without a cross-stack export."""
        return self.names.bucket(Aws.ACCOUNT_ID, Aws.REGION)

    def objects_arn(self, key_pattern: str) -> str:
        return f"arn:{Aws.PARTITION}:s3:::{self.bucket_name}/{key_pattern}"

    def functions_arn(self, suffix: str = "") -> str:
        """ARN pattern of this stage's expert functions (``suffix``: ``:live`` for their aliases)."""
        return regional_arn("lambda", f"function:{self.names.function_prefix}*{suffix}")

    @cached_property
    def package_digest(self) -> str:
        return self.manifest.digest()

    @property
    def artifacts_uri(self) -> str:
        """This package's folder: a new package is a new folder (and a new function configuration)."""
        return f"s3://{self.bucket_name}/{self.names.package_prefix(self.package_digest)}"

    @property
    def plan_uri(self) -> str:
        return f"s3://{self.bucket_name}/{self.names.plan_key(self.plan.digest())}"


def regional_arn(service: str, resource: str) -> str:
    """An ARN in the deploying account and region (pseudo-parameters keep stacks environment-agnostic)."""
    return f"arn:{Aws.PARTITION}:{service}:{Aws.REGION}:{Aws.ACCOUNT_ID}:{resource}"


def _target(value: str) -> Target:
    try:
        return Target(value)
    except ValueError:
        raise DeployConfigError(
            f"moeless:target must be one of {[t.value for t in Target]}, not {value!r}"
        ) from None


def _required(context: Callable[[str], Any], key: str) -> Any:
    value = context(key)
    if value in (None, ""):
        raise DeployConfigError(
            f"CDK context {key} is not set: run `moeless deploy ARTIFACTS --plan plan.json`, "
            f"or pass -c {key}=..."
        )
    return value


# context key -> (DeployConfig field, type); an absent key leaves the field's default.
_CONTEXT_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "moeless:stage": ("stage", str),
    "moeless:expertCode": ("expert_code", str),
    "moeless:imageTag": ("image_tag", str),
    "moeless:backboneInstanceType": ("backbone_instance_type", str),
    "moeless:backboneMaxTasks": ("backbone_max_tasks", int),
    "moeless:fallbackCacheGiB": ("fallback_cache_gib", float),
    "moeless:maxAzs": ("max_azs", int),
    "moeless:throttleRateLimit": ("throttle_rate_limit", float),
    "moeless:throttleBurstLimit": ("throttle_burst_limit", int),
    "moeless:quotaPerDay": ("quota_per_day", int),
    "moeless:target": ("target", _target),
    "moeless:backboneUrl": ("backbone_url", str),
}


def config_from_context(context: Callable[[str], Any]) -> DeployConfig:
    """Read the deployment from the CDK context (``app.node.try_get_context``, or a dict's ``get``)."""
    artifacts = Path(_required(context, "moeless:artifacts")).expanduser().resolve()
    manifest = load_manifest(artifacts)
    plan_path = context("moeless:plan")
    given = {key: context(key) for key in _CONTEXT_FIELDS}
    return DeployConfig(
        artifacts=artifacts,
        manifest=manifest,
        plan=plan_for(manifest, Path(plan_path).expanduser() if plan_path else None),
        **{
            name: kind(given[key])
            for key, (name, kind) in _CONTEXT_FIELDS.items()
            if given[key] not in (None, "")
        },
    )
