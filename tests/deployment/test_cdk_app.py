"""The CDK app, synthesised offline (no credentials, no Docker) and asserted with aws_cdk.assertions.

Each stack is synthesised once per module with cdk.json's context (so feature flags match the
CLI's) and cdk-nag's AwsSolutions checks on: a synth that succeeds has no unacknowledged finding.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
cdk = pytest.importorskip("aws_cdk", reason="the CDK app needs the [deploy] extra (aws-cdk-lib)")
from aws_cdk.assertions import Match, Template  # noqa: E402

from moeless.contracts.loads import Loads  # noqa: E402
from moeless.contracts.manifest import ExpertEntry, Manifest, load_manifest  # noqa: E402
from moeless.contracts.plan import Backbone, Plan, one_function_per_expert  # noqa: E402
from moeless.contracts.rest import PUBLIC_ROUTES  # noqa: E402
from tests.conftest import REPO_ROOT  # noqa: E402

sys.path.insert(0, str(REPO_ROOT / "cdk"))
from moeless_cdk import MoelessStacks, build_app  # noqa: E402
from moeless_cdk.api import COMPLETION_SCHEMA  # noqa: E402
from moeless_cdk.config import DeployConfig, DeployConfigError, config_from_context  # noqa: E402
from moeless_cdk.profile import LEFT_OUT_ON_LOCALSTACK, Target  # noqa: E402
from moeless_cdk.startup import Startup  # noqa: E402

CDK_JSON = json.loads((REPO_ROOT / "cdk" / "cdk.json").read_text())
CFN_RESOURCES_PER_STACK = 500
CFN_TEMPLATE_BYTES = 1_000_000  # templates uploaded through S3, as the CDK CLI does


def app_with(outdir: Path) -> cdk.App:
    return cdk.App(context=CDK_JSON["context"], outdir=str(outdir))


def synth(config: DeployConfig, outdir: Path) -> tuple[MoelessStacks, Path]:
    app = app_with(outdir)
    stacks = build_app(app, config)
    app.synth()
    return stacks, outdir


def tiny_plan(artifacts: Path) -> Plan:
    """One function per expert, with the kinds of values a planner writes: bigger memory for hot
    experts, provisioned concurrency on some, reserved concurrency on one; two backbones of the
    instance the plan was sized for."""
    plan = one_function_per_expert(load_manifest(artifacts))
    for index, spec in enumerate(plan.functions):
        spec.memory_mb = 1769 + 256 * (index % 3)
        spec.provisioned_concurrency = index % 3
        spec.reserved_concurrency = 8 if index == 0 else None
    plan.backbone = Backbone("g6e.2xlarge", 2)
    return plan


@pytest.fixture(scope="module")
def tiny_deploy(tiny, tmp_path_factory) -> tuple[DeployConfig, MoelessStacks, Path]:
    artifacts = tiny.package()
    config = DeployConfig(artifacts=artifacts, manifest=load_manifest(artifacts), plan=tiny_plan(artifacts))
    stacks, outdir = synth(config, tmp_path_factory.mktemp("cdk-out"))
    return config, stacks, outdir


def function_templates(stacks: MoelessStacks) -> list[Template]:
    return [Template.from_stack(shard) for shard in stacks.experts.shards]


def resources(templates: list[Template], kind: str) -> list[dict]:
    return [r for t in templates for r in t.find_resources(kind).values()]


class TestExperts:
    def test_one_function_per_plan_function_with_its_memory_and_concurrency(self, tiny_deploy):
        config, stacks, _ = tiny_deploy
        templates = function_templates(stacks)
        functions = {
            f["Properties"]["FunctionName"]: f["Properties"]
            for f in resources(templates, "AWS::Lambda::Function")
        }
        plan = config.deployed_plan
        assert sorted(functions) == sorted(spec.name for spec in plan.functions)
        for spec in plan.functions:
            props = functions[spec.name]
            assert props["MemorySize"] == spec.memory_mb
            assert props["PackageType"] == "Image"
            assert props.get("ReservedConcurrentExecutions") == spec.reserved_concurrency
            hosted = ",".join(f"{layer}:{expert}" for layer, expert in spec.experts)
            assert props["Environment"]["Variables"]["MOELESS_EXPERTS"] == hosted
            assert json.dumps(props["Environment"]["Variables"]["MOELESS_EXPERTS_URI"]).endswith(
                f'/dev/artifacts/{config.package_digest}"]]}}'
            )

    def test_aliases_leave_provisioned_concurrency_to_the_deploy(self, tiny_deploy):
        # a failed allocation inside the stack would roll back every function of it
        config, stacks, _ = tiny_deploy
        aliases = resources(function_templates(stacks), "AWS::Lambda::Alias")
        assert len(aliases) == len(config.plan.functions)
        assert all(a["Properties"]["Name"] == "live" for a in aliases)
        assert not [a for a in aliases if "ProvisionedConcurrencyConfig" in a["Properties"]]

    def test_a_new_package_rolls_the_functions_and_the_task(self, tiny_deploy, tmp_path):
        # given the same plan with one expert file changed (a new package)
        config, stacks, _ = tiny_deploy
        changed = replace(config.manifest.experts[0], sha256="f" * 64)
        manifest = replace(config.manifest, experts=[changed, *config.manifest.experts[1:]])
        new_stacks, _ = synth(replace(config, manifest=manifest), tmp_path)

        def versions(stacks: MoelessStacks) -> set[str]:
            return {k for t in function_templates(stacks) for k in t.find_resources("AWS::Lambda::Version")}

        def task_environment(stacks: MoelessStacks) -> str:
            task = Template.from_stack(stacks.backbone).find_resources("AWS::ECS::TaskDefinition")
            return json.dumps(
                [t["Properties"]["ContainerDefinitions"][0]["Environment"] for t in task.values()]
            )

        # then every function publishes a new version (the alias moves) and the task definition changes
        assert manifest.digest() != config.package_digest
        assert not versions(stacks) & versions(new_stacks)
        assert manifest.digest() in task_environment(new_stacks)
        assert config.package_digest in task_environment(stacks)

    def test_functions_share_one_role_that_reads_only_the_package(self, tiny_deploy):
        _, stacks, _ = tiny_deploy
        parent = Template.from_stack(stacks.experts)
        parent.resource_count_is("AWS::IAM::Role", 1)
        for template in function_templates(stacks):
            template.resource_count_is("AWS::IAM::Role", 0)
        (policy,) = parent.find_resources("AWS::IAM::Policy").values()
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        s3 = [s for s in statements if s["Action"] == "s3:GetObject"]
        assert len(s3) == 1 and "/dev/artifacts/*" in json.dumps(s3[0]["Resource"])
        assert all(not a.startswith("s3:Put") for s in statements for a in np.atleast_1d(s["Action"]))


class TestBackbone:
    def test_task_asks_for_one_gpu_on_a_gpu_ami(self, tiny_deploy):
        _, stacks, _ = tiny_deploy
        template = Template.from_stack(stacks.backbone)
        template.has_resource_properties(
            "AWS::ECS::TaskDefinition",
            {
                "ContainerDefinitions": [
                    Match.object_like(
                        {
                            "ResourceRequirements": [{"Type": "GPU", "Value": "1"}],
                            "Environment": Match.array_with(
                                [{"Name": "MOELESS_FUNCTION_PREFIX", "Value": "moeless-dev-"}]
                            ),
                        }
                    )
                ]
            },
        )
        template.has_resource_properties(
            "AWS::EC2::LaunchTemplate",
            {"LaunchTemplateData": Match.object_like({"InstanceType": "g6e.2xlarge"})},
        )
        template.has_resource_properties("AWS::ECS::Service", {"DesiredCount": 2})
        # Amazon Linux 2023's GPU AMI (AL2's reached its end of support on 2026-06-30)
        parameters = json.dumps(template.to_json()["Parameters"])
        assert "amazon-linux-2023/gpu" in parameters and "amazon-linux-2/gpu" not in parameters
        template.resource_count_is("AWS::ElasticLoadBalancingV2::LoadBalancer", 1)
        template.has_resource_properties(
            "AWS::ElasticLoadBalancingV2::TargetGroup",
            {"HealthCheckPath": "/healthz", "HealthCheckProtocol": "HTTP"},
        )
        template.resource_count_is("AWS::ApplicationAutoScaling::ScalingPolicy", 1)

    def test_health_check_within_ecs_ranges_and_long_enough_for_the_start(self, tiny_deploy):
        config, stacks, _ = tiny_deploy
        template = Template.from_stack(stacks.backbone)
        (task,) = template.find_resources("AWS::ECS::TaskDefinition").values()
        check = task["Properties"]["ContainerDefinitions"][0]["HealthCheck"]
        # ECS: StartPeriod 0-300 s, Interval 5-300 s, Retries 1-10 (botocore's ECS model)
        assert (
            0 <= check["StartPeriod"] <= 300 and 5 <= check["Interval"] <= 300 and 1 <= check["Retries"] <= 10
        )
        assert (
            check["StartPeriod"] + check["Retries"] * check["Interval"] >= Startup.of(config).expected_start_s
        )

    def test_balancer_admits_the_vpc_link_through_privatelink(self, tiny_deploy):
        _, stacks, _ = tiny_deploy
        template = Template.from_stack(stacks.backbone)
        template.has_resource_properties(
            "AWS::ElasticLoadBalancingV2::LoadBalancer",
            {"EnforceSecurityGroupInboundRulesOnPrivateLinkTraffic": "off", "Scheme": "internal"},
        )

    def test_rollout_room_s3_endpoint_and_a_cache_volume_from_the_plan(self, tiny_deploy):
        config, stacks, _ = tiny_deploy
        template = Template.from_stack(stacks.backbone)
        template.has_resource_properties(
            "AWS::AutoScaling::AutoScalingGroup", {"MaxSize": str(config.max_tasks + 1)}
        )
        template.has_resource_properties(
            "AWS::ECS::Service",
            {
                "DeploymentConfiguration": Match.object_like(
                    {"MaximumPercent": 200, "MinimumHealthyPercent": 100}
                )
            },
        )
        (endpoint,) = template.find_resources("AWS::EC2::VPCEndpoint").values()
        assert endpoint["Properties"]["VpcEndpointType"] == "Gateway"
        assert ".s3" in json.dumps(endpoint["Properties"]["ServiceName"])
        startup = Startup.of(config)
        template.has_resource_properties(
            "AWS::EC2::LaunchTemplate",
            {
                "LaunchTemplateData": Match.object_like(
                    {
                        "BlockDeviceMappings": [
                            Match.object_like({"Ebs": Match.object_like({"VolumeSize": startup.volume_gib})})
                        ]
                    }
                )
            },
        )
        (task,) = template.find_resources("AWS::ECS::TaskDefinition").values()
        assert task["Properties"]["Volumes"] == [
            {"Host": {"SourcePath": "/var/lib/moeless/dev"}, "Name": "moeless-cache"}
        ]
        container = task["Properties"]["ContainerDefinitions"][0]
        assert container["MountPoints"][0]["ContainerPath"] == startup.container_path
        environment = {e["Name"]: e["Value"] for e in container["Environment"]}
        assert environment["MOELESS_ARTIFACTS_CACHE"] == startup.container_path
        assert int(environment["MOELESS_FALLBACK_CACHE_BYTES"]) == startup.fallback_cache_bytes > 0

    def test_iam_names_only_this_apps_functions(self, tiny_deploy):
        _, stacks, _ = tiny_deploy
        template = Template.from_stack(stacks.backbone)
        lambda_statements = [
            s
            for policy in template.find_resources("AWS::IAM::Policy").values()
            for s in policy["Properties"]["PolicyDocument"]["Statement"]
            if any(a.startswith("lambda:") for a in np.atleast_1d(s["Action"]))
        ]
        assert {a for s in lambda_statements for a in np.atleast_1d(s["Action"])} >= {
            "lambda:InvokeFunction",
            "lambda:PutProvisionedConcurrencyConfig",
        }
        for statement in lambda_statements:
            resource = json.dumps(statement["Resource"])
            assert ":function:moeless-dev-*" in resource, resource
            assert statement["Resource"] != "*"
        invoke = [s for s in lambda_statements if "lambda:InvokeFunction" in np.atleast_1d(s["Action"])]
        assert all(json.dumps(s["Resource"]).endswith(':live"]]}') for s in invoke)

    def test_no_stage_pattern_matches_another_stages_functions(self, tiny_deploy):
        # given stage dev's IAM pattern, and the functions of stages whose names start like dev's
        config, _, _ = tiny_deploy
        pattern = config.names.function_prefix + "*"
        others = [
            replace(config, stage=stage).deployed_plan.functions[0].name for stage in ("devb", "dev0", "d")
        ]
        # then the pattern matches dev's own functions and none of the others
        assert all(fnmatch.fnmatchcase(f.name, pattern) for f in config.deployed_plan.functions)
        assert not [name for name in others if fnmatch.fnmatchcase(name, pattern)]
        with pytest.raises(DeployConfigError, match="no '-'"):
            replace(config, stage="dev-b")

    def test_the_backbone_is_the_plans_unless_the_context_names_the_same(self, tiny_deploy):
        config, _, _ = tiny_deploy
        assert (config.instance_type, config.backbone_tasks, config.max_tasks) == ("g6e.2xlarge", 2, 2)
        assert replace(config, backbone_instance_type="g6e.2xlarge").instance_type == "g6e.2xlarge"
        with pytest.raises(DeployConfigError, match="sized for a g6e.2xlarge backbone.*says g5.xlarge"):
            replace(config, backbone_instance_type="g5.xlarge")
        unsized = replace(config, plan=replace(config.plan, backbone=None))
        assert (unsized.instance_type, unsized.backbone_tasks) == ("g5.xlarge", 1)


class TestApi:
    def test_methods_key_usage_plan_and_logs(self, tiny_deploy):
        config, stacks, _ = tiny_deploy
        template = Template.from_stack(stacks.api)
        template.has_resource_properties(
            "AWS::ApiGateway::Method",
            {
                "HttpMethod": "POST",
                "ApiKeyRequired": True,
                "RequestValidatorId": Match.any_value(),
                "Integration": Match.object_like({"ConnectionType": "VPC_LINK", "Type": "HTTP_PROXY"}),
            },
        )
        template.has_resource_properties(
            "AWS::ApiGateway::Method", {"HttpMethod": "GET", "ApiKeyRequired": True}
        )
        methods = template.find_resources("AWS::ApiGateway::Method")
        assert len(methods) == len(PUBLIC_ROUTES)
        # the two completion routes stream, up to API Gateway's 15 minutes; the rest are buffered
        modes = sorted(
            (
                m["Properties"]["Integration"]["ResponseTransferMode"],
                m["Properties"]["Integration"]["TimeoutInMillis"],
            )
            for m in methods.values()
        )
        assert modes == [("BUFFERED", 29_000)] * 7 + [("STREAM", 900_000)] * 2
        template.resource_count_is("AWS::ApiGateway::ApiKey", 1)
        template.has_resource_properties(
            "AWS::ApiGateway::UsagePlan",
            {
                "Throttle": {
                    "RateLimit": config.throttle_rate_limit,
                    "BurstLimit": config.throttle_burst_limit,
                },
                "Quota": {"Limit": config.quota_per_day, "Period": "DAY"},
            },
        )
        template.has_resource_properties(
            "AWS::ApiGateway::Stage",
            {"AccessLogSetting": Match.object_like({"DestinationArn": Match.any_value()})},
        )
        template.resource_count_is("AWS::ApiGateway::VpcLink", 1)
        template.resource_count_is("AWS::WAFv2::WebACLAssociation", 1)
        (acl,) = template.find_resources("AWS::WAFv2::WebACL").values()
        groups = [
            rule["Statement"].get("ManagedRuleGroupStatement", {}).get("Name")
            for rule in acl["Properties"]["Rules"]
        ]
        # AWS's common rules, and its known bad inputs (Log4Shell lookups among them)
        assert groups[:2] == ["AWSManagedRulesCommonRuleSet", "AWSManagedRulesKnownBadInputsRuleSet"]

    def test_gateway_schema_accepts_only_fields_the_service_knows(self):
        from backbone_service.schemas import CompletionRequest

        gateway = set(COMPLETION_SCHEMA.properties)
        assert gateway <= set(CompletionRequest.model_fields)
        assert set(COMPLETION_SCHEMA.required) == {
            name for name, field in CompletionRequest.model_fields.items() if field.is_required()
        }


class TestArtifacts:
    def test_bucket_is_encrypted_versioned_private_tls_only_and_logged(self, tiny_deploy):
        _, stacks, _ = tiny_deploy
        template = Template.from_stack(stacks.artifacts)
        template.has_resource_properties(
            "AWS::S3::Bucket",
            {
                "VersioningConfiguration": {"Status": "Enabled"},
                "BucketEncryption": Match.any_value(),
                "PublicAccessBlockConfiguration": Match.object_like({"BlockPublicAcls": True}),
                "LoggingConfiguration": Match.object_like({"LogFilePrefix": "artifacts-bucket/"}),
            },
        )
        template.has_resource_properties(
            "AWS::S3::BucketPolicy",
            {
                "PolicyDocument": {
                    "Statement": Match.array_with(
                        [
                            Match.object_like(
                                {"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
                            )
                        ]
                    )
                }
            },
        )
        template.resource_count_is("AWS::ECR::Repository", 2)


class TestWhatLocalstackDrops:
    """Properties LocalStack's CloudFormation accepts but drops (test_localstack.py cannot see
    them): asserted here, on the AWS target's templates."""

    def test_lifecycle_ownership_and_log_retention(self, tiny_deploy):
        _, stacks, _ = tiny_deploy
        artifacts = Template.from_stack(stacks.artifacts)
        artifacts.has_resource_properties(
            "AWS::S3::Bucket",
            {
                "LifecycleConfiguration": {
                    "Rules": [Match.object_like({"NoncurrentVersionExpiration": {"NoncurrentDays": 30}})]
                }
            },
        )
        artifacts.has_resource_properties(
            "AWS::S3::Bucket",
            {
                "LifecycleConfiguration": {"Rules": [Match.object_like({"ExpirationInDays": 90})]},
                "OwnershipControls": {"Rules": [{"ObjectOwnership": "BucketOwnerPreferred"}]},
            },
        )
        # the groups the localstack profile deploys too: the functions' and the API's access logs
        groups = resources(
            [Template.from_stack(stacks.api), *function_templates(stacks)], "AWS::Logs::LogGroup"
        )
        assert len(groups) == len(stacks.experts.images.config.plan.functions) + 1
        assert {g["Properties"].get("RetentionInDays") for g in groups} == {30}

    def test_security_group_rules_and_the_default_route(self, tiny_deploy):
        _, stacks, _ = tiny_deploy
        template = Template.from_stack(stacks.backbone)
        template.has_resource_properties(
            "AWS::EC2::SecurityGroup",
            {
                "SecurityGroupIngress": [
                    Match.object_like({"FromPort": 80, "ToPort": 80, "CidrIp": Match.any_value()})
                ],
            },
        )
        template.has_resource_properties(
            "AWS::EC2::SecurityGroupIngress", {"FromPort": 8000, "SourceSecurityGroupId": Match.any_value()}
        )
        template.has_resource_properties(
            "AWS::EC2::SecurityGroupEgress",
            {"FromPort": 8000, "DestinationSecurityGroupId": Match.any_value()},
        )
        routes = template.find_resources(
            "AWS::EC2::Route", {"Properties": {"DestinationCidrBlock": "0.0.0.0/0"}}
        )
        targets = sorted(next(k for k in r["Properties"] if k.endswith("GatewayId")) for r in routes.values())
        assert targets == ["GatewayId", "GatewayId", "NatGatewayId", "NatGatewayId"]


