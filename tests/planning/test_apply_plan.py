"""``moeless apply-plan``: set live functions to the plan's concurrency, changing only what differs.

Against the local host (real calls), and against AWS's API shape with moto for reserved
concurrency plus botocore's Stubber for the provisioned-concurrency calls moto does not implement.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli
from moeless.contracts.manifest import load_manifest
from moeless.contracts.plan import one_function_per_expert
from moeless.errors import PlanError
from moeless.lambda_host import LambdaHost
from moeless.lambda_host.client import lambda_client
from moeless.lambda_host.experts import expert_function_configs
from moeless.planning.provisioning import Change, apply_concurrency, plan_changes
from tests.lambda_helpers import wait_for

REPO = Path(__file__).resolve().parents[2]


def test_apply_plan_against_the_local_host_changes_only_what_differs(tiny, tmp_path):
    artifacts = tiny.package("mixtral")
    plan = one_function_per_expert(load_manifest(artifacts))
    configs = expert_function_configs(artifacts, plan, REPO / "functions" / "expert")
    plan.functions[0].provisioned_concurrency = 1
    plan.functions[1].reserved_concurrency = 3
    plan.save(tmp_path / "plan.json")
    with LambdaHost(configs) as host:
        runner = CliRunner()
        dry = runner.invoke(
            cli, ["apply-plan", str(tmp_path / "plan.json"), "--endpoint", host.endpoint_url, "--dry-run"]
        )
        assert dry.exit_code == 0, dry.output
        assert f"would change {plan.functions[0].name}: provisioned concurrency 0 -> 1" in dry.output
        assert f"would change {plan.functions[1].name}: reserved concurrency none -> 3" in dry.output
        assert not host.pools[plan.functions[0].name].provisioned  # a dry run changes nothing
        applied = runner.invoke(
            cli, ["apply-plan", str(tmp_path / "plan.json"), "--endpoint", host.endpoint_url]
        )
        assert "applied 2 change(s) to 2 function(s)" in applied.output
        assert host.pools[plan.functions[1].name].config.reserved_concurrency == 3
        wait_for(lambda: host.pools[plan.functions[0].name].provisioned_status("live")["Status"] == "READY")
        again = runner.invoke(
            cli, ["apply-plan", str(tmp_path / "plan.json"), "--endpoint", host.endpoint_url]
        )
        assert "nothing to change" in again.output
        # scaling down: the provisioned instance goes, the reservation is lifted
        plan.functions[0].provisioned_concurrency = 0
        plan.functions[1].reserved_concurrency = None
        client = lambda_client(host.endpoint_url)
        assert {str(c) for c in apply_concurrency(client, plan)} == {
            f"{plan.functions[0].name}: provisioned concurrency 1 -> 0",
            f"{plan.functions[1].name}: reserved concurrency 3 -> none",
        }
        assert plan_changes(client, plan) == []


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("handler.py", "def handler(event, context):\n    return event\n")
    return buffer.getvalue()


class MotoWithStubbedProvisioning:
    """moto serves the calls it implements; a Stubber answers the provisioned-concurrency ones."""

    PROVISIONED = frozenset(
        {
            "get_provisioned_concurrency_config",
            "put_provisioned_concurrency_config",
            "delete_provisioned_concurrency_config",
        }
    )

    def __init__(self, moto_client, stubbed_client) -> None:
        self.moto, self.stubbed = moto_client, stubbed_client
        self.exceptions = moto_client.exceptions

    def __getattr__(self, name):
        return getattr(self.stubbed if name in self.PROVISIONED else self.moto, name)


def test_apply_plan_against_aws_shapes_with_moto_and_stubber(tiny):
    moto = pytest.importorskip("moto")
    import boto3
    from botocore.stub import Stubber

    plan = one_function_per_expert(load_manifest(tiny.package("mixtral")))
    plan.functions = plan.functions[:2]
    plan.functions[0].provisioned_concurrency = 2
    plan.functions[1].reserved_concurrency = 5
    with moto.mock_aws():
        iam = boto3.client("iam", region_name="us-east-1")
        role = iam.create_role(RoleName="expert", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        aws = boto3.client("lambda", region_name="us-east-1")
        for spec in plan.functions:
            aws.create_function(
                FunctionName=spec.name,
                Runtime="python3.12",
                Role=role,
                Handler="handler.handler",
                Code={"ZipFile": _zip()},
            )
        stubbed = boto3.client("lambda", region_name="us-east-1")
        with Stubber(stubbed) as stub:
            for spec in plan.functions:  # nothing provisioned yet
                stub.add_client_error(
                    "get_provisioned_concurrency_config",
                    "ProvisionedConcurrencyConfigNotFoundException",
                    http_status_code=404,
                    expected_params={"FunctionName": spec.name, "Qualifier": "live"},
                )
            stub.add_response(
                "put_provisioned_concurrency_config",
                {"RequestedProvisionedConcurrentExecutions": 2, "Status": "IN_PROGRESS"},
                {
                    "FunctionName": plan.functions[0].name,
                    "Qualifier": "live",
                    "ProvisionedConcurrentExecutions": 2,
                },
            )
            changes = apply_concurrency(MotoWithStubbedProvisioning(aws, stubbed), plan)
            stub.assert_no_pending_responses()
        assert changes == [
            Change(plan.functions[0].name, "provisioned", 0, 2),
            Change(plan.functions[1].name, "reserved", None, 5),
        ]
        assert (
            aws.get_function_concurrency(FunctionName=plan.functions[1].name)["ReservedConcurrentExecutions"]
            == 5
        )
        with pytest.raises(PlanError, match="not deployed"):
            plan.functions[0].name = "missing"
            plan_changes(MotoWithStubbedProvisioning(aws, stubbed), plan)
