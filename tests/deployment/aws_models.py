"""Synthesised CloudFormation resources checked against the AWS service models that botocore ships:
the APIs CloudFormation calls to create each resource.

CloudFormation's own schema (what cfn-lint reads) misses ranges that only the service knows: an
ECS container health check with ``StartPeriod: 600`` passes cfn-lint and fails
``RegisterTaskDefinition`` (0-300 s). The service models carry them: as ``min``/``max``/``enum``
metadata, or, for many integers, only in the member's documentation ("You can specify between 0
and 300 seconds"), which is read here too.

Properties are matched to the operation's input members by name (case and punctuation aside);
intrinsic functions (``Ref``, ``Fn::*``) and members the API does not share with CloudFormation
are skipped, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import botocore.session

# resource type -> (service, operation, the path to the properties the operation takes)
OPERATIONS: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
    "AWS::ECS::TaskDefinition": [("ecs", "RegisterTaskDefinition", ())],
    "AWS::ECS::Service": [("ecs", "CreateService", ())],
    "AWS::ECS::Cluster": [("ecs", "CreateCluster", ())],
    "AWS::Lambda::Function": [("lambda", "CreateFunction", ())],
    "AWS::Lambda::Alias": [("lambda", "CreateAlias", ())],
    "AWS::Lambda::Version": [("lambda", "PublishVersion", ())],
    "AWS::ApiGateway::Method": [
        ("apigateway", "PutMethod", ()),
        ("apigateway", "PutIntegration", ("Integration",)),
    ],
    "AWS::ApiGateway::RestApi": [("apigateway", "CreateRestApi", ())],
    "AWS::ApiGateway::UsagePlan": [("apigateway", "CreateUsagePlan", ())],
    "AWS::ApiGateway::Model": [("apigateway", "CreateModel", ())],
    "AWS::ApiGateway::RequestValidator": [("apigateway", "CreateRequestValidator", ())],
    "AWS::ApiGateway::VpcLink": [("apigateway", "CreateVpcLink", ())],
    "AWS::ElasticLoadBalancingV2::LoadBalancer": [
        ("elbv2", "CreateLoadBalancer", ()),
        ("elbv2", "SetSecurityGroups", ()),
    ],
    "AWS::ElasticLoadBalancingV2::TargetGroup": [("elbv2", "CreateTargetGroup", ())],
    "AWS::ElasticLoadBalancingV2::Listener": [("elbv2", "CreateListener", ())],
    "AWS::AutoScaling::AutoScalingGroup": [("autoscaling", "CreateAutoScalingGroup", ())],
    "AWS::EC2::LaunchTemplate": [("ec2", "CreateLaunchTemplate", ())],
    "AWS::EC2::VPCEndpoint": [("ec2", "CreateVpcEndpoint", ())],
    "AWS::Logs::LogGroup": [("logs", "CreateLogGroup", ()), ("logs", "PutRetentionPolicy", ())],
    "AWS::WAFv2::WebACL": [("wafv2", "CreateWebACL", ())],
    "AWS::ECR::Repository": [("ecr", "CreateRepository", ())],
    "AWS::ApplicationAutoScaling::ScalableTarget": [
        ("application-autoscaling", "RegisterScalableTarget", ())
    ],
    "AWS::ApplicationAutoScaling::ScalingPolicy": [("application-autoscaling", "PutScalingPolicy", ())],
}
STREAM_TIMEOUT_MS = 900_000
"""A streamed integration may run 15 minutes, where the model's text still says 50-29,000 ms
(https://docs.aws.amazon.com/apigateway/latest/developerguide/response-streaming-http.html)."""
_RANGE_IN_DOCS = re.compile(r"between\s+(-?\d[\d,]*)\s+and\s+(-?\d[\d,]*)", re.IGNORECASE)
_SESSION = botocore.session.get_session()


@dataclass(frozen=True)
class Finding:
    resource: str
    operation: str
    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.resource} ({self.operation}) {self.path}: {self.problem}"


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _intrinsic(value: Any) -> bool:
    return (isinstance(value, dict) and len(value) == 1 and next(iter(value)) in ("Ref", "Condition")) or (
        isinstance(value, dict) and any(key.startswith("Fn::") for key in value)
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d+)?", value):
        return float(value)
    return None


