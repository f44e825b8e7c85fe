"""The Lambda API's answers about functions, versions, aliases and the account, in the shapes of
botocore's ``lambda`` service model (``FunctionConfiguration``, ``AliasConfiguration``,
``GetAccountSettingsResponse``), so boto3 and the AWS CLI read them as they read Lambda's.
"""

from __future__ import annotations

import uuid
from typing import Any

from moeless.lambda_host.instance import FunctionConfig
from moeless.lambda_host.versions import LATEST, function_arn

# Code-storage quotas GetAccountSettings reports (Lambda quotas page: 75 GB of storage, 50 MB zipped
# and 250 MB unzipped deployment packages); container-image functions use none of that storage.
TOTAL_CODE_SIZE = 75 * 1024**3
CODE_SIZE_ZIPPED = 50 * 1024**2
CODE_SIZE_UNZIPPED = 250 * 1024**2


def function_configuration(
    config: FunctionConfig, version: str = LATEST, qualifier: str | None = None
) -> dict[str, Any]:
    """``FunctionConfiguration`` of ``version``; its ARN carries ``qualifier`` when one was asked for."""
    return {
        "FunctionName": config.name,
        "FunctionArn": function_arn(config.name, qualifier),
        "PackageType": "Image",
        "MemorySize": config.memory_mb,
        "Timeout": int(config.timeout_s),
        "Version": version,
        "State": "Active",
        "Environment": {"Variables": dict(config.environment)},
    }


def alias_configuration(function: str, alias: str, version: str) -> dict[str, Any]:
    """``AliasConfiguration`` of ``alias`` on ``version``; its RevisionId is stable for a name."""
    arn = function_arn(function, alias)
    return {
        "AliasArn": arn,
        "Name": alias,
        "FunctionVersion": version,
        "Description": "",
        "RevisionId": str(uuid.uuid5(uuid.NAMESPACE_URL, arn)),
    }


def account_settings(concurrency: int, unreserved: int, function_count: int) -> dict[str, Any]:
    """``GetAccountSettingsResponse``: the account's limits and what its functions use."""
    return {
        "AccountLimit": {
            "TotalCodeSize": TOTAL_CODE_SIZE,
            "CodeSizeUnzipped": CODE_SIZE_UNZIPPED,
            "CodeSizeZipped": CODE_SIZE_ZIPPED,
            "ConcurrentExecutions": concurrency,
            "UnreservedConcurrentExecutions": unreserved,
        },
        "AccountUsage": {"TotalCodeSize": 0, "FunctionCount": function_count},
    }
