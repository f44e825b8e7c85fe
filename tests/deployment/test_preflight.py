"""``deploy --check`` against three accounts, their answers stubbed with botocore's Stubber on a
real Lambda client (the responses are validated against Lambda's service model): a default
account of 1,000 concurrent executions, one whose other functions leave 10 unreserved, and a new
account whose functions are capped at 3,008 MB."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from moeless.contracts.manifest import load_manifest
from moeless.contracts.plan import Plan, one_function_per_expert
from moeless.deployment.preflight import check_account, require_fit
from moeless.errors import PlanDoesNotFit

PREFIX = "moeless-dev-"


def lambda_client() -> object:
    return boto3.client(
        "lambda", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )


def account(stub: Stubber, limit: int, unreserved: int, deployed: dict[str, int] | None = None) -> None:
    """Queue the answers of an account: its settings, its functions, their reservations."""
    stub.add_response(
        "get_account_settings",
        {
            "AccountLimit": {"ConcurrentExecutions": limit, "UnreservedConcurrentExecutions": unreserved},
            "AccountUsage": {"FunctionCount": len(deployed or {})},
        },
    )
    stub.add_response(
        "list_functions", {"Functions": [{"FunctionName": name} for name in sorted(deployed or {})]}
    )
    for name, reserved in sorted((deployed or {}).items()):
        stub.add_response(
            "get_function_concurrency",
            {"ReservedConcurrentExecutions": reserved},
            {"FunctionName": name},
        )


@pytest.fixture
def plan(tiny) -> Plan:
    plan = one_function_per_expert(load_manifest(tiny.package()))
    plan.functions[0].reserved_concurrency = 20
    plan.functions[0].provisioned_concurrency = 5
    plan.functions[1].provisioned_concurrency = 3
    plan.functions[2].keep_warm = 2
    plan.functions[3].memory_mb = 4096
    return plan


def test_a_default_account_holds_the_plan(plan):
    client = lambda_client()
    with Stubber(client) as stub:
        account(stub, 1000, 1000)
        fit = check_account(client, plan, PREFIX)
        stub.assert_no_pending_responses()
    assert (fit.needed_reserved, fit.needed_unreserved) == (20, 5)  # 3 provisioned + 2 kept warm
    assert fit.shortfalls == ()
    require_fit(fit)


def test_an_account_with_10_unreserved_is_refused_naming_the_increase(plan):
    client = lambda_client()
    with Stubber(client) as stub:
        account(stub, 1000, 10)  # other functions reserve 990
        fit = check_account(client, plan, PREFIX)
    [shortfall] = fit.shortfalls
    # 990 reserved elsewhere + 20 reserved + 5 unreserved + 100 kept free = 1,115
    assert (shortfall.needed, shortfall.have) == (1115, 1000)
    with pytest.raises(PlanDoesNotFit, match=r"Concurrent executions.*L-B99A9384.*ask for 115 more"):
        require_fit(fit)


def test_a_redeploy_gets_back_what_the_stage_already_reserves(plan):
    # given the plan deployed already: its function reserves 20 of the 1,000, leaving 980
    deployed = {plan.prefixed(PREFIX).functions[0].name: 20}
    client = lambda_client()
    with Stubber(client) as stub:
        account(stub, 1000, 980, deployed)
        fit = check_account(client, plan, PREFIX)
        stub.assert_no_pending_responses()
    assert fit.reserved_by_stage == 20 and fit.shortfalls == ()


def test_an_account_capped_at_3008_mb_is_refused_naming_the_function(plan):
    client = lambda_client()
    with Stubber(client) as stub:
        account(stub, 1000, 1000)
        fit = check_account(client, plan, PREFIX, max_memory_mb=3008)
    [shortfall] = fit.shortfalls
    assert (shortfall.quota, shortfall.needed, shortfall.have) == ("Lambda function memory", 4096, 3008)
    with pytest.raises(PlanDoesNotFit, match=f"e.g. {plan.prefixed(PREFIX).functions[3].name}"):
        require_fit(fit)
