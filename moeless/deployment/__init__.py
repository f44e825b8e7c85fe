"""Putting a package and plan on AWS: the CDK CLI driver, the control-plane mirror for emulators,
and the names every stage derives."""

from moeless.deployment.cloud_mirror import mirror_deployment
from moeless.deployment.deploy import DeployError, DeployRequest, deploy, destroy, synthesize
from moeless.deployment.stage import StageNames

__all__ = [
    "DeployError",
    "DeployRequest",
    "StageNames",
    "deploy",
    "destroy",
    "mirror_deployment",
    "synthesize",
]
