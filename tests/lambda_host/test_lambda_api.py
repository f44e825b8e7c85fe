"""The local host's Lambda API as boto3 and the AWS CLI see it: versions and aliases, unknown
qualifiers, and the account's concurrency (its limit, reservations, provisioned concurrency and
throttles), checked against botocore's ``lambda`` service model and Lambda's own messages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import botocore.session
import httpx
import pytest

from moeless.lambda_host import LambdaHost, LambdaLimits
from tests.lambda_helpers import call, probe, running, wait_for

MODEL = botocore.session.get_session().get_service_model("lambda")
MIN_UNRESERVED = "UnreservedConcurrentExecution below its minimum value of [{}]."


def assert_shape(value: Any, shape: Any, path: str = "$") -> None:
    """``value`` (raw JSON) fits botocore's ``shape``: no member it lacks, every required one,
    and scalars of the right type."""
    kind = shape.type_name
    if kind == "structure":
        assert isinstance(value, dict), path
        assert not set(value) - set(shape.members), f"{path}: {set(value) - set(shape.members)}"
        assert not set(shape.required_members) - set(value), f"{path}: missing required members"
        for key, item in value.items():
            assert_shape(item, shape.members[key], f"{path}.{key}")
    elif kind == "list":
        assert isinstance(value, list), path
        for i, item in enumerate(value):
            assert_shape(item, shape.member, f"{path}[{i}]")
    elif kind == "map":
        assert isinstance(value, dict), path
        for key, item in value.items():
            assert_shape(item, shape.value, f"{path}.{key}")
    elif kind in ("integer", "long"):
        assert isinstance(value, int) and not isinstance(value, bool), path
    elif kind == "string":
        assert isinstance(value, str), path
        assert not shape.enum or value in shape.enum, f"{path}: {value!r} not in {shape.enum}"
    else:
        raise AssertionError(f"{path}: unexpected {kind}")


def raw_get(host: Any, path: str) -> Any:
    answer = httpx.get(f"{host.endpoint_url}{path}")
    assert answer.status_code == 200, answer.text
    return answer.json()


# --- versions and aliases ------------------------------------------------------------------------


def test_versions_aliases_and_account_settings_answer_in_the_service_models_shapes():
    with running(probe()) as (host, client):
        # GIVEN each new operation's raw answer, THEN it fits the operation's output shape
        for operation, path in [
            ("ListAliases", "/2015-03-31/functions/probe/aliases"),
            ("GetAlias", "/2015-03-31/functions/probe/aliases/live"),
            ("ListVersionsByFunction", "/2015-03-31/functions/probe/versions"),
            ("GetAccountSettings", "/2016-08-19/account-settings/"),
            ("GetFunction", "/2015-03-31/functions/probe?Qualifier=live"),
        ]:
            assert_shape(raw_get(host, path), MODEL.operation_model(operation).output_shape, operation)
        # WHEN boto3 asks, THEN one published version, and the alias live on it
        (alias,) = client.list_aliases(FunctionName="probe")["Aliases"]
        assert alias["Name"] == "live" and alias["FunctionVersion"] == "1"
        assert alias["AliasArn"] == "arn:aws:lambda:us-east-1:000000000000:function:probe:live"
        assert client.get_alias(FunctionName="probe", Name="live")["RevisionId"] == alias["RevisionId"]
        assert client.list_aliases(FunctionName="probe", FunctionVersion="$LATEST")["Aliases"] == []
        versions = client.list_versions_by_function(FunctionName="probe")["Versions"]
        assert [(v["Version"], v["FunctionArn"].rsplit(":", 1)[1]) for v in versions] == [
            ("$LATEST", "$LATEST"),
            ("1", "1"),
        ]
        configuration = client.get_function(FunctionName="probe", Qualifier="live")["Configuration"]
        assert configuration["Version"] == "1" and configuration["FunctionArn"].endswith(":probe:live")
        # an invocation of the alias runs the published version; an unqualified one $LATEST
        assert call(client, "probe", {}, Qualifier="live")[0]["ExecutedVersion"] == "1"
        assert call(client, "probe", {})[0]["ExecutedVersion"] == "$LATEST"


def test_an_alias_other_than_the_hosts_is_known_when_the_host_is_given_it():
    with running(probe(), alias="prod") as (_, client):
        assert client.get_alias(FunctionName="probe", Name="prod")["FunctionVersion"] == "1"
        with pytest.raises(client.exceptions.ResourceNotFoundException):
            client.get_alias(FunctionName="probe", Name="live")


@pytest.mark.parametrize(
    ("qualifier", "message"),
    [
        pytest.param("nope", "Cannot find alias arn: {arn}:nope", id="alias"),
        pytest.param("7", "Function not found: {arn}:7", id="version"),
    ],
)
def test_unknown_qualifiers_are_404_resource_not_found_everywhere(qualifier, message):
    with running(probe()) as (host, client):
        arn = client.get_function(FunctionName="probe")["Configuration"]["FunctionArn"]
        calls = {
            "Invoke": lambda: client.invoke(FunctionName="probe", Qualifier=qualifier, Payload=b"{}"),
            "Invoke name:qualifier": lambda: client.invoke(FunctionName=f"probe:{qualifier}", Payload=b"{}"),
            "Invoke DryRun": lambda: client.invoke(
                FunctionName="probe", Qualifier=qualifier, InvocationType="DryRun"
            ),
            "GetFunction": lambda: client.get_function(FunctionName="probe", Qualifier=qualifier),
            "GetFunctionConfiguration": lambda: client.get_function_configuration(
                FunctionName="probe", Qualifier=qualifier
            ),
            "PutProvisionedConcurrencyConfig": lambda: client.put_provisioned_concurrency_config(
                FunctionName="probe", Qualifier=qualifier, ProvisionedConcurrentExecutions=1
            ),
            "GetProvisionedConcurrencyConfig": lambda: client.get_provisioned_concurrency_config(
                FunctionName="probe", Qualifier=qualifier
            ),
            "DeleteProvisionedConcurrencyConfig": lambda: client.delete_provisioned_concurrency_config(
                FunctionName="probe", Qualifier=qualifier
            ),
        }
        if not qualifier.isdigit():
            calls["GetAlias"] = lambda: client.get_alias(FunctionName="probe", Name=qualifier)
        for operation, request in calls.items():
            with pytest.raises(client.exceptions.ResourceNotFoundException) as info:
                request()
            error = info.value.response
            assert error["ResponseMetadata"]["HTTPStatusCode"] == 404, operation
            assert error["Error"]["Message"] == message.format(arn=arn), operation
        # nothing ran, nothing was configured
        assert host.describe()["probe"] == {
            "memory_mb": 1769,
            "reserved_concurrency": None,
            "provisioned": {},
            "instances": [],
        }


# --- the account's concurrency -------------------------------------------------------------------


def test_account_settings_report_the_limit_what_reservations_leave_and_the_usage():
    with running(probe("a"), probe("b")) as (_, client):
        settings = client.get_account_settings()
        assert settings["AccountLimit"]["ConcurrentExecutions"] == 1000
        assert settings["AccountLimit"]["UnreservedConcurrentExecutions"] == 1000
        assert settings["AccountUsage"]["FunctionCount"] == 2
        client.put_function_concurrency(FunctionName="a", ReservedConcurrentExecutions=150)
        assert client.get_account_settings()["AccountLimit"]["UnreservedConcurrentExecutions"] == 850
    with running(probe(), limits=LambdaLimits(account_concurrency=50, min_unreserved_concurrency=10)) as (
        _,
        client,
    ):
        assert client.get_account_settings()["AccountLimit"]["ConcurrentExecutions"] == 50


def test_reservations_must_leave_the_minimum_unreserved():
    with running(probe("a"), probe("b")) as (_, client):
        client.put_function_concurrency(FunctionName="a", ReservedConcurrentExecutions=900)
        with pytest.raises(client.exceptions.InvalidParameterValueException) as info:
            client.put_function_concurrency(FunctionName="b", ReservedConcurrentExecutions=1)
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        assert info.value.response["Error"]["Message"] == (
            "Specified ReservedConcurrentExecutions for function decreases account's "
            + MIN_UNRESERVED.format(100)
        )
        # a function's own reservation is replaced, not added to
        client.put_function_concurrency(FunctionName="a", ReservedConcurrentExecutions=899)
        client.put_function_concurrency(FunctionName="b", ReservedConcurrentExecutions=1)
        assert client.get_function_concurrency(FunctionName="b")["ReservedConcurrentExecutions"] == 1


def test_a_host_refuses_functions_whose_reservations_leave_too_little_unreserved():
    with pytest.raises(ValueError, match="leave 50 of the account's 1000 concurrency unreserved"):
        LambdaHost([probe("a", reserved_concurrency=900), probe("b", reserved_concurrency=50)])


def test_provisioned_concurrency_beyond_the_reservation_or_the_unreserved_pool_is_refused():
    limits = LambdaLimits(account_concurrency=103)
    with running(probe("a"), probe("b"), limits=limits) as (host, client):
        client.put_function_concurrency(FunctionName="b", ReservedConcurrentExecutions=1)
        with pytest.raises(client.exceptions.InvalidParameterValueException) as info:
            client.put_provisioned_concurrency_config(
                FunctionName="b", Qualifier="live", ProvisionedConcurrentExecutions=2
            )
        assert info.value.response["Error"]["Message"] == (
            "Requested Provisioned Concurrency should not be greater than the "
            "reservedConcurrentExecution for function"
        )
        # 103 - 1 reserved = 102 unreserved: 2 provisioned leave the minimum of 100, 3 do not
        with pytest.raises(client.exceptions.InvalidParameterValueException) as info:
            client.put_provisioned_concurrency_config(
                FunctionName="a", Qualifier="live", ProvisionedConcurrentExecutions=3
            )
        assert info.value.response["Error"]["Message"] == (
            "Specified ConcurrentExecutions for function decreases account's " + MIN_UNRESERVED.format(100)
        )
        client.put_provisioned_concurrency_config(
            FunctionName="a", Qualifier="live", ProvisionedConcurrentExecutions=2
        )
        # a version has one configuration, on itself or on the alias pointing at it
        with pytest.raises(client.exceptions.ResourceConflictException):
            client.put_provisioned_concurrency_config(
                FunctionName="a", Qualifier="1", ProvisionedConcurrentExecutions=1
            )
        assert not host.pools["b"].provisioned


def test_invocations_beyond_the_account_concurrency_are_throttled():
    # GIVEN an account of 3, one reserved for a: b has an unreserved pool of 2
    limits = LambdaLimits(account_concurrency=3, min_unreserved_concurrency=1)
    with running(probe("a"), probe("b"), limits=limits) as (host, client):
        client.put_function_concurrency(FunctionName="a", ReservedConcurrentExecutions=1)
        with ThreadPoolExecutor(3) as pool:
            slow = [pool.submit(call, client, "b", {"sleep": 1.5}) for _ in range(2)]
            wait_for(lambda: host.pools["b"].in_flight() == 2)
            # WHEN b asks for a third, THEN Lambda's throttle; a's reservation still runs
            with pytest.raises(client.exceptions.TooManyRequestsException) as info:
                call(client, "b", {})
            assert call(client, "a", {})[1]["function"] == "a"
            assert all("FunctionError" not in s.result()[0] for s in slow)
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
        assert info.value.response["Reason"] == "ConcurrentInvocationLimitExceeded"
        assert host.meter.snapshot()["functions"]["b"]["throttles"] == 1
        # provisioned concurrency is held out of the pool, busy or not: one on-demand call fills it
        client.put_provisioned_concurrency_config(
            FunctionName="b", Qualifier="live", ProvisionedConcurrentExecutions=1
        )
        wait_for(lambda: host.pools["b"].provisioned_status("live")["Status"] == "READY")
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(call, client, "b", {"sleep": 1.5})
            wait_for(lambda: host.pools["b"].in_flight() == 1)
            with pytest.raises(client.exceptions.TooManyRequestsException):
                call(client, "b", {})
            assert call(client, "b", {}, Qualifier="live")[1]["init_type"] == "provisioned-concurrency"
            busy.result()


# --- the real AWS CLI ------------------------------------------------------------------------------


def _aws_cli() -> str | None:
    """The ``aws`` command, when one is installed and runs."""
    aws = shutil.which("aws")
    if aws is None:
        return None
    try:
        probe_run = subprocess.run([aws, "--version"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return aws if probe_run.returncode == 0 else None


AWS = _aws_cli()


@pytest.mark.skipif(AWS is None, reason="the AWS CLI (`aws`) is not installed or does not run here")
def test_the_aws_cli_reads_the_hosts_answers(tmp_path):
    env = {
        **os.environ,
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_PAGER": "",
        "AWS_MAX_ATTEMPTS": "1",
    }
    with running(probe()) as (host, _):

        def aws(*args: str) -> subprocess.CompletedProcess[str]:
            command = [str(AWS), "lambda", *args, "--endpoint-url", host.endpoint_url, "--no-sign-request"]
            return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)

        settings = aws("get-account-settings", "--output", "json")
        assert settings.returncode == 0, settings.stderr
        assert json.loads(settings.stdout)["AccountLimit"]["ConcurrentExecutions"] == 1000
        alias = aws("get-alias", "--function-name", "probe", "--name", "live", "--output", "json")
        assert json.loads(alias.stdout)["FunctionVersion"] == "1"
        missing = aws("get-alias", "--function-name", "probe", "--name", "nope")
        assert missing.returncode != 0
        assert "ResourceNotFoundException" in missing.stderr and "Cannot find alias arn" in missing.stderr
        invoked = aws(
            "invoke",
            "--function-name",
            "probe",
            "--qualifier",
            "live",
            "--payload",
            "{}",
            str(tmp_path / "out.json"),
        )
        assert invoked.returncode == 0, invoked.stderr
        assert json.loads(invoked.stdout)["ExecutedVersion"] == "1"
        assert json.loads((tmp_path / "out.json").read_text())["function"] == "probe"