class TestNag:
    def test_every_acknowledged_finding_states_a_reason(self, tiny_deploy):
        _, _, outdir = tiny_deploy
        (report,) = json.loads((outdir / "validation-report.json").read_text())["pluginReports"]
        assert report["conclusion"] == "success" and report["violations"] == []
        assert report["suppressedViolations"], "nothing was checked?"
        for violation in report["suppressedViolations"]:
            assert len(violation["reason"]) > 30, violation["ruleName"]

    def test_an_unacknowledged_finding_fails_synth(self, tiny, tmp_path):
        from aws_cdk import aws_s3 as s3

        artifacts = tiny.package()
        config = DeployConfig(
            artifacts=artifacts, manifest=load_manifest(artifacts), plan=tiny_plan(artifacts)
        )
        app = app_with(tmp_path)
        stacks = build_app(app, config)
        s3.Bucket(stacks.artifacts, "Careless")  # no TLS policy, no access logs
        with pytest.raises(RuntimeError, match=r"Careless/Resource(.|\n)*AwsSolutions-S10"):
            app.synth()


class TestConfig:
    def test_context_without_artifacts_says_how_to_give_them(self):
        with pytest.raises(DeployConfigError, match="moeless:artifacts is not set"):
            config_from_context({}.get)

    def test_context_reads_plan_and_stage(self, tiny, tmp_path):
        artifacts = tiny.package()
        tiny_plan(artifacts).save(tmp_path / "plan.json")
        context = {
            "moeless:artifacts": str(artifacts),
            "moeless:plan": str(tmp_path / "plan.json"),
            "moeless:stage": "prod",
        }
        config = config_from_context(context.get)
        assert config.deployed_plan.functions[0].name.startswith("moeless-prod-l")
        assert config.plan.functions[0].provisioned_concurrency == 0

    @pytest.mark.parametrize("stage", ["Prod", "a" * 17, "1st", "x_y", "dev-b"])
    def test_bad_stage_names_are_refused(self, tiny, stage):
        artifacts = tiny.package()
        with pytest.raises(DeployConfigError, match="stage"):
            DeployConfig(
                artifacts=artifacts, manifest=load_manifest(artifacts), plan=tiny_plan(artifacts), stage=stage
            )


