"""The deployment against a running LocalStack (its core runtime as a plain process, no Docker;
``make test`` starts one through localstack/with_localstack.sh and names it in MOELESS_TEST_LOCALSTACK).

Two paths, as a user takes them: ``moeless deploy --local --aws-endpoint`` (the cloud mirror, and
the local service behind it), and the CDK app's ``moeless:target=localstack`` profile bootstrapped,
deployed, re-deployed and destroyed with the pinned CDK CLI. Every check reads the resources back
through the service APIs (boto3 against the endpoint), never the stack status: LocalStack's
CloudFormation creates types it lacks as silent no-ops, and has reported a parent stack
CREATE_COMPLETE over a failed nested one. What the profile leaves out, and why, is in
``moeless_cdk/profile.py``; ``test_cdk_app.py`` asserts that none of it is synthesised.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ENDPOINT = os.environ.get("MOELESS_TEST_LOCALSTACK", "")
pytestmark = pytest.mark.skipif(
    not ENDPOINT,
    reason="no LocalStack: MOELESS_TEST_LOCALSTACK is unset (`make test` starts one where Python 3.13 "
    "is installed: localstack/with_localstack.sh, localstack/README.md)",
)

boto3 = pytest.importorskip("boto3", reason="needs the [deploy] extra")

from botocore.exceptions import ClientError  # noqa: E402

from moeless.checkout import CDK_APP_DIR  # noqa: E402
from moeless.contracts.manifest import load_manifest  # noqa: E402
from moeless.contracts.rest import PUBLIC_ROUTES  # noqa: E402
from moeless.deployment.deploy import (  # noqa: E402
    NODE_ENV,
    DeployError,
    DeployRequest,
    DeployResult,
    cdk_cli,
    deploy,
    destroy,
    synthesize,
)
from moeless.deployment.stage import StageNames  # noqa: E402
from tests.deployment.test_deploy import free_port, planned  # noqa: E402
from tests.serving.test_serving import reference_ids  # noqa: E402

ACCOUNT, REGION = "000000000000", "us-east-1"  # LocalStack's default account
MIRROR, CDK = StageNames("lsmirror"), StageNames("lscdk")
PROMPT, MAX_TOKENS = "The quick brown fox", 8
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": REGION}


def client(service: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=ENDPOINT,
        region_name=REGION,
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


def stage_url(api_id: str, stage: str, path: str) -> str:
    """A REST API stage's route on LocalStack's gateway (its path form: no DNS needed)."""
    return f"{ENDPOINT}/restapis/{api_id}/{stage}/_user_request_{path}"


def post(url: str, body: dict, api_key: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"} | ({"x-api-key": api_key} if api_key else {})
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def get(url: str, api_key: str) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"x-api-key": api_key})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def api_named(name: str) -> dict | None:
    return next((a for a in client("apigateway").get_rest_apis()["items"] if a["name"] == name), None)


@dataclass
class LocalDeploy:
    """``moeless deploy --local --aws-endpoint``: the service's URL, its package and its stderr."""

    url: str
    artifacts: Path
    model: Path
    stderr: Path


@pytest.fixture(scope="module")
def local_deploy(tiny, tmp_path_factory) -> Iterator[LocalDeploy]:
    """The user's command, run until SIGTERM: mirror on LocalStack, then serve on this machine."""
    tmp = tmp_path_factory.mktemp("ls-local")
    artifacts = tiny.package()
    planned(artifacts).save(tmp / "plan.json")
    port = free_port()
    command = [
        str(Path(sys.executable).with_name("moeless")),
        "deploy",
        str(artifacts),
        "--plan",
        str(tmp / "plan.json"),
        "--stage",
        MIRROR.stage,
        "--local",
        "--aws-endpoint",
        ENDPOINT,
        "--port",
        str(port),
    ]
    stderr = tmp / "stderr.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | CREDENTIALS
    with stderr.open("w") as err:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        line = process.stdout.readline()
        assert line.startswith(f"REST endpoint: http://127.0.0.1:{port}"), line + stderr.read_text()
        yield LocalDeploy(f"http://127.0.0.1:{port}", artifacts, tiny.model(), stderr)
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    assert process.returncode == 0, stderr.read_text()[-3000:]


