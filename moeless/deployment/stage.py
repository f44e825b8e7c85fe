"""The names one deployment stage uses, in one place for the CDK app, ``moeless deploy`` and the
emulator mirror: they must agree, since stacks find each other by name, not by exports.

``account`` and ``region`` may be CloudFormation pseudo-parameter tokens (the CDK app) or real
values (an emulator, or after a deploy).

A stage name has no ``-``, and every name below puts a ``-`` (or ``/``) right after the stage:
so a pattern such as ``moeless-dev-*`` in stage ``dev``'s IAM policies can never match a name of
another stage (``dev-b`` is refused; ``devb`` gives ``moeless-devb-...``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from moeless.errors import MoelessError

STAGE_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,15}$")


class StageNameError(MoelessError):
    """A stage name that could make one stage's names match another's."""


def check_stage(stage: str) -> str:
    """``stage`` if it is 1-16 lower-case letters and digits starting with a letter, else
    :class:`StageNameError` (no ``-``: it delimits the stage in every derived name)."""
    if not STAGE_PATTERN.match(stage):
        raise StageNameError(
            f"stage {stage!r}: use 1-16 lower-case letters and digits, starting with a letter "
            "(no '-': it separates the stage from the names under it)"
        )
    return stage


@dataclass(frozen=True)
class StageNames:
    stage: str

    def __post_init__(self) -> None:
        check_stage(self.stage)

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
        """S3 key prefix of the stage's packages in the artifacts bucket (one folder per package)."""
        return f"{self.stage}/artifacts"

    def package_prefix(self, digest: str) -> str:
        """Where the package of :func:`~moeless.contracts.manifest.package_digest` ``digest`` lives."""
        return f"{self.artifacts_prefix}/{digest}"

    def plan_key(self, digest: str) -> str:
        """Where the plan of :meth:`~moeless.contracts.plan.Plan.digest` ``digest`` lives."""
        return f"{self.stage}/plans/{digest}.json"

    def bucket(self, account: str, region: str) -> str:
        """The artifacts bucket (bucket names are global: account and region make it unique)."""
        return f"moeless-{self.stage}-{account}-{region}"

    def repository(self, image: str) -> str:
        """The ECR repository of ``image`` (``expert`` or ``backbone``)."""
        return f"moeless-{self.stage}-{image}"