@pytest.fixture(scope="module")
def profile(tiny, tmp_path_factory) -> tuple[MoelessStacks, Path]:
    """The tiny plan synthesised with ``moeless:target=localstack``."""
    artifacts = tiny.package()
    config = DeployConfig(
        artifacts=artifacts,
        manifest=load_manifest(artifacts),
        plan=tiny_plan(artifacts),
        target=Target.LOCALSTACK,
        backbone_url="http://127.0.0.1:8000/",
    )
    return synth(config, tmp_path_factory.mktemp("cdk-localstack"))


class TestLocalstackProfile:
    """``moeless:target=localstack``: what LocalStack cannot run is absent, the rest as on AWS.
    (test_localstack.py deploys it and reads each type back through the service APIs.)"""

    def test_localstack_profile_synthesises_none_of_what_localstack_cannot_run(self, profile):
        stacks, outdir = profile
        types = {
            resource["Type"]
            for path in outdir.glob("*.template.json")
            for resource in json.loads(path.read_text()).get("Resources", {}).values()
        }
        absent = {
            "AWS::ECR::Repository",
            "AWS::Lambda::Function",
            "AWS::Lambda::Version",
            "AWS::Lambda::Alias",
            "AWS::ECS::Cluster",
            "AWS::ECS::TaskDefinition",
            "AWS::ECS::Service",
            "AWS::AutoScaling::AutoScalingGroup",
            "AWS::EC2::LaunchTemplate",
            "AWS::ElasticLoadBalancingV2::LoadBalancer",
            "AWS::ApplicationAutoScaling::ScalingPolicy",
            "AWS::EC2::NatGateway",
            "AWS::EC2::FlowLog",
            "AWS::EC2::SecurityGroupIngress",
            "AWS::EC2::SecurityGroupEgress",
            "AWS::ApiGateway::VpcLink",
            "AWS::WAFv2::WebACL",
            "AWS::WAFv2::WebACLAssociation",
        }
        assert not types & absent
        assert not [t for t in types if t.startswith("Custom::")]
        assert not [p for p in outdir.glob("*.assets.json") if json.loads(p.read_text()).get("dockerImages")]
        # the Experts stack keeps the functions' role and one log group per plan function
        Template.from_stack(stacks.experts).resource_count_is("AWS::IAM::Role", 1)
        groups = resources(function_templates(stacks), "AWS::Logs::LogGroup")
        assert sorted(g["Properties"]["LogGroupName"] for g in groups) == sorted(
            f"/aws/lambda/{spec.name}" for spec in stacks.experts.images.config.deployed_plan.functions
        )

    def test_localstack_profile_names_what_it_leaves_out(self, profile):
        stacks, _ = profile
        infos = [
            entry.data
            for stack in (stacks.artifacts, stacks.experts, stacks.backbone, stacks.api)
            for entry in stack.node.metadata
            if entry.type == "aws:cdk:info"
        ]
        said = " ".join(str(info) for info in infos)
        for name in LEFT_OUT_ON_LOCALSTACK:
            assert f"leaves out {name}:" in said, name

    def test_localstack_routes_call_the_backbone_url_directly(self, profile):
        stacks, _ = profile
        template = Template.from_stack(stacks.api)
        for route in PUBLIC_ROUTES:
            template.has_resource_properties(
                "AWS::ApiGateway::Method",
                {
                    "HttpMethod": route.method,
                    "ApiKeyRequired": True,
                    "Integration": Match.object_like(
                        {
                            "Type": "HTTP_PROXY",
                            "IntegrationHttpMethod": route.method,
                            "Uri": f"http://127.0.0.1:8000{route.path}",
                            "ConnectionType": Match.absent(),
                            "ResponseTransferMode": "STREAM" if route.streams else "BUFFERED",
                        }
                    ),
                },
            )
        template.resource_count_is("AWS::ApiGateway::UsagePlan", 1)
        template.resource_count_is("AWS::ApiGateway::RequestValidator", 1)

    @pytest.mark.parametrize(
        ("target", "url", "match"),
        [
            pytest.param(Target.LOCALSTACK, None, "moeless:backboneUrl", id="localstack-without-url"),
            pytest.param(Target.AWS, "http://127.0.0.1:8000", "moeless:backboneUrl", id="url-on-aws"),
        ],
    )
    def test_localstack_target_and_backbone_url_go_together(self, tiny, target, url, match):
        artifacts = tiny.package()
        with pytest.raises(DeployConfigError, match=match):
            DeployConfig(
                artifacts=artifacts,
                manifest=load_manifest(artifacts),
                plan=tiny_plan(artifacts),
                target=target,
                backbone_url=url,
            )

    def test_an_unknown_target_is_refused_in_one_line(self, tiny):
        context = {"moeless:artifacts": str(tiny.package()), "moeless:target": "gcp"}
        with pytest.raises(DeployConfigError, match=r"moeless:target must be one of \['aws', 'localstack'\]"):
            config_from_context(context.get)


