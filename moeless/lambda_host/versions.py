"""A hosted function's names: its ARN, and its qualifiers: ``$LATEST``, one published version and the
alias pointing at it.

That is what a deployment gives every expert function on AWS (the CDK app publishes a version and
points the alias the backbone invokes at it), so the host answers Lambda's version and alias calls
for these three and refuses any other qualifier as Lambda does: a number names a version that does
not exist ("Function not found"), anything else an alias ("Cannot find alias arn").
"""

from __future__ import annotations

from dataclasses import dataclass

from moeless.contracts.environment import ALIAS

ACCOUNT_ID = "000000000000"
REGION = "us-east-1"
LATEST = "$LATEST"
PUBLISHED_VERSION = "1"


def function_arn(name: str, qualifier: str | None = None) -> str:
    arn = f"arn:aws:lambda:{REGION}:{ACCOUNT_ID}:function:{name}"
    return f"{arn}:{qualifier}" if qualifier else arn


class QualifierNotFound(LookupError):
    """No such version or alias (404 ResourceNotFoundException, with Lambda's message)."""


@dataclass(frozen=True)
class Qualifiers:
    """The qualifiers every function on a host has.

    Attributes:
        alias: the alias on the published version (the one the backbone invokes).
    """

    alias: str = ALIAS

    def __post_init__(self) -> None:
        assert self.alias and not self.alias.isdigit() and self.alias != LATEST, self.alias

    def version_of(self, function: str, qualifier: str) -> str:
        """The version ``qualifier`` runs: ``$LATEST`` or the published version.

        Raises:
            QualifierNotFound: ``function`` has no such version or alias.
        """
        if qualifier in (LATEST, PUBLISHED_VERSION):
            return qualifier
        if qualifier == self.alias:
            return PUBLISHED_VERSION
        arn = function_arn(function, qualifier)
        if qualifier.isdigit():
            raise QualifierNotFound(f"Function not found: {arn}")
        raise QualifierNotFound(f"Cannot find alias arn: {arn}")
