"""Storage: the S3 bucket holding the package and plan, its access-log bucket, and the ECR
repositories that pre-built images go to (``moeless:imageTag``; none on LocalStack)."""

from __future__ import annotations

from aws_cdk import CfnOutput, Duration, RemovalPolicy, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_s3 as s3
from constructs import Construct

from moeless_cdk.config import DeployConfig
from moeless_cdk.nag import acknowledge
from moeless_cdk.profile import left_out

IMAGES = ("expert", "backbone")


class ArtifactsStack(Stack):
    """S3 for expert and backbone files (encrypted, versioned, private, TLS only, access-logged), ECR."""

    def __init__(self, scope: Construct, construct_id: str, config: DeployConfig, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(90))],
            removal_policy=RemovalPolicy.RETAIN,
        )
        acknowledge(
            self.access_logs,
            "AwsSolutions-S1",
            "this is the access-log bucket itself; logging it into itself would loop",
        )
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            bucket_name=config.bucket_name,
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="artifacts-bucket/",
            lifecycle_rules=[s3.LifecycleRule(noncurrent_version_expiration=Duration.days(30))],
            removal_policy=RemovalPolicy.RETAIN,
        )
        CfnOutput(self, "BucketName", value=self.bucket.bucket_name)
        CfnOutput(self, "ArtifactsUri", value=config.artifacts_uri)
        self.repositories: dict[str, ecr.Repository] = {}
        if config.emulated:
            left_out(self, "ECR repositories")
            return
        self.repositories = {
            name: ecr.Repository(
                self,
                f"{name.title()}Repository",
                repository_name=config.names.repository(name),
                image_scan_on_push=True,
                image_tag_mutability=ecr.TagMutability.IMMUTABLE,
                encryption=ecr.RepositoryEncryption.AES_256,
                lifecycle_rules=[ecr.LifecycleRule(max_image_count=20)],
                removal_policy=RemovalPolicy.RETAIN,
            )
            for name in IMAGES
        }
        for name, repository in self.repositories.items():
            CfnOutput(self, f"{name.title()}RepositoryUri", value=repository.repository_uri)