def test_baked_images_hold_only_their_functions_experts(tiny, tmp_path):
    """With moeless:expertCode=image each function's build context carries its own experts only."""
    artifacts = tiny.package()
    manifest = load_manifest(artifacts)
    config = DeployConfig(
        artifacts=artifacts, manifest=manifest, plan=tiny_plan(artifacts), stage="baked", expert_code="image"
    )
    try:
        stacks, outdir = synth(config, tmp_path / "out")
        functions = resources(function_templates(stacks), "AWS::Lambda::Function")
        assert all(
            "MOELESS_EXPERTS_URI" not in f["Properties"]["Environment"]["Variables"] for f in functions
        )
        contexts = [p for p in outdir.glob("asset.*") if (p / "functions/expert/Dockerfile").is_file()]
        assert len(contexts) == len(config.plan.functions)
        for context in contexts:
            onnx = list((context / "functions/expert/artifacts/experts").glob("*.onnx"))
            assert len(onnx) == 1
    finally:
        shutil.rmtree(REPO_ROOT / "cdk" / ".staging" / "baked", ignore_errors=True)


def synthetic_manifest(layers: int, experts: int, hidden: int, intermediate: int) -> Manifest:
    """A manifest of a large model's shape (no files): the CDK app reads only names and sizes."""
    entries = [
        ExpertEntry(
            layer,
            expert,
            f"experts/L{layer:03d}_E{expert:03d}.onnx",
            3 * hidden * intermediate * 4,
            "0" * 64,
            0.0,
            0.0,
        )
        for layer in range(layers)
        for expert in range(experts)
    ]
    return Manifest(
        architecture="synthetic",
        display_name="synthetic",
        num_layers=layers,
        moe_layers=list(range(layers)),
        num_experts=experts,
        top_k=8,
        routing={},
        hidden_size=hidden,
        intermediate_size=intermediate,
        expert_kind="swiglu",
        activation={},
        dtype="float32",
        backbone={"files": []},
        experts=entries,
    )