def _bounds(shape: Any) -> tuple[float | None, float | None]:
    low, high = shape.metadata.get("min"), shape.metadata.get("max")
    if (low is None or high is None) and shape.type_name in ("integer", "long"):
        found = _RANGE_IN_DOCS.search(re.sub(r"<[^>]+>", "", shape.documentation or ""))
        if found:
            low = low if low is not None else float(found.group(1).replace(",", ""))
            high = high if high is not None else float(found.group(2).replace(",", ""))
    return low, high


def check_value(value: Any, shape: Any, path: str) -> list[tuple[str, str]]:
    """(path, problem) for each value out of ``shape``'s range, enum or length."""
    if _intrinsic(value):
        return []
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        members = {_key(name): member for name, member in shape.members.items()}
        problems = []
        for name, item in value.items():
            if member := members.get(_key(name)):
                problems += check_value(item, member, f"{path}.{name}")
        return problems
    if kind == "list" and isinstance(value, list):
        problems = []
        low, high = shape.metadata.get("min"), shape.metadata.get("max")
        if (low is not None and len(value) < low) or (high is not None and len(value) > high):
            problems.append((path, f"{len(value)} items, the API takes {low}-{high}"))
        for index, item in enumerate(value):
            problems += check_value(item, shape.member, f"{path}[{index}]")
        return problems
    if kind == "map" and isinstance(value, dict):
        return [p for key, item in value.items() for p in check_value(item, shape.value, f"{path}.{key}")]
    if kind in ("integer", "long", "double", "float"):
        number = _number(value)
        low, high = _bounds(shape)
        if number is not None and (
            (low is not None and number < low) or (high is not None and number > high)
        ):
            return [
                (
                    path,
                    f"{value} is outside {low:g}-{high:g}"
                    if low is not None and high is not None
                    else f"{value} out of range",
                )
            ]
        return []
    if kind == "string" and isinstance(value, str):
        if shape.enum and value not in shape.enum:
            return [(path, f"{value!r} is not one of {shape.enum}")]
        low, high = shape.metadata.get("min"), shape.metadata.get("max")
        if (low is not None and len(value) < low) or (high is not None and len(value) > high):
            return [(path, f"{len(value)} characters, the API takes {low}-{high}")]
    return []


def check_template(template: dict[str, Any]) -> list[Finding]:
    """Every finding in a template's resources of the types :data:`OPERATIONS` knows."""
    findings = []
    for logical_id, resource in template.get("Resources", {}).items():
        for service, operation, where in OPERATIONS.get(resource["Type"], []):
            properties: Any = resource.get("Properties", {})
            for step in where:
                properties = properties.get(step, {})
            shape = _SESSION.get_service_model(service).operation_model(operation).input_shape
            findings += [
                Finding(logical_id, f"{service}:{operation}", path, problem)
                for path, problem in check_value(properties, shape, "")
                if not _streamed_timeout(operation, path, properties)
            ]
    return findings


def _streamed_timeout(operation: str, path: str, properties: dict[str, Any]) -> bool:
    """A streamed integration's timeout within the 15 minutes AWS documents for streaming."""
    return (
        operation == "PutIntegration"
        and path == ".TimeoutInMillis"
        and properties.get("ResponseTransferMode") == "STREAM"
        and _number(properties["TimeoutInMillis"]) is not None
        and float(properties["TimeoutInMillis"]) <= STREAM_TIMEOUT_MS
    )


def covered_types(template: dict[str, Any]) -> set[str]:
    return {r["Type"] for r in template.get("Resources", {}).values()} & set(OPERATIONS)
