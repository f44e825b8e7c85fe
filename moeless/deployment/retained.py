"""What a stage's stacks keep when they are deleted: the named artifacts bucket and image
repositories (``RemovalPolicy.RETAIN``: they hold data). CloudFormation cannot create a resource
whose name is taken, so a stage deployed again after ``cdk destroy`` would fail on them;
``moeless destroy`` removes them after the stacks, and ``deploy`` refuses early, naming them, when
a plain ``cdk destroy`` left them behind.
"""

from __future__ import annotations

from typing import Any

from moeless.deployment.stage import StageNames

IMAGES = ("expert", "backbone")


def _bucket(session: Any, names: StageNames) -> str:
    account = session.client("sts").get_caller_identity()["Account"]
    return names.bucket(account, session.region_name or "us-east-1")


def _stack_exists(session: Any, name: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        stacks = session.client("cloudformation").describe_stacks(StackName=name)["Stacks"]
    except ClientError:
        return False
    return any(stack["StackStatus"] != "DELETE_COMPLETE" for stack in stacks)


def _existing(session: Any, names: StageNames) -> list[tuple[str, str]]:
    """(kind, name) of the stage's bucket and repositories that exist."""
    from botocore.exceptions import ClientError

    found = []
    bucket = _bucket(session, names)
    try:
        session.client("s3").head_bucket(Bucket=bucket)
        found.append(("bucket", bucket))
    except ClientError:
        pass
    ecr = session.client("ecr")
    for image in IMAGES:
        try:
            ecr.describe_repositories(repositoryNames=[names.repository(image)])
            found.append(("repository", names.repository(image)))
        except ClientError:
            pass
    return found


def retained_resources(session: Any, names: StageNames) -> list[str]:
    """The stage's retained resources left without their stack (none while the stack exists)."""
    if _stack_exists(session, f"{names.stack_prefix}-Artifacts"):
        return []
    return [f"{kind} {name}" for kind, name in _existing(session, names)]


def remove_retained(session: Any, names: StageNames) -> list[str]:
    """Delete the stage's bucket (every object version) and image repositories; returns them."""
    removed = []
    for kind, name in _existing(session, names):
        if kind == "bucket":
            _empty_and_delete(session.client("s3"), name)
        else:
            session.client("ecr").delete_repository(repositoryName=name, force=True)
        removed.append(f"{kind} {name}")
    return removed


def _empty_and_delete(s3: Any, bucket: str) -> None:
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        doomed = [
            {"Key": item["Key"], "VersionId": item["VersionId"]}
            for item in page.get("Versions", []) + page.get("DeleteMarkers", [])
        ]
        for start in range(0, len(doomed), 1000):  # DeleteObjects takes at most 1,000 keys
            s3.delete_objects(Bucket=bucket, Delete={"Objects": doomed[start : start + 1000], "Quiet": True})
    s3.delete_bucket(Bucket=bucket)