def zipf_loads(layers: int, experts: int, seed: int = 0) -> Loads:
    rng = np.random.default_rng(seed)
    return Loads({layer: rng.zipf(1.3, experts).clip(1, 10_000).astype(float) for layer in range(layers)})


@pytest.mark.slow
def test_pinned_cli_synthesises_the_tiny_plan(tiny, tmp_path):
    """`npx cdk synth` with the repository's pinned CLI and cdk.json, as a user runs it."""
    cli = REPO_ROOT / "cdk" / "node_modules" / ".bin" / "cdk"
    if not cli.is_file():
        pytest.skip("the pinned CDK CLI is not installed: run `npm ci --prefix cdk` (make test does)")
    artifacts = tiny.package()
    tiny_plan(artifacts).save(tmp_path / "plan.json")
    env = os.environ | {
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        "CDK_DISABLE_VERSION_CHECK": "1",
    }
    result = subprocess.run(
        [
            str(cli),
            "synth",
            "--quiet",
            "--no-notices",
            "--app",
            f"{sys.executable} app.py",
            "-o",
            str(tmp_path / "out"),
            "-c",
            f"moeless:artifacts={artifacts}",
            "-c",
            f"moeless:plan={tmp_path / 'plan.json'}",
        ],
        cwd=REPO_ROOT / "cdk",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "out").glob("Moeless-dev-*.template.json")) == [
        f"Moeless-dev-{name}.template.json" for name in ("Api", "Artifacts", "Backbone", "Experts")
    ]


