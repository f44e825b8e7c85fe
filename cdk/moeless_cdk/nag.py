"""cdk-nag's AwsSolutions checks, and the one way this app acknowledges a finding: with its reason.

Every acknowledgement sits next to the construct it is about (it covers that construct's
children), so the reason is read where the choice is made; ``tests/deployment/test_cdk_app.py`` fails on
any finding not acknowledged. Rules that report several findings per resource (IAM5) are
acknowledged one finding at a time: ``AwsSolutions-IAM5[Resource::...]``.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, Aws, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct


def add_checks(app: App) -> None:
    """Run AwsSolutions over every stack at synth; unacknowledged findings fail ``cdk synth``."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge(construct: IConstruct, rule: str, reason: str, findings: list[str] | None = None) -> None:
    """Acknowledge cdk-nag ``rule`` on ``construct`` saying why: the whole rule, or each of its
    ``findings`` (``"Resource::<arn>"``, ``"Action::s3:GetObject*"``; ARNs as :func:`nag_form` writes)."""
    ids = (
        [f"AwsSolutions::{rule}[{finding}]" for finding in findings]
        if findings
        else [f"AwsSolutions::{rule}"]
    )
    Validations.of(construct).acknowledge(*(Acknowledgment(id=i, reason=reason) for i in ids))


def nag_form(value: str) -> str:
    """A string with pseudo-parameter tokens as cdk-nag prints it (``<AWS::Region>``)."""
    for token, name in (
        (Aws.PARTITION, "AWS::Partition"),
        (Aws.REGION, "AWS::Region"),
        (Aws.ACCOUNT_ID, "AWS::AccountId"),
    ):
        value = value.replace(token, f"<{name}>")
    return value
