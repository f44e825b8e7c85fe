"""The deployment's control plane, created through the AWS APIs of an emulator (moto, LocalStack).

``moeless deploy --local --aws-endpoint URL`` calls :func:`mirror_deployment`: the same bucket,
package objects, image repositories, expert functions (memory, environment, reserved
concurrency, version and ``live`` alias), and REST API (routes, API key, usage plan) that the
CDK app declares, made with boto3 calls, so the provisioning code runs end to end against a
real AWS API implementation without an account. Every call is get-or-create: a re-run updates.

What emulators lack is said, not faked: moto implements no provisioned-concurrency calls and
runs no container-image function without Docker, so provisioned concurrency is applied to the
local Lambda host (which serves the invokes) and reported as such. An API the emulator does not
implement at all (LocalStack's core answers ECR calls with 501) is skipped and reported too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moeless.contracts.environment import ALIAS, EXPERT_TIMEOUT_S, EXPERTS, EXPERTS_URI, encode_expert_list
from moeless.contracts.plan import Plan
from moeless.contracts.rest import PUBLIC_ROUTES
from moeless.deployment.stage import StageNames

LAMBDA_ASSUME_ROLE = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
    ],
}


@dataclass
class MirrorReport:
    bucket: str
    functions: list[str] = field(default_factory=list)
    repositories: list[str] = field(default_factory=list)
    api_id: str = ""
    api_key: str = ""
    notes: list[str] = field(default_factory=list)


def _exists(exc: Exception) -> bool:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
    return code in {
        "BucketAlreadyOwnedByYou",
        "RepositoryAlreadyExistsException",
        "EntityAlreadyExists",
        "ResourceConflictException",
        "ConflictException",
    }


def _not_emulated(exc: Exception) -> bool:
    """The emulator has no such API (HTTP 501), as LocalStack's core answers for ECR."""
    return getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode") == 501


def mirror_deployment(
    session: Any,
    artifacts: Path,
    plan: Plan,
    stage: str,
    backbone_url: str,
    endpoint_url: str,
    say: Callable[[str], None] = lambda _message: None,
) -> MirrorReport:
    """Create (or update) one stage's resources on the emulator at ``endpoint_url``.

    Args:
        plan: as the planner wrote it; deployed under ``moeless-STAGE-`` names.
        backbone_url: where the API's routes send requests (the local backbone service).
    """
    from botocore.exceptions import ClientError

    from moeless.artifacts.store import upload_artifacts
    from moeless.contracts.manifest import load_manifest

    def client(service: str) -> Any:
        return session.client(service, endpoint_url=endpoint_url)

    account = client("sts").get_caller_identity()["Account"]
    region = session.region_name or "us-east-1"
    names = StageNames(stage)
    deployed = plan.prefixed(names.function_prefix)
    report = MirrorReport(bucket=names.bucket(account, region))
    artifacts_uri = f"s3://{report.bucket}/{names.package_prefix(load_manifest(artifacts).digest())}"

    say(f"emulator: bucket {report.bucket} and the package")
    s3 = client("s3")
    try:
        create: dict[str, Any] = {"Bucket": report.bucket}
        if region != "us-east-1":
            create["CreateBucketConfiguration"] = {"LocationConstraint": region}
        s3.create_bucket(**create)
    except ClientError as exc:
        if not _exists(exc):
            raise
    s3.put_bucket_versioning(Bucket=report.bucket, VersioningConfiguration={"Status": "Enabled"})
    upload_artifacts(s3, artifacts, artifacts_uri)
    s3.put_object(
        Bucket=report.bucket, Key=names.plan_key(plan.digest()), Body=json.dumps(plan.to_dict()).encode()
    )

    ecr = client("ecr")
    for image in ("expert", "backbone"):
        name = names.repository(image)
        try:
            ecr.create_repository(repositoryName=name, imageScanningConfiguration={"scanOnPush": True})
        except ClientError as exc:
            if _not_emulated(exc):
                report.notes.append(
                    "image repositories are not created: the emulator has no ECR API (the "
                    "functions name the image they would run)"
                )
                break
            if not _exists(exc):
                raise
        report.repositories.append(name)

    say(f"emulator: {len(deployed.functions)} expert functions with their alias '{ALIAS}'")
    role_arn = _expert_role(client("iam"), names.repository("expert"))
    image_uri = f"{account}.dkr.ecr.{region}.amazonaws.com/{names.repository('expert')}:latest"
    lam = client("lambda")
    for spec in deployed.functions:
        _function(lam, spec, role_arn, image_uri, artifacts_uri)
        report.functions.append(spec.name)
    if any(spec.provisioned_concurrency for spec in deployed.functions):
        report.notes.append(
            "provisioned concurrency is applied on the local Lambda host: the emulator has no "
            "provisioned-concurrency API"
        )

    say("emulator: REST API, API key and usage plan")
    report.api_id, report.api_key = _rest_api(client("apigateway"), names, backbone_url)
    return report


