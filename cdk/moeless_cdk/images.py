"""The container images: built by ``cdk deploy`` from the repository's Dockerfiles (assets), or
pre-built and pushed to the Artifacts stack's ECR repositories under ``moeless:imageTag``.

Build contexts are the repository root narrowed by Docker-style excludes to what each
Dockerfile's COPY lines read, so staging never walks a virtualenv or a model cache. With
``moeless:expertCode=image`` each function's image bakes in its own experts: the context is a
staged folder (hard links, not copies) holding the package, narrowed per function.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from moeless.contracts.manifest import MANIFEST_NAME
from moeless_cdk.config import REPO_ROOT, DeployConfig, DeployConfigError

EXPERT_DOCKERFILE = "functions/expert/Dockerfile"
BACKBONE_DOCKERFILE = "backbone_service/Dockerfile"
BAKED_ARTIFACTS = "functions/expert/artifacts"
# the functions run on x86_64 and the backbone on x86 GPU instances: an image built on an arm64
# laptop must still be amd64
PLATFORM = ecr_assets.Platform.LINUX_AMD64
_EXPERT_CONTEXT = [
    "*",
    "!moeless",
    "!functions",
    "functions/*",
    "!functions/expert",
    f"{BAKED_ARTIFACTS}/*",
    f"!{BAKED_ARTIFACTS}/README.md",
    "**/__pycache__",
]
_BACKBONE_CONTEXT = [
    "*",
    "!pyproject.toml",
    "!README.md",
    "!constraints.txt",
    "!moeless",
    "!cli",
    "!backbone_service",
    "**/__pycache__",
]


class ExpertImages:
    """Hands out each function's image code; one shared image unless experts are baked in."""

    def __init__(self, scope: Construct, config: DeployConfig) -> None:
        self.config = config
        self.repository = repository(scope, config, "expert")
        self._shared: lambda_.DockerImageCode | None = None
        self._staged: Path | None = None
        if config.image_tag and config.expert_code == "image":
            raise DeployConfigError(
                "moeless:imageTag deploys one pre-built expert image, which cannot bake in each "
                "function's experts: use moeless:expertCode=s3 with it"
            )

    def code_for(self, experts: list[tuple[int, int]]) -> lambda_.DockerImageCode:
        if self.config.image_tag:
            return lambda_.DockerImageCode.from_ecr(self.repository, tag_or_digest=self.config.image_tag)
        if self.config.expert_code == "s3":
            if self._shared is None:
                self._shared = lambda_.DockerImageCode.from_image_asset(
                    str(REPO_ROOT),
                    file=EXPERT_DOCKERFILE,
                    exclude=_EXPERT_CONTEXT,
                    ignore_mode=IgnoreMode.DOCKER,
                    platform=PLATFORM,
                )
            return self._shared
        context = self._staged_context()
        hosted = [f"!{BAKED_ARTIFACTS}/{self.config.manifest.expert(*pair).file}" for pair in experts]
        return lambda_.DockerImageCode.from_image_asset(
            str(context),
            file=EXPERT_DOCKERFILE,
            exclude=["**/__pycache__", f"{BAKED_ARTIFACTS}/experts/*", *hosted],
            ignore_mode=IgnoreMode.DOCKER,
            platform=PLATFORM,
        )

    def _staged_context(self) -> Path:
        """The expert image's build context with the whole package under ``functions/expert/artifacts``."""
        if self._staged is not None:
            return self._staged
        staged = REPO_ROOT / "cdk" / ".staging" / self.config.stage / "expert"
        shutil.rmtree(staged, ignore_errors=True)
        ignore = shutil.ignore_patterns("__pycache__", "artifacts")
        shutil.copytree(REPO_ROOT / "moeless", staged / "moeless", ignore=ignore, copy_function=_link)
        shutil.copytree(REPO_ROOT / "functions/expert", staged / "functions/expert", ignore=ignore)
        baked = staged / BAKED_ARTIFACTS
        baked.mkdir(parents=True)
        _link(self.config.artifacts / MANIFEST_NAME, baked / MANIFEST_NAME)
        for entry in self.config.manifest.experts:
            (baked / entry.file).parent.mkdir(parents=True, exist_ok=True)
            _link(self.config.artifacts / entry.file, baked / entry.file)
        self._staged = staged
        return staged


def repository(scope: Construct, config: DeployConfig, image: str) -> ecr.IRepository:
    """The Artifacts stack's repository for ``image``, found by its name (no cross-stack export)."""
    return ecr.Repository.from_repository_name(
        scope, f"{image.title()}Repository", config.names.repository(image)
    )


def backbone_image(scope: Construct, config: DeployConfig) -> ecs.ContainerImage:
    if config.image_tag:
        return ecs.ContainerImage.from_ecr_repository(
            repository(scope, config, "backbone"), tag=config.image_tag
        )
    return ecs.ContainerImage.from_asset(
        str(REPO_ROOT),
        file=BACKBONE_DOCKERFILE,
        exclude=_BACKBONE_CONTEXT,
        ignore_mode=IgnoreMode.DOCKER,
        platform=PLATFORM,
    )


def _link(source: Path | str, target: Path | str) -> None:
    """Hard-link (a package can be gigabytes); copy across file systems."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