@pytest.fixture(scope="module")
def unsplit_text(local_deploy) -> str:
    """Greedy ``generate`` of the unsplit checkpoint for PROMPT, as text."""
    from transformers import AutoTokenizer

    ids = reference_ids(local_deploy.model, [PROMPT], MAX_TOKENS)[0]
    return AutoTokenizer.from_pretrained(local_deploy.model).decode(ids, skip_special_tokens=True)


def completion(artifacts: Path) -> dict:
    return {"model": artifacts.name, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}


class TestMirror:
    def test_localstack_mirror_creates_the_stage_and_reports_what_the_emulator_lacks(self, local_deploy):
        plan = planned(local_deploy.artifacts).prefixed(MIRROR.function_prefix)
        lam = client("lambda")
        functions = {
            f["FunctionName"]: f
            for f in lam.list_functions()["Functions"]
            if f["FunctionName"].startswith(MIRROR.function_prefix)
        }
        assert sorted(functions) == sorted(spec.name for spec in plan.functions)
        first = plan.functions[0]
        assert functions[first.name]["MemorySize"] == first.memory_mb == 3008
        assert functions[first.name]["PackageType"] == "Image"
        variables = functions[first.name]["Environment"]["Variables"]
        assert variables["MOELESS_EXPERTS"] == ",".join(f"{layer}:{e}" for layer, e in first.experts)
        assert lam.get_function_concurrency(FunctionName=first.name)["ReservedConcurrentExecutions"] == 4
        assert lam.get_alias(FunctionName=first.name, Name="live")["FunctionVersion"] == "1"

        bucket = MIRROR.bucket(ACCOUNT, REGION)
        keys = {o["Key"] for o in client("s3").list_objects_v2(Bucket=bucket)["Contents"]}
        digest = load_manifest(local_deploy.artifacts).digest()
        package = MIRROR.package_prefix(digest)
        assert {MIRROR.plan_key(planned(local_deploy.artifacts).digest()), f"{package}/manifest.json"} <= keys
        assert variables["MOELESS_EXPERTS_URI"] == f"s3://{bucket}/{package}"

        api = api_named(MIRROR.api_name)
        assert api is not None
        paths = {r["path"]: r["id"] for r in client("apigateway").get_resources(restApiId=api["id"])["items"]}
        method = client("apigateway").get_method(
            restApiId=api["id"], resourceId=paths["/v1/completions"], httpMethod="POST"
        )
        assert method["apiKeyRequired"] is True
        assert method["methodIntegration"]["uri"] == f"{local_deploy.url}/v1/completions"

        said = local_deploy.stderr.read_text()
        assert "the emulator has no ECR API" in said  # LocalStack's core answers ECR with 501
        assert "provisioned concurrency is applied on the local Lambda host" in said
        with pytest.raises(ClientError, match="service ecr"):
            client("ecr").describe_repositories()

    def test_localstack_completion_through_the_mirrors_api_needs_the_key(self, local_deploy, unsplit_text):
        api = api_named(MIRROR.api_name)
        (key,) = [
            k
            for k in client("apigateway").get_api_keys(includeValues=True)["items"]
            if k["name"] == MIRROR.api_name
        ]
        url = stage_url(api["id"], MIRROR.stage, "/v1/completions")
        status, answer = post(url, completion(local_deploy.artifacts), key["value"])
        assert status == 200, answer
        assert answer["choices"][0]["text"] == unsplit_text
        assert post(url, completion(local_deploy.artifacts), None)[0] == 403


@dataclass
class CdkDeployment:
    request: DeployRequest
    result: DeployResult
    templates: dict[str, dict]  # stack name -> template (nested shards included)


def cdk_env() -> dict[str, str]:
    """What a user exports so that the CDK CLI and boto3 talk to LocalStack."""
    return CREDENTIALS | {"AWS_ENDPOINT_URL": ENDPOINT, "AWS_ENDPOINT_URL_S3": ENDPOINT}