def _expert_role(iam: Any, name: str) -> str:
    from botocore.exceptions import ClientError

    try:
        return iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(LAMBDA_ASSUME_ROLE))[
            "Role"
        ]["Arn"]
    except ClientError as exc:
        if not _exists(exc):
            raise
        return iam.get_role(RoleName=name)["Role"]["Arn"]


def _function(lam: Any, spec: Any, role_arn: str, image_uri: str, artifacts_uri: str) -> None:
    from botocore.exceptions import ClientError

    environment = {
        "Variables": {
            EXPERTS: encode_expert_list(spec.experts),
            EXPERTS_URI: artifacts_uri,
        }
    }
    try:
        lam.create_function(
            FunctionName=spec.name,
            Role=role_arn,
            PackageType="Image",
            Code={"ImageUri": image_uri},
            MemorySize=spec.memory_mb,
            Timeout=EXPERT_TIMEOUT_S,
            Environment=environment,
        )
    except ClientError as exc:
        if not _exists(exc):
            raise
        lam.update_function_configuration(
            FunctionName=spec.name, MemorySize=spec.memory_mb, Environment=environment
        )
    version = lam.publish_version(FunctionName=spec.name)["Version"]
    try:
        lam.create_alias(FunctionName=spec.name, Name=ALIAS, FunctionVersion=version)
    except ClientError as exc:
        if not _exists(exc):
            raise
        lam.update_alias(FunctionName=spec.name, Name=ALIAS, FunctionVersion=version)
    if spec.reserved_concurrency is None:
        lam.delete_function_concurrency(FunctionName=spec.name)
    else:
        lam.put_function_concurrency(
            FunctionName=spec.name, ReservedConcurrentExecutions=spec.reserved_concurrency
        )


def _rest_api(apigw: Any, names: StageNames, backbone_url: str) -> tuple[str, str]:
    """The REST API with the CDK app's routes, proxied to ``backbone_url``; returns (id, key value)."""
    name, stage = names.api_name, names.stage
    existing = [api for api in apigw.get_rest_apis()["items"] if api["name"] == name]
    api_id = existing[0]["id"] if existing else apigw.create_rest_api(name=name, apiKeySource="HEADER")["id"]
    resources = {r["path"]: r["id"] for r in apigw.get_resources(restApiId=api_id)["items"]}

    def resource(path: str) -> str:
        if path not in resources:
            parent, _, part = path.rpartition("/")
            resources[path] = apigw.create_resource(
                restApiId=api_id, parentId=resource(parent or "/"), pathPart=part
            )["id"]
        return resources[path]

    for route in PUBLIC_ROUTES:
        rid = resource(route.path)
        parameters = re.findall(r"{(\w+)}", route.path)
        apigw.put_method(
            restApiId=api_id,
            resourceId=rid,
            httpMethod=route.method,
            authorizationType="NONE",
            apiKeyRequired=True,
            requestParameters={f"method.request.path.{name}": True for name in parameters},
        )
        apigw.put_integration(
            restApiId=api_id,
            resourceId=rid,
            httpMethod=route.method,
            type="HTTP_PROXY",
            integrationHttpMethod=route.method,
            uri=f"{backbone_url.rstrip('/')}{route.path}",
            requestParameters={
                f"integration.request.path.{name}": f"method.request.path.{name}" for name in parameters
            },
        )
    apigw.create_deployment(restApiId=api_id, stageName=stage)
    keys = [k for k in apigw.get_api_keys(nameQuery=name, includeValues=True)["items"] if k["name"] == name]
    key = keys[0] if keys else apigw.create_api_key(name=name, enabled=True)
    plans = [p for p in apigw.get_usage_plans()["items"] if p["name"] == name]
    if not plans:
        plan_id = apigw.create_usage_plan(
            name=name,
            apiStages=[{"apiId": api_id, "stage": stage}],
            throttle={"rateLimit": 50.0, "burstLimit": 100},
            quota={"limit": 100_000, "period": "DAY"},
        )["id"]
        apigw.create_usage_plan_key(usagePlanId=plan_id, keyId=key["id"], keyType="API_KEY")
    return api_id, key["value"]
