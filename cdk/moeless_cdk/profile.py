"""Deployment targets: AWS, or the profile of the app that LocalStack can run without Docker.

LocalStack's core (the free runtime, a plain process) serves S3, IAM, STS, CloudWatch Logs, SSM,
CloudFormation, EC2 VPCs and API Gateway REST APIs, accepts Lambda functions without running
them, and has no ECR, ECS, ELBv2, Auto Scaling or WAFv2 API. Its CloudFormation also creates
resources of types it lacks as silent no-ops (its strict mode refuses every type when it cannot
reach its online catalogue), so a profile that kept them would deploy "green" and prove
nothing. ``moeless:target=localstack`` therefore keeps every resource the emulator really
implements and leaves out, by name, the ones it cannot run: each stack records what it left out
as a synth-time annotation, ``localstack/README.md`` lists them, ``test_cdk_app.py`` checks that
none of their resource types is synthesised, and ``test_localstack.py`` reads every deployed
type back through its service API.
"""

from __future__ import annotations

from enum import StrEnum

from aws_cdk import Annotations, Stack


class Target(StrEnum):
    """Where the app deploys: ``moeless:target`` in the CDK context."""

    AWS = "aws"
    LOCALSTACK = "localstack"


# What moeless:target=localstack leaves out, by name -> why LocalStack without Docker cannot run it.
LEFT_OUT_ON_LOCALSTACK = {
    "ECR repositories": "no ECR API in LocalStack's core",
    "expert functions, their versions and aliases": "LocalStack's CloudFormation fails a function "
    "whose runtime-init binary it cannot download, and only Docker runs function code; the "
    "Lambda API accepts them (the cloud mirror creates them) and the local Lambda host runs them",
    "ECS cluster, capacity provider, task definition and service": "no ECS API in LocalStack's core",
    "GPU Auto Scaling group and launch template": "no Auto Scaling API in LocalStack's core",
    "Network Load Balancer and target group": "no ELBv2 API in LocalStack's core",
    "task scaling policy": "no Application Auto Scaling API in LocalStack's core",
    "VPC flow log": "LocalStack's CloudFormation has no AWS::EC2::FlowLog",
    "security group rules between groups": "LocalStack's CloudFormation has no "
    "AWS::EC2::SecurityGroupIngress/Egress; the groups keep their address-range rules",
    "NAT gateway and private subnets with egress": "nothing in the profile needs egress; the VPC "
    "keeps public and isolated subnets",
    "Lambda-backed custom resources (default security group restriction)": "LocalStack runs no "
    "Lambda code without Docker",
    "VPC link": "the API's integration calls the backbone URL (moeless:backboneUrl) directly",
    "WAF web ACL and its association": "no WAFv2 API in LocalStack's core",
}


def left_out(stack: Stack, *names: str) -> None:
    """Record on ``stack`` (``cdk synth`` prints it) which of :data:`LEFT_OUT_ON_LOCALSTACK` it omits."""
    for name in names:
        Annotations.of(stack).add_info(
            f"moeless:target=localstack leaves out {name}: {LEFT_OUT_ON_LOCALSTACK[name]}"
        )
