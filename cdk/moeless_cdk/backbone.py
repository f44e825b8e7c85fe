"""The GPU backbone: a VPC (with an S3 gateway endpoint: the package never crosses the NAT
gateway), an ECS cluster on EC2 GPU instances (the Amazon Linux 2023 ECS GPU AMI, one GPU per
task), the service behind an internal Network Load Balancer with health checks, scaling on load.
Its task role may invoke only this stage's expert aliases and change their provisioned
concurrency (re-planning), and read the package.

Start-up (:mod:`moeless_cdk.startup`): a task fetches the backbone and the experts it runs in
process onto a host volume sized from the plan, so a task replaced on the same instance resumes what
it had; experts for the fallback come on demand into a bounded cache there.

On LocalStack only the VPC (no NAT gateway), the security groups and the task role are deployed:
the emulator has no ECS, Auto Scaling or ELBv2, and ``moeless serve --local`` runs the service on
this machine instead.
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from moeless.contracts import environment as E
from moeless_cdk.config import DeployConfig
from moeless_cdk.images import backbone_image
from moeless_cdk.nag import acknowledge, nag_form
from moeless_cdk.profile import left_out
from moeless_cdk.startup import CACHE_VOLUME, Startup

SERVICE_PORT = 8000
LISTENER_PORT = 80


class BackboneStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, config: DeployConfig, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.vpc = self._vpc(config)
        self.task_role = self._task_role(config)
        self.balancer_sg, self.service_sg = self._security_groups(config)
        if config.emulated:
            acknowledge(
                self.vpc, "AwsSolutions-VPC7", "LocalStack has no flow logs; moeless:target=aws adds one"
            )
            left_out(
                self,
                "VPC flow log",
                "security group rules between groups",
                "ECS cluster, capacity provider, task definition and service",
                "GPU Auto Scaling group and launch template",
                "Network Load Balancer and target group",
                "task scaling policy",
                "NAT gateway and private subnets with egress",
                "Lambda-backed custom resources (default security group restriction)",
            )
            return
        self.vpc.add_flow_log("FlowLog")
        self.vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        self.startup = Startup.of(config)
        self.cluster = ecs.Cluster(
            self, "Cluster", vpc=self.vpc, container_insights_v2=ecs.ContainerInsights.ENABLED
        )
        self.capacity = self._gpu_capacity(config)
        self.task_definition = self._task_definition(config)
        self.load_balancer, self.service = self._service(config)

    def _vpc(self, config: DeployConfig) -> ec2.Vpc:
        if not config.emulated:
            return ec2.Vpc(self, "Vpc", max_azs=config.max_azs, nat_gateways=1)
        return ec2.Vpc(
            self,
            "Vpc",
            max_azs=config.max_azs,
            nat_gateways=0,
            restrict_default_security_group=False,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC),
                ec2.SubnetConfiguration(name="Isolated", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED),
            ],
        )

    def _gpu_capacity(self, config: DeployConfig) -> ecs.AsgCapacityProvider:
        group = autoscaling.AutoScalingGroup(
            self,
            "GpuInstances",
            vpc=self.vpc,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            instance_type=ec2.InstanceType(config.instance_type),
            # AL2023's GPU AMI (NVIDIA driver 580: CUDA 12.8 images run); AL2's ends 2026-06-30
            machine_image=ecs.EcsOptimizedImage.amazon_linux2023(ecs.AmiHardwareType.GPU),
            min_capacity=0,
            # one instance more than the service's most tasks: a rollout at full scale places its
            # first new task beside the old ones (the service keeps 100% healthy while it rolls)
            max_capacity=config.max_tasks + 1,
            require_imdsv2=True,
            block_devices=[
                autoscaling.BlockDevice(
                    device_name="/dev/xvda",
                    volume=autoscaling.BlockDeviceVolume.ebs(
                        self.startup.volume_gib,
                        encrypted=True,
                        volume_type=autoscaling.EbsDeviceVolumeType.GP3,
                    ),
                )
            ],
        )
        acknowledge(
            group,
            "AwsSolutions-IAM5",
            "the ECS agent's instance policy, as CDK writes it: ECS and CloudWatch actions without "
            "resource-level permissions",
            findings=["Action::ecs:Submit*", "Resource::*"],
        )
        acknowledge(
            group,
            "AwsSolutions-AS3",
            "scaling events are driven by ECS managed scaling and visible in ECS service events",
        )
        # ECS managed draining moves tasks off a leaving instance; no lifecycle-hook Lambda needed.
        capacity = ecs.AsgCapacityProvider(
            self,
            "GpuCapacity",
            auto_scaling_group=group,
            enable_managed_termination_protection=False,
            enable_managed_draining=True,
        )
        self.cluster.add_asg_capacity_provider(capacity)
        return capacity

    def _task_definition(self, config: DeployConfig) -> ecs.Ec2TaskDefinition:
        task = ecs.Ec2TaskDefinition(
            self, "Task", network_mode=ecs.NetworkMode.AWS_VPC, task_role=self.task_role
        )
        # the cache lives on the instance's volume, not in the container's writable layer: a task
        # replaced on the same instance finds what its predecessor fetched (checksums decide)
        task.add_volume(name=CACHE_VOLUME, host=ecs.Host(source_path=self.startup.host_path))
        container = task.add_container(
            "backbone",
            image=backbone_image(self, config),
            gpu_count=1,
            memory_reservation_mib=self.startup.memory_reservation_mib,
            port_mappings=[ecs.PortMapping(container_port=SERVICE_PORT)],
            environment={
                E.ARTIFACTS: config.artifacts_uri,
                E.PLAN: config.plan_uri,
                E.ARTIFACTS_CACHE: self.startup.container_path,
                E.FALLBACK_CACHE_BYTES: str(self.startup.fallback_cache_bytes),
                E.FUNCTION_PREFIX: config.names.function_prefix,
                E.QUALIFIER: E.ALIAS,
                E.DEVICE: "cuda",
            },
            logging=ecs.LogDrivers.aws_logs(
                stream_prefix="backbone", log_retention=logs.RetentionDays.ONE_MONTH
            ),
            health_check=ecs.HealthCheck(
                command=[
                    "CMD-SHELL",
                    f"python3 -c \"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{SERVICE_PORT}/healthz')\"",
                ],
                # ECS allows a start period of 0-300 s; retries (1-10) at an interval (5-300 s)
                # give a start-up of up to start + retries x interval before the task is replaced
                start_period=self.startup.health_start_period,
                interval=self.startup.health_interval,
                retries=self.startup.health_retries,
            ),
        )
        container.add_mount_points(
            ecs.MountPoint(
                source_volume=CACHE_VOLUME, container_path=self.startup.container_path, read_only=False
            )
        )
        acknowledge(
            task,
            "AwsSolutions-ECS2",
            "the environment holds only S3 locations, a name prefix and switches; no secrets",
        )
        acknowledge(
            task.obtain_execution_role(),
            "AwsSolutions-IAM5",
            "ecr:GetAuthorizationToken has no resource-level permissions (AWS requires Resource *)",
            findings=["Resource::*"],
        )
        return task

    def _task_role(self, config: DeployConfig) -> iam.Role:
        """The service's role: invoke this stage's expert aliases, change their concurrency
        (re-planning), read this stage's package and plan."""
        role = iam.Role(
            self,
            "TaskRole",
            assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
            description=f"moeless {config.stage} backbone service",
        )
        stage_objects = config.objects_arn(f"{config.stage}/*")
        statements = {
            config.functions_arn(f":{E.ALIAS}"): [
                "lambda:InvokeFunction",
                "lambda:GetProvisionedConcurrencyConfig",
                "lambda:PutProvisionedConcurrencyConfig",
                "lambda:DeleteProvisionedConcurrencyConfig",
            ],
            config.functions_arn(): [
                "lambda:GetFunctionConcurrency",
                "lambda:PutFunctionConcurrency",
                "lambda:DeleteFunctionConcurrency",
            ],
            stage_objects: ["s3:GetObject"],
        }
        for resource, actions in statements.items():
            role.add_to_policy(iam.PolicyStatement(actions=actions, resources=[resource]))
        acknowledge(
            role,
            "AwsSolutions-IAM5",
            "names only this stage's expert functions (by their common prefix: one statement for any "
            "plan size, as IAM policies are capped at 10 KB) and this stage's package by key prefix",
            findings=[f"Resource::{nag_form(arn)}" for arn in statements],
        )
        return role

    def _security_groups(self, config: DeployConfig) -> tuple[ec2.SecurityGroup, ec2.SecurityGroup]:
        """The load balancer's (from the VPC only, to the tasks only) and the tasks' (from it)."""
        balancer_sg = ec2.SecurityGroup(self, "BalancerSg", vpc=self.vpc, allow_all_outbound=False)
        balancer_sg.add_ingress_rule(
            ec2.Peer.ipv4(self.vpc.vpc_cidr_block), ec2.Port.tcp(LISTENER_PORT), "API Gateway VPC link"
        )
        acknowledge(
            balancer_sg,
            "AwsSolutions-EC23",
            "ingress is the VPC's own CIDR (where the VPC link's interfaces live), never 0.0.0.0/0; "
            "the rule cannot read a CIDR given as a reference",
        )
        service_sg = ec2.SecurityGroup(self, "ServiceSg", vpc=self.vpc)
        if config.emulated:
            return balancer_sg, service_sg
        service_sg.add_ingress_rule(balancer_sg, ec2.Port.tcp(SERVICE_PORT), "from the load balancer")
        balancer_sg.add_egress_rule(service_sg, ec2.Port.tcp(SERVICE_PORT), "to the backbone tasks")
        return balancer_sg, service_sg

    def _service(self, config: DeployConfig) -> tuple[elbv2.NetworkLoadBalancer, ecs.Ec2Service]:
        service = ecs.Ec2Service(
            self,
            "Service",
            cluster=self.cluster,
            task_definition=self.task_definition,
            desired_count=config.backbone_tasks,
            security_groups=[self.service_sg],
            capacity_provider_strategies=[
                ecs.CapacityProviderStrategy(capacity_provider=self.capacity.capacity_provider_name, weight=1)
            ],
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
            health_check_grace_period=self.startup.grace,
            min_healthy_percent=100,
            max_healthy_percent=200,
        )
        balancer = elbv2.NetworkLoadBalancer(
            self, "Balancer", vpc=self.vpc, internet_facing=False, security_groups=[self.balancer_sg]
        )
        # API Gateway's VPC link reaches the NLB through PrivateLink; with inbound-rule evaluation
        # on, that traffic must match the security group by source, which a VPC link's does not:
        # AWS's guide for private integrations turns it off (the group still limits other callers)
        # https://docs.aws.amazon.com/apigateway/latest/developerguide/set-up-nlb-for-vpclink-using-console.html
        cfn_balancer = balancer.node.default_child
        assert isinstance(cfn_balancer, elbv2.CfnLoadBalancer)
        cfn_balancer.add_property_override("EnforceSecurityGroupInboundRulesOnPrivateLinkTraffic", "off")
        acknowledge(
            balancer,
            "AwsSolutions-ELB2",
            "NLB access logs record TLS listeners only; this internal TCP listener is logged by "
            "API Gateway's access logs and the VPC flow log",
        )
        listener = balancer.add_listener("Http", port=LISTENER_PORT)
        listener.add_targets(
            "Backbone",
            port=SERVICE_PORT,
            targets=[service],
            health_check=elbv2.HealthCheck(
                protocol=elbv2.Protocol.HTTP, path="/healthz", interval=Duration.seconds(15)
            ),
            deregistration_delay=Duration.seconds(60),
        )
        scaling = service.auto_scale_task_count(
            min_capacity=config.backbone_tasks, max_capacity=config.max_tasks
        )
        scaling.scale_on_cpu_utilization(
            "Cpu", target_utilization_percent=60, scale_out_cooldown=Duration.minutes(2)
        )
        return balancer, service
