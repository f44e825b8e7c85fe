"""The names one deployment stage uses, in one place for the CDK app, ``moeless deploy`` and the
emulator mirror: they must agree, since stacks find each other by name, not by exports.

``account`` and ``region`` may be CloudFormation pseudo-parameter tokens (the CDK app) or real
values (an emulator, or after a deploy).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageNames:
    stage: str

    @property
    def stack_prefix(self) -> str:
        """CloudFormation stack names: ``Moeless-STAGE-Artifacts`` and so on."""
        return f"Moeless-{self.stage}"

    @property
    def function_prefix(self) -> str:
        """Deployed function names start with this (see :meth:`moeless.contracts.plan.Plan.prefixed`)."""
        return f"moeless-{self.stage}-"

    @property
    def api_name(self) -> str:
        """The REST API, its API key and usage plan."""
        return f"moeless-{self.stage}"

    @property
    def artifacts_prefix(self) -> str:
        """S3 key prefix of the package in the artifacts bucket."""
        return f"{self.stage}/artifacts"

    @property
    def plan_key(self) -> str:
        return f"{self.stage}/plan.json"

    def bucket(self, account: str, region: str) -> str:
        """The artifacts bucket (bucket names are global: account and region make it unique)."""
        return f"moeless-{self.stage}-{account}-{region}"

    def repository(self, image: str) -> str:
        """The ECR repository of ``image`` (``expert`` or ``backbone``)."""
        return f"moeless-{self.stage}-{image}"