@pytest.fixture(scope="module")
def cdk_deployment(local_deploy, tmp_path_factory) -> Iterator[CdkDeployment]:
    """Bootstrap, then ``moeless deploy``'s steps on one synthesised assembly of the profile."""
    try:
        cli = cdk_cli(CDK_APP_DIR)
    except DeployError as exc:
        pytest.skip(str(exc))
    tmp = tmp_path_factory.mktemp("ls-cdk")
    planned(local_deploy.artifacts).save(tmp / "plan.json")
    request = DeployRequest(
        local_deploy.artifacts,
        tmp / "plan.json",
        stage=CDK.stage,
        context={"moeless:target": "localstack", "moeless:backboneUrl": local_deploy.url},
    )
    request.assembly = synthesize(request, tmp / "assembly")
    with pytest.MonkeyPatch.context() as env:
        for key in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
            env.delenv(key, raising=False)
        for key, value in cdk_env().items():
            env.setenv(key, value)
        bootstrap = subprocess.run(
            [str(cli), "bootstrap", f"aws://{ACCOUNT}/{REGION}", "--no-notices"],
            cwd=tmp,  # not the app's folder: bootstrapping needs no synth
            env=os.environ | NODE_ENV,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert bootstrap.returncode == 0, bootstrap.stderr[-3000:]
        result = deploy(request, boto3.Session(region_name=REGION), say=lambda _m: None)
        templates = {
            path.name.split(".")[0]: json.loads(path.read_text())
            for path in request.assembly.glob("*.template.json")
        }
        yield CdkDeployment(request, result, templates)


def resources_of(deployment: CdkDeployment, kind: str) -> list[dict]:
    return [
        resource
        for template in deployment.templates.values()
        for resource in template["Resources"].values()
        if resource["Type"] == kind
    ]


def stage_roles() -> dict[str, dict]:
    """This stage's IAM roles (CloudFormation names them after their stack) with inline policies."""
    iam = client("iam")
    roles = [r for r in iam.list_roles()["Roles"] if r["RoleName"].startswith(f"{CDK.stack_prefix}-")]
    return {
        role["RoleName"]: role
        | {
            "policies": [
                iam.get_role_policy(RoleName=role["RoleName"], PolicyName=name)["PolicyDocument"]
                for name in iam.list_role_policies(RoleName=role["RoleName"])["PolicyNames"]
            ]
        }
        for role in roles
    }


def stage_vpcs() -> list[dict]:
    return client("ec2").describe_vpcs(Filters=[{"Name": "tag:moeless:stage", "Values": [CDK.stage]}])["Vpcs"]


def stage_log_groups() -> dict[str, dict]:
    groups = client("logs").describe_log_groups()["logGroups"]
    return {
        g["logGroupName"]: g
        for g in groups
        if g["logGroupName"].startswith((f"/aws/lambda/{CDK.function_prefix}", f"{CDK.stack_prefix}-"))
    }


def snapshot() -> dict[str, Any]:
    """The physical identity of every resource of the CDK stage, read through the service APIs."""
    apigw = client("apigateway")
    api = api_named(CDK.api_name)
    return {
        "api": api["id"] if api else None,
        "deployments": sorted(d["id"] for d in apigw.get_deployments(restApiId=api["id"])["items"])
        if api
        else [],
        "keys": sorted(k["id"] for k in apigw.get_api_keys()["items"] if k["name"] == CDK.api_name),
        "usage plans": sorted(p["id"] for p in apigw.get_usage_plans()["items"] if p["name"] == CDK.api_name),
        "roles": sorted((name, role["RoleId"]) for name, role in stage_roles().items()),
        "vpcs": sorted(v["VpcId"] for v in stage_vpcs()),
        "log groups": sorted((n, g["creationTime"]) for n, g in stage_log_groups().items()),
    }


# Every resource type the profile deploys -> the test below that reads it back through its API.
CHECKED = {
    "AWS::S3::Bucket": "test_localstack_bucket_is_versioned_tagged_and_tls_only",
    "AWS::S3::BucketPolicy": "test_localstack_bucket_is_versioned_tagged_and_tls_only",
    "AWS::IAM::Role": "test_localstack_roles_and_policies_name_only_this_stage",
    "AWS::IAM::Policy": "test_localstack_roles_and_policies_name_only_this_stage",
    "AWS::CloudFormation::Stack": "test_localstack_network_and_log_groups",  # the shard's log groups
    "AWS::Logs::LogGroup": "test_localstack_network_and_log_groups",
    "AWS::EC2::VPC": "test_localstack_network_and_log_groups",
    "AWS::EC2::Subnet": "test_localstack_network_and_log_groups",
    "AWS::EC2::InternetGateway": "test_localstack_network_and_log_groups",
    "AWS::EC2::VPCGatewayAttachment": "test_localstack_network_and_log_groups",
    "AWS::EC2::RouteTable": "test_localstack_network_and_log_groups",
    "AWS::EC2::SubnetRouteTableAssociation": "test_localstack_network_and_log_groups",
    "AWS::EC2::Route": "test_localstack_network_and_log_groups",
    "AWS::EC2::SecurityGroup": "test_localstack_network_and_log_groups",
    "AWS::ApiGateway::RestApi": "test_localstack_rest_api_with_its_routes_key_and_usage_plan",
    "AWS::ApiGateway::Resource": "test_localstack_rest_api_with_its_routes_key_and_usage_plan",
    "AWS::ApiGateway::Method": "test_localstack_rest_api_with_its_routes_key_and_usage_plan",
    "AWS::ApiGateway::Model": "test_localstack_rest_api_with_its_routes_key_and_usage_plan",
    "AWS::ApiGateway::RequestValidator": "test_localstack_rest_api_with_its_routes_key_and_usage_plan",
    "AWS::ApiGateway::Deployment": "test_localstack_rest_api_with_its_routes_key_and_usage_plan",
    "AWS::ApiGateway::Stage": "test_localstack_rest_api_with_its_routes_key_and_usage_plan",
    "AWS::ApiGateway::Account": "test_localstack_rest_api_with_its_routes_key_and_usage_plan",
    "AWS::ApiGateway::ApiKey": "test_localstack_rest_api_with_its_routes_key_and_usage_plan",
    "AWS::ApiGateway::UsagePlan": "test_localstack_rest_api_with_its_routes_key_and_usage_plan",
    "AWS::ApiGateway::UsagePlanKey": "test_localstack_rest_api_with_its_routes_key_and_usage_plan",
}


class TestCdkProfile:
    """In order: what the deploy made, a request through it, a re-deploy, a destroy."""

    def test_localstack_profile_deploys_only_types_checked_here(self, cdk_deployment):
        # a type LocalStack lacks would deploy as a silent no-op: each one deployed is read back below
        deployed = {r["Type"] for t in cdk_deployment.templates.values() for r in t["Resources"].values()}
        assert deployed == set(CHECKED)
        assert set(CHECKED.values()) <= set(dir(self))

    def test_localstack_bucket_is_versioned_tagged_and_tls_only(self, cdk_deployment):
        # LocalStack's CloudFormation applies only some of AWS::S3::Bucket's properties (name,
        # versioning, tags, CORS, notifications, object lock, website): encryption, public access
        # block, logging, lifecycle and ownership controls are dropped, and S3's defaults for the
        # first two would make a check here pass whatever the template said. The templates are
        # asserted for those (test_cdk_app.py::TestArtifacts).
        s3 = client("s3")
        bucket = cdk_deployment.result.outputs[f"{CDK.stack_prefix}-Artifacts"]["BucketName"]
        assert bucket == CDK.bucket(ACCOUNT, REGION)
        assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
        assert {"Key": "moeless:stage", "Value": CDK.stage} in s3.get_bucket_tagging(Bucket=bucket)["TagSet"]
        statements = json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])["Statement"]
        (deny,) = [s for s in statements if s["Effect"] == "Deny"]
        assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} and deny["Action"] == "s3:*"
        assert set(deny["Resource"]) == {f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"}
        # the access-log bucket: TLS only, and S3's log delivery may write to it from this bucket only
        (logs,) = [
            b["Name"]
            for b in s3.list_buckets()["Buckets"]
            if b["Name"].startswith(f"{CDK.stack_prefix.lower()}-artifacts-accesslogs")
        ]
        statements = json.loads(s3.get_bucket_policy(Bucket=logs)["Policy"])["Statement"]
        (delivery,) = [s for s in statements if s["Effect"] == "Allow"]
        assert delivery["Principal"] == {"Service": "logging.s3.amazonaws.com"}
        assert delivery["Condition"]["ArnLike"]["aws:SourceArn"] == f"arn:aws:s3:::{bucket}"

    def test_localstack_package_objects_carry_their_manifest_checksums(self, cdk_deployment):
        s3 = client("s3")
        bucket = CDK.bucket(ACCOUNT, REGION)
        manifest = load_manifest(cdk_deployment.request.artifacts)
        for entry in manifest.experts:
            key = f"{CDK.package_prefix(manifest.digest())}/{entry.file}"
            head = s3.head_object(Bucket=bucket, Key=key)
            assert head["Metadata"]["sha256"] == entry.sha256
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            assert hashlib.sha256(body).hexdigest() == entry.sha256 and len(body) == entry.bytes
        plan_key = CDK.plan_key(planned(cdk_deployment.request.artifacts).digest())
        plan = json.loads(s3.get_object(Bucket=bucket, Key=plan_key)["Body"].read())
        assert len(plan["functions"]) == len(manifest.experts)

    def test_localstack_roles_and_policies_name_only_this_stage(self, cdk_deployment):
        roles = stage_roles()
        trusted = {
            role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]["Service"]: role
            for role in roles.values()
        }
        assert set(trusted) >= {"lambda.amazonaws.com", "ecs-tasks.amazonaws.com"}
        assert len(roles) == len(resources_of(cdk_deployment, "AWS::IAM::Role"))

        def actions_by_resource(role: dict) -> dict[str, set[str]]:
            found: dict[str, set[str]] = {}
            for document in role["policies"]:
                for statement in document["Statement"]:
                    for resource in _list(statement["Resource"]):
                        found.setdefault(resource, set()).update(_list(statement["Action"]))
            return found

        functions = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{CDK.function_prefix}*"
        backbone = actions_by_resource(trusted["ecs-tasks.amazonaws.com"])
        assert backbone[f"{functions}:live"] >= {
            "lambda:InvokeFunction",
            "lambda:PutProvisionedConcurrencyConfig",
        }
        assert backbone[functions] >= {"lambda:PutFunctionConcurrency"}
        assert backbone[f"arn:aws:s3:::{CDK.bucket(ACCOUNT, REGION)}/{CDK.stage}/*"] == {"s3:GetObject"}
        experts = actions_by_resource(trusted["lambda.amazonaws.com"])
        package = f"arn:aws:s3:::{CDK.bucket(ACCOUNT, REGION)}/{CDK.artifacts_prefix}/*"
        assert experts[package] == {"s3:GetObject"}
        log_groups = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/lambda/{CDK.function_prefix}*"
        assert experts[log_groups] == {"logs:CreateLogStream", "logs:PutLogEvents"}
        assert "*" not in experts and "*" not in backbone

    def test_localstack_rest_api_with_its_routes_key_and_usage_plan(self, cdk_deployment):
        apigw = client("apigateway")
        api = api_named(CDK.api_name)
        assert api is not None and api["apiKeySource"] == "HEADER"
        assert cdk_deployment.result.endpoint.startswith(f"https://{api['id']}.")
        resources = {r["path"]: r for r in apigw.get_resources(restApiId=api["id"])["items"]}
        assert {route.path for route in PUBLIC_ROUTES} <= set(resources)
        for route in PUBLIC_ROUTES:
            found = apigw.get_method(
                restApiId=api["id"], resourceId=resources[route.path]["id"], httpMethod=route.method
            )
            assert found["apiKeyRequired"] is True
            assert found["methodIntegration"]["type"] == "HTTP_PROXY"
            assert (
                found["methodIntegration"]["uri"]
                == f"{cdk_deployment.request.context['moeless:backboneUrl']}{route.path}"
            )
        (validator,) = apigw.get_request_validators(restApiId=api["id"])["items"]
        assert validator["validateRequestBody"] is True
        (model,) = [m for m in apigw.get_models(restApiId=api["id"])["items"] if "Completion" in m["name"]]
        assert json.loads(model["schema"])["required"] == ["model", "prompt"]

        (key,) = [k for k in apigw.get_api_keys()["items"] if k["name"] == CDK.api_name]
        assert (
            key["enabled"]
            and key["id"] == cdk_deployment.result.outputs[f"{CDK.stack_prefix}-Api"]["ApiKeyId"]
        )
        (plan,) = [p for p in apigw.get_usage_plans()["items"] if p["name"] == CDK.api_name]
        (declared,) = resources_of(cdk_deployment, "AWS::ApiGateway::UsagePlan")
        assert plan["throttle"] == {
            "rateLimit": declared["Properties"]["Throttle"]["RateLimit"],
            "burstLimit": declared["Properties"]["Throttle"]["BurstLimit"],
        }
        assert (plan["quota"]["limit"], plan["quota"]["period"]) == (
            declared["Properties"]["Quota"]["Limit"],
            declared["Properties"]["Quota"]["Period"],
        )
        assert plan["apiStages"][0]["apiId"] == api["id"] and plan["apiStages"][0]["stage"] == CDK.stage
        assert [k["id"] for k in apigw.get_usage_plan_keys(usagePlanId=plan["id"])["items"]] == [key["id"]]
        stage = apigw.get_stage(restApiId=api["id"], stageName=CDK.stage)
        assert stage["deploymentId"] in {d["id"] for d in apigw.get_deployments(restApiId=api["id"])["items"]}
        assert stage["tracingEnabled"] is True
        destination = stage["accessLogSettings"]["destinationArn"].rsplit(":", 1)[-1]
        assert destination in stage_log_groups()
        # API Gateway's account-level role for writing those logs
        role = apigw.get_account()["cloudwatchRoleArn"].rsplit("/", 1)[-1]
        assert role in stage_roles()

    def test_localstack_network_and_log_groups(self, cdk_deployment):
        ec2 = client("ec2")
        (vpc,) = stage_vpcs()
        in_vpc = [{"Name": "vpc-id", "Values": [vpc["VpcId"]]}]
        subnets = {s["SubnetId"]: s for s in ec2.describe_subnets(Filters=in_vpc)["Subnets"]}
        assert len(subnets) == len(resources_of(cdk_deployment, "AWS::EC2::Subnet")) == 4
        (gateway,) = ec2.describe_internet_gateways(
            Filters=[{"Name": "attachment.vpc-id", "Values": [vpc["VpcId"]]}]
        )["InternetGateways"]
        # two public subnets have a default route, two isolated ones none; no NAT. (LocalStack
        # keeps the route but drops its target, the gateway: only the templates show that one.)
        default_route = {}
        for table in ec2.describe_route_tables(Filters=in_vpc)["RouteTables"]:
            destinations = {r.get("DestinationCidrBlock") for r in table["Routes"]}
            for association in table["Associations"]:
                if association.get("SubnetId"):
                    default_route[association["SubnetId"]] = "0.0.0.0/0" in destinations
        assert set(default_route) == set(subnets)
        assert sorted(default_route.values()) == [False, False, True, True]
        assert gateway["Attachments"][0]["State"] == "available"
        assert not ec2.describe_nat_gateways(Filters=in_vpc)["NatGateways"]

        # the groups exist in the VPC as declared; LocalStack's CloudFormation drops their rules
        # (no ingress, egress reset to all), so only the templates show those
        groups = ec2.describe_security_groups(Filters=in_vpc)["SecurityGroups"]
        described = {g["Description"] for g in groups if g["GroupName"] != "default"}
        declared = resources_of(cdk_deployment, "AWS::EC2::SecurityGroup")
        assert described == {r["Properties"]["GroupDescription"] for r in declared}
        assert len(described) == 2

        # the functions' log groups, in the nested shard stack (LocalStack's CloudFormation drops
        # their retention: only the templates show that)
        functions = {g for g in stage_log_groups() if g.startswith("/aws/lambda/")}
        plan = planned(cdk_deployment.request.artifacts).prefixed(CDK.function_prefix)
        assert functions == {f"/aws/lambda/{spec.name}" for spec in plan.functions}
        assert len(stage_log_groups()) == len(resources_of(cdk_deployment, "AWS::Logs::LogGroup"))
        # the profile leaves the functions out (moeless_cdk/profile.py): none was created
        assert not [
            f
            for f in client("lambda").list_functions()["Functions"]
            if f["FunctionName"].startswith(CDK.function_prefix)
        ]

    def test_localstack_completion_through_api_gateway_equals_the_unsplit_model(
        self, cdk_deployment, local_deploy, unsplit_text
    ):
        api = api_named(CDK.api_name)
        url = stage_url(api["id"], CDK.stage, "/v1/completions")
        body = completion(local_deploy.artifacts)
        status, answer = post(url, body, cdk_deployment.result.api_key)
        assert status == 200, answer
        assert answer["choices"][0]["text"] == unsplit_text
        assert answer["usage"]["completion_tokens"] <= MAX_TOKENS
        assert post(url, body, None)[0] == 403
        assert post(url, body, "not-the-key")[0] == 403
        # the gateway's request model refuses a body without a prompt before the service sees it
        assert post(url, {"model": body["model"]}, cdk_deployment.result.api_key)[0] == 400

    def test_localstack_streamed_chat_completion_through_api_gateway(self, cdk_deployment, local_deploy):
        api = api_named(CDK.api_name)
        url = stage_url(api["id"], CDK.stage, "/v1/chat/completions")
        body = {
            "model": local_deploy.artifacts.name,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": True,
        }
        headers = {"Content-Type": "application/json", "x-api-key": cdk_deployment.result.api_key}
        request = urllib.request.Request(url, json.dumps(body).encode(), headers)
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            lines = response.read().splitlines()
        records = [line.removeprefix(b"data: ") for line in lines if line.startswith(b"data: ")]
        assert records[-1] == b"[DONE]"
        chunks = [json.loads(record) for record in records[:-1]]
        assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
        deltas = [chunk["choices"][0]["delta"].get("content") for chunk in chunks if chunk["choices"]]
        finishes = [chunk["choices"][0]["finish_reason"] for chunk in chunks if chunk["choices"]]
        # one record per token, not one buffered answer: several content deltas, then a finish
        assert len([d for d in deltas if d]) > 1 and finishes[-1] in ("stop", "length")
        # and the models route answers through the gateway too
        status, models = get(stage_url(api["id"], CDK.stage, "/v1/models"), cdk_deployment.result.api_key)
        assert status == 200 and models["data"][0]["id"] == local_deploy.artifacts.name

    def test_localstack_redeploy_is_a_no_op(self, cdk_deployment):
        before = snapshot()
        assert before["api"] and before["roles"] and before["vpcs"]
        again = deploy(cdk_deployment.request, boto3.Session(region_name=REGION), say=lambda _m: None)
        assert again.api_key == cdk_deployment.result.api_key
        assert snapshot() == before

    def test_localstack_destroy_removes_the_stage_and_keeps_what_the_templates_retain(self, cdk_deployment):
        groups = resources_of(cdk_deployment, "AWS::Logs::LogGroup")
        retained = [g for g in groups if g.get("DeletionPolicy") == "Retain"]
        assert len(stage_log_groups()) == len(groups)
        retained_roles = [
            r for r in resources_of(cdk_deployment, "AWS::IAM::Role") if r.get("DeletionPolicy") == "Retain"
        ]
        bucket = CDK.bucket(ACCOUNT, REGION)
        removed = destroy(cdk_deployment.request, boto3.Session(region_name=REGION))
        after = snapshot()
        assert (after["api"], after["keys"], after["usage plans"], after["vpcs"]) == (None, [], [], [])
        # CDK retains API Gateway's account-level CloudWatch role; every other role goes
        assert len(after["roles"]) == len(retained_roles) == 1 and "CloudWatchRole" in after["roles"][0][0]
        # the functions' log groups go (DeletionPolicy Delete); the access and flow logs stay (Retain)
        left = stage_log_groups()
        assert not [name for name in left if name.startswith("/aws/lambda/")]
        assert len(left) == len(retained) > 0
        # the stacks retain the named bucket; `moeless destroy` removes it after them, so the stage
        # can be deployed again (the unnamed access-log bucket stays)
        assert removed == [f"bucket {bucket}"]
        buckets = {b["Name"] for b in client("s3").list_buckets()["Buckets"]}
        assert bucket not in buckets
        assert [b for b in buckets if b.startswith(f"{CDK.stack_prefix.lower()}-artifacts-accesslogs")]


def _list(value: Any) -> list:
    return value if isinstance(value, list) else [value]