def test_plan_prefix_keeps_names_valid_and_distinct(tiny):
    plan = tiny_plan(tiny.package())
    prefixed = plan.prefixed("moeless-prod-")
    assert [f.name for f in prefixed.functions] == [
        "moeless-prod-" + f.name.removeprefix("moeless-") for f in plan.functions
    ]
    assert {p.function for p in prefixed.experts} == {f.name for f in prefixed.functions}
    from moeless.errors import PlanError

    with pytest.raises(PlanError, match="not a valid Lambda name"):
        replace(plan).prefixed("x" * 60)


def test_a_backbone_whose_ram_cannot_hold_its_host_experts_is_refused(tmp_path):
    """Mixtral-8x7B's shape, every expert on the host (705 MB each in fp32, 180 GB): a g6e.8xlarge
    (256 GiB) holds them, a g6e.2xlarge (64 GiB) does not."""
    manifest = synthetic_manifest(32, 8, 4096, 14336)
    plan = one_function_per_expert(manifest)
    for placement in plan.experts:
        placement.placement, placement.function = "host", None
    plan.functions = []
    roomy = DeployConfig(tmp_path, manifest, replace(plan, backbone=Backbone("g6e.8xlarge")))
    assert Startup.of(roomy).memory_reservation_mib * 2**20 > 32 * 8 * 705e6
    with pytest.raises(DeployConfigError, match="more than a g6e.2xlarge's 64 GiB: plan for a bigger"):
        Startup.of(DeployConfig(tmp_path, manifest, replace(plan, backbone=Backbone("g6e.2xlarge"))))
