"""The expert functions: one container-image Lambda per function of the plan, sharded over nested
stacks so that any plan fits CloudFormation's 500 resources per stack.

Each function gets the plan's memory size, its reserved concurrency, and an alias ``live`` on a
published version (the backbone invokes the alias). Provisioned concurrency is not declared here:
``moeless deploy`` allocates it on the aliases after the stacks
(:func:`moeless.planning.provisioning.allocate_provisioned`), so one allocation that fails is
reported instead of rolling back every function of the stack; re-planning changes it the same
way. Each function's configuration names the package's digest (in its S3 location), so a new
package publishes a new version and moves the alias. All functions share one
least-privilege role: write their own log groups, read the package's objects. On LocalStack only
the role and the log groups are deployed (see :mod:`moeless_cdk.profile`).
"""

from __future__ import annotations

import math

from aws_cdk import Duration, NestedStack, RemovalPolicy, Size, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from moeless.contracts.environment import ALIAS, EXPERTS, EXPERTS_URI, encode_expert_list
from moeless.contracts.plan import FunctionSpec
from moeless_cdk.config import DeployConfig, regional_arn
from moeless_cdk.images import ExpertImages
from moeless_cdk.nag import acknowledge, nag_form
from moeless_cdk.profile import left_out

# Function, log group, version and alias per plan function; a margin under CloudFormation's 500.
RESOURCES_PER_FUNCTION = 4
RESOURCES_PER_SHARD = 480
FUNCTIONS_PER_SHARD = RESOURCES_PER_SHARD // RESOURCES_PER_FUNCTION
LOG_RETENTION = logs.RetentionDays.ONE_MONTH
LAMBDA_EPHEMERAL_MB = (512, 10_240)


def ephemeral_mb(spec: FunctionSpec, config: DeployConfig) -> int:
    """/tmp big enough for the function's experts fetched from S3 (and their temporary copies)."""
    if config.expert_code != "s3":
        return LAMBDA_EPHEMERAL_MB[0]
    needed = sum(config.manifest.expert(layer, expert).bytes for layer, expert in spec.experts)
    low, high = LAMBDA_EPHEMERAL_MB
    return min(high, max(low, math.ceil(needed * 1.25 / 2**20) + 64))


def environment(spec: FunctionSpec, config: DeployConfig) -> dict[str, str]:
    env = {EXPERTS: encode_expert_list(spec.experts)}
    if config.expert_code == "s3":
        env[EXPERTS_URI] = config.artifacts_uri
    return env


class ExpertShard(NestedStack):
    """Up to ``FUNCTIONS_PER_SHARD`` functions of the plan."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        specs: list[FunctionSpec],
        config: DeployConfig,
        role: iam.IRole,
        images: ExpertImages,
    ) -> None:
        super().__init__(scope, construct_id)
        self.functions: dict[str, lambda_.DockerImageFunction] = {}
        self.aliases: dict[str, lambda_.Alias] = {}
        for spec in specs:
            log_group = logs.LogGroup(
                self,
                f"{spec.name}-logs",
                log_group_name=f"/aws/lambda/{spec.name}",
                retention=LOG_RETENTION,
                removal_policy=RemovalPolicy.DESTROY,
            )
            if config.emulated:
                continue
            function = lambda_.DockerImageFunction(
                self,
                spec.name,
                function_name=spec.name,
                code=images.code_for(spec.experts),
                memory_size=spec.memory_mb,
                ephemeral_storage_size=Size.mebibytes(ephemeral_mb(spec, config)),
                timeout=Duration.seconds(config.expert_timeout_s),
                reserved_concurrent_executions=spec.reserved_concurrency,
                architecture=lambda_.Architecture.X86_64,
                role=role,
                log_group=log_group,
                environment=environment(spec, config),
                description=f"moeless {config.stage}: {len(spec.experts)} expert(s) of the plan",
            )
            self.functions[spec.name] = function
            self.aliases[spec.name] = lambda_.Alias(
                self, f"{spec.name}-{ALIAS}", alias_name=ALIAS, version=function.current_version
            )


class ExpertsStack(Stack):
    """Every function of ``config.deployed_plan``, in shards of nested stacks."""

    def __init__(self, scope: Construct, construct_id: str, config: DeployConfig, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.role = iam.Role(
            self,
            "ExpertRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"moeless {config.stage} expert functions",
        )
        log_groups = regional_arn("logs", f"log-group:/aws/lambda/{config.names.function_prefix}*")
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[log_groups, f"{log_groups}:*"],
            )
        )
        readable = [log_groups, f"{log_groups}:*"]
        if config.expert_code == "s3":
            objects = config.objects_arn(f"{config.names.artifacts_prefix}/*")
            self.role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=[objects]))
            readable.append(objects)
        acknowledge(
            self.role,
            "AwsSolutions-IAM5",
            "names only this stage's log groups (by the functions' common prefix: one statement for "
            "any plan size, as IAM policies are capped at 10 KB) and the package's objects by key prefix",
            findings=[f"Resource::{nag_form(arn)}" for arn in readable],
        )
        self.images = ExpertImages(self, config)
        if config.emulated:
            left_out(self, "expert functions, their versions and aliases")
        specs = config.deployed_plan.functions
        self.shards = [
            ExpertShard(
                self,
                f"Shard{index:03d}",
                specs[start : start + FUNCTIONS_PER_SHARD],
                config,
                self.role,
                self.images,
            )
            for index, start in enumerate(range(0, len(specs), FUNCTIONS_PER_SHARD))
        ]
