"""The app's four stacks and their order: Artifacts -> Experts -> Backbone -> Api."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import App, Tags

from moeless_cdk.api import ApiStack
from moeless_cdk.artifacts import ArtifactsStack
from moeless_cdk.backbone import BackboneStack
from moeless_cdk.config import DeployConfig
from moeless_cdk.experts import ExpertsStack
from moeless_cdk.nag import add_checks


@dataclass
class MoelessStacks:
    artifacts: ArtifactsStack
    experts: ExpertsStack
    backbone: BackboneStack
    api: ApiStack


def build_app(app: App, config: DeployConfig, nag: bool = True) -> MoelessStacks:
    """Add one deployment's stacks to ``app`` (environment-agnostic: synthesises offline)."""
    prefix = config.names.stack_prefix
    artifacts = ArtifactsStack(app, f"{prefix}-Artifacts", config)
    experts = ExpertsStack(app, f"{prefix}-Experts", config)
    experts.add_stack_dependency(artifacts, "the functions' images and package live in the artifacts stores")
    backbone = BackboneStack(app, f"{prefix}-Backbone", config)
    backbone.add_stack_dependency(experts, "the backbone invokes the expert functions")
    api = ApiStack(app, f"{prefix}-Api", config, backbone)
    for stack in (artifacts, experts, backbone, api):
        Tags.of(stack).add("moeless:stage", config.stage)
    if nag:
        add_checks(app)
    return MoelessStacks(artifacts, experts, backbone, api)
