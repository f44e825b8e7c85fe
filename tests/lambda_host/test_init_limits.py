"""Lambda's init limits on the local host, and what a failed provisioned configuration costs.

The probe handler sleeps in init (``PROBE_INIT_SLEEP``) or fails it (``PROBE_FAIL_INIT``); the
limits are set far below AWS's (10 s on demand, 130 s provisioned) so the tests stay fast.
"""

from __future__ import annotations

import base64
import re
import time

from moeless.aws_limits import LambdaLimits
from tests.lambda_helpers import call, probe, running, wait_for


def report_field(report: str, field: str) -> float:
    return float(re.search(rf"{field}: ([\d.]+) ms", report).group(1))


def test_an_on_demand_init_over_its_limit_is_retried_within_the_invocation(tmp_path):
    # GIVEN an init of 0.8 s against a limit of 0.3 s, and a function timeout that covers a retry
    slow = probe(environment={"PROBE_INIT_SLEEP": "0.8"}, timeout_s=5.0)
    limits = LambdaLimits(on_demand_init_s=0.3)
    with running(slow, limits=limits, log_dir=tmp_path) as (host, client):
        # WHEN it is invoked
        response, body = call(client, "probe", {}, LogType="Tail")
        # THEN the first init is abandoned at its limit, reported as Lambda reports it, and the
        # invocation succeeds on a second init, which its Duration includes
        assert "FunctionError" not in response and body["init_type"] == "on-demand"
        logs = "".join(path.read_text() for path in (tmp_path / "probe").glob("*.log"))
        assert re.search(r"INIT_REPORT Init Duration: [\d.]+ ms\tPhase: init\tStatus: timeout", logs)
        report = base64.b64decode(response["LogResult"]).decode().splitlines()[-1]
        assert report_field(report, "Duration") >= 800
        assert 300 <= report_field(report, "Init Duration") < 800
        assert [i["pid"] for i in host.describe()["probe"]["instances"]] == [body["pid"]]
        bill = host.meter.snapshot()["functions"]["probe"]
        assert bill["cold_starts"] == 1 and bill["billed_ms"] >= 1100


def test_a_retried_init_is_bounded_by_the_function_timeout():
    slow = probe(environment={"PROBE_INIT_SLEEP": "5"}, timeout_s=1.0)
    with running(slow, limits=LambdaLimits(on_demand_init_s=0.3)) as (host, client):
        started = time.monotonic()
        response, body = call(client, "probe", {})
        assert time.monotonic() - started < 4.0  # 0.3 s + the 1 s timeout, not the 5 s init
        assert response["FunctionError"] == "Unhandled" and body["errorType"] == "Sandbox.Timedout"
        assert "Task timed out after 1.00 seconds" in body["errorMessage"]
        wait_for(lambda: not host.pools["probe"].instances)


def test_a_provisioned_init_over_its_limit_fails_the_configuration_and_bills_nothing():
    # GIVEN a provisioned init limit of max(0.5 s, the 0.5 s timeout), and an init of 5 s
    slow = probe(environment={"PROBE_INIT_SLEEP": "5"}, timeout_s=0.5)
    with running(slow, limits=LambdaLimits(provisioned_init_s=0.5)) as (host, client):
        client.put_provisioned_concurrency_config(
            FunctionName="probe", Qualifier="live", ProvisionedConcurrentExecutions=1
        )

        # THEN the configuration fails with Lambda's reason, well before the init would end
        def settled():
            status = client.get_provisioned_concurrency_config(FunctionName="probe", Qualifier="live")
            return status if status["Status"] != "IN_PROGRESS" else None

        status = wait_for(settled, timeout=4.0)
        assert status["Status"] == "FAILED" and status["StatusReason"] == "FUNCTION_ERROR_INIT_FAILURE"
        assert status["AllocatedProvisionedConcurrentExecutions"] == 0
        assert host.wait_provisioned(timeout_s=1.0) == {"probe:live": "init did not finish in 0.5 s"}
        wait_for(lambda: not host.pools["probe"].instances)
        bill = host.meter.snapshot()["functions"]["probe"]
        assert bill["provisioned_gb_seconds"] == 0 and bill["cost_usd"] == 0


def test_a_provisioned_configuration_whose_init_fails_is_not_billed():
    with running(probe(environment={"PROBE_FAIL_INIT": "1"})) as (host, client):
        client.put_provisioned_concurrency_config(
            FunctionName="probe", Qualifier="live", ProvisionedConcurrentExecutions=2
        )
        wait_for(lambda: host.pools["probe"].provisioned_status("live")["Status"] == "FAILED")
        (failure,) = host.wait_provisioned(timeout_s=1.0).values()
        assert "init failed on purpose" in failure
        assert host.meter.snapshot()["totals"]["cost_usd"] == 0
        client.delete_provisioned_concurrency_config(FunctionName="probe", Qualifier="live")
        assert host.meter.snapshot()["totals"]["cost_usd"] == 0
