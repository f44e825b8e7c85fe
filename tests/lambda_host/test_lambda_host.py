"""The local Lambda host, driven through a plain boto3 ``lambda`` client.

Instances are real ``awslambdaric`` processes. Most tests use a probe handler
(``tests/lambda_handlers/probe.py``) that sleeps, raises or exits on request; the expert
tests use ``functions/expert/handler.py`` on a tiny packaged model.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from moeless.contracts.manifest import load_manifest
from moeless.contracts.payload import decode_matrix, encode_request
from moeless.contracts.plan import one_function_per_expert
from moeless.lambda_host import LambdaHost
from moeless.lambda_host.experts import expert_function_configs
from tests.lambda_helpers import call, lambda_client, probe, running, wait_for

REPO = Path(__file__).resolve().parents[2]


# --- expert functions ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifacts(tiny):
    return tiny.package("mixtral")


def test_expert_output_equals_onnxruntime_and_first_call_is_cold(artifacts):
    import onnxruntime as ort

    manifest = load_manifest(artifacts)
    configs = expert_function_configs(
        artifacts, one_function_per_expert(manifest), REPO / "functions" / "expert"
    )
    x = np.random.default_rng(0).standard_normal((5, manifest.hidden_size), dtype=np.float32)
    entry = manifest.expert(1, 6)
    direct = ort.InferenceSession(str(artifacts / entry.file)).run(["output"], {"hidden": x})[0]
    with running(*configs) as (host, client):
        first, first_body = call(client, "moeless-l001-e006", encode_request(1, 6, x), LogType="Tail")
        _, second_body = call(client, "moeless-l001-e006", encode_request(1, 6, x))
        bill = host.meter.snapshot()["functions"]["moeless-l001-e006"]
    np.testing.assert_array_equal(decode_matrix(first_body), direct)
    np.testing.assert_array_equal(decode_matrix(second_body), direct)
    assert first_body["init_ms"] > 0 and second_body["init_ms"] == 0
    assert "FunctionError" not in first
    assert "Init Duration" in base64.b64decode(first["LogResult"]).decode()
    assert bill["requests"] == 2 and bill["cold_starts"] == 1


def test_expert_function_with_tampered_artifacts_fails_init_with_function_error(artifacts, tmp_path):
    import shutil

    copy = tmp_path / "art"
    shutil.copytree(artifacts, copy)
    entry = load_manifest(copy).expert(0, 0)
    with open(copy / entry.file, "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    configs = expert_function_configs(
        copy, one_function_per_expert(load_manifest(copy)), REPO / "functions/expert"
    )
    with running(configs[0]) as (_, client):
        response, body = call(client, configs[0].name, encode_request(0, 0, np.zeros((1, 64), np.float32)))
    assert response["FunctionError"] == "Unhandled"
    assert body["errorType"] == "ArtifactError" and "checksum" in body["errorMessage"]


# --- Lambda semantics, with the probe handler ----------------------------------------------------


def test_parallel_calls_scale_out_to_one_instance_each_then_reuse_them():
    with running(probe()) as (host, client):
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: call(client, "probe", {"sleep": 0.6})[1], range(4)))
        assert len({a["pid"] for a in answers}) == 4
        assert len(host.pools["probe"].instances) == 4
        _, again = call(client, "probe", {})
        assert again["pid"] in {a["pid"] for a in answers}  # warm reuse, no fifth instance
        assert host.meter.snapshot()["functions"]["probe"]["cold_starts"] == 4


def test_reserved_concurrency_throttles_with_429():
    with running(probe()) as (host, client):
        client.put_function_concurrency(FunctionName="probe", ReservedConcurrentExecutions=1)
        assert client.get_function_concurrency(FunctionName="probe")["ReservedConcurrentExecutions"] == 1
        with ThreadPoolExecutor(2) as pool:
            slow = pool.submit(call, client, "probe", {"sleep": 1.0})
            time.sleep(0.3)
            with pytest.raises(client.exceptions.TooManyRequestsException) as info:
                call(client, "probe", {})
            assert slow.result()[1]["pid"]
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
        assert info.value.response["Reason"] == "ReservedFunctionConcurrentInvocationLimitExceeded"
        assert host.meter.snapshot()["functions"]["probe"]["throttles"] == 1
        client.delete_function_concurrency(FunctionName="probe")
        assert call(client, "probe", {})[1]["pid"]


def test_reserved_concurrency_zero_throttles_a_function_with_a_warm_instance():
    with running(probe()) as (host, client):
        warm_pid = call(client, "probe", {})[1]["pid"]
        assert [i["state"] for i in host.describe()["probe"]["instances"]] == ["idle"]
        client.put_function_concurrency(FunctionName="probe", ReservedConcurrentExecutions=0)
        for _ in range(3):
            with pytest.raises(client.exceptions.TooManyRequestsException):
                call(client, "probe", {})
        assert host.meter.snapshot()["functions"]["probe"]["throttles"] == 3
        client.delete_function_concurrency(FunctionName="probe")
        assert call(client, "probe", {})[1]["pid"] == warm_pid


def test_list_provisioned_concurrency_configs_and_lambda_shaped_errors():
    with running(probe()) as (host, client):
        assert (
            client.list_provisioned_concurrency_configs(FunctionName="probe")["ProvisionedConcurrencyConfigs"]
            == []
        )
        client.put_provisioned_concurrency_config(
            FunctionName="probe", Qualifier="live", ProvisionedConcurrentExecutions=1
        )
        (config,) = client.list_provisioned_concurrency_configs(FunctionName="probe")[
            "ProvisionedConcurrencyConfigs"
        ]
        assert config["FunctionArn"].endswith(":function:probe:live")
        assert config["RequestedProvisionedConcurrentExecutions"] == 1
        with pytest.raises(client.exceptions.ResourceNotFoundException) as info:
            client.get_function(FunctionName="missing")
        assert info.value.response["Error"]["Message"].startswith("Function not found: arn:aws:lambda:")
        raw = httpx.get(f"{host.endpoint_url}/2015-03-31/functions/missing")
        assert raw.status_code == 404 and "Message" in raw.json() and "message" not in raw.json()


def test_provisioned_instances_are_ready_before_traffic_and_serve_without_init():
    with running(probe()) as (host, client):
        with pytest.raises(client.exceptions.InvalidParameterValueException):
            client.put_provisioned_concurrency_config(
                FunctionName="probe", Qualifier="$LATEST", ProvisionedConcurrentExecutions=1
            )
        answer = client.put_provisioned_concurrency_config(
            FunctionName="probe", Qualifier="live", ProvisionedConcurrentExecutions=2
        )
        assert answer["RequestedProvisionedConcurrentExecutions"] == 2
        wait_for(
            lambda: (
                client.get_provisioned_concurrency_config(FunctionName="probe", Qualifier="live")["Status"]
                == "READY"
            )
        )
        response, body = call(client, "probe", {}, Qualifier="live", LogType="Tail")
        assert body["init_type"] == "provisioned-concurrency"
        assert body["arn"].endswith(":function:probe:live")
        assert "Init Duration" not in base64.b64decode(response["LogResult"]).decode()
        bill = host.meter.snapshot()["functions"]["probe"]
        assert bill["cold_starts"] == 0 and bill["provisioned_inits"] == 2
        assert bill["billed_ms_provisioned"] >= 1 and bill["billed_ms"] == 0
        # $LATEST does not use the alias's provisioned instances: it cold-starts its own
        assert call(client, "probe", {})[1]["init_type"] == "on-demand"
        client.delete_provisioned_concurrency_config(FunctionName="probe", Qualifier="live")
        with pytest.raises(client.exceptions.ProvisionedConcurrencyConfigNotFoundException):
            client.get_provisioned_concurrency_config(FunctionName="probe", Qualifier="live")
        wait_for(lambda: all(i["qualifier"] is None for i in host.describe()["probe"]["instances"]))


def test_handler_exception_is_a_function_error_and_the_instance_survives():
    with running(probe()) as (_, client):
        _, first = call(client, "probe", {})
        response, body = call(client, "probe", {"raise": "bad input on purpose"})
        assert response["StatusCode"] == 200 and response["FunctionError"] == "Unhandled"
        assert body["errorType"] == "ValueError" and body["errorMessage"] == "bad input on purpose"
        assert call(client, "probe", {})[1]["pid"] == first["pid"]


def test_killed_instance_is_replaced_on_the_next_call():
    with running(probe()) as (host, client):
        _, first = call(client, "probe", {})
        os.kill(first["pid"], signal.SIGKILL)
        wait_for(lambda: not host.pools["probe"].instances)
        response, second = call(client, "probe", {})
        assert "FunctionError" not in response and second["pid"] != first["pid"]
        # dying mid-invocation: that call gets Lambda's exit error, the next one a new instance
        response, body = call(client, "probe", {"exit": 3})
        assert response["FunctionError"] == "Unhandled" and body["errorType"] == "Runtime.ExitError"
        assert call(client, "probe", {})[1]["pid"] not in (first["pid"], second["pid"])


def test_killed_provisioned_instance_is_replaced_to_keep_the_count():
    with running(probe()) as (host, client):
        client.put_provisioned_concurrency_config(
            FunctionName="probe", Qualifier="live", ProvisionedConcurrentExecutions=1
        )
        wait_for(lambda: host.pools["probe"].provisioned_status("live")["Status"] == "READY")
        victim = host.pools["probe"].instances[0].process.pid
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: [
                i
                for i in host.describe()["probe"]["instances"]
                if i["state"] == "idle" and i["pid"] != victim
            ]
        )
        assert call(client, "probe", {}, Qualifier="live")[1]["init_type"] == "provisioned-concurrency"


def test_timeout_kills_the_instance_and_reports_it():
    with running(probe(timeout_s=0.5)) as (_, client):
        response, body = call(client, "probe", {"sleep": 5})
        assert response["FunctionError"] == "Unhandled" and body["errorType"] == "Sandbox.Timedout"
        assert "Task timed out after 0.50 seconds" in body["errorMessage"]
        assert call(client, "probe", {})[1]["pid"]


def test_init_failure_is_reported_to_the_caller():
    with running(probe(environment={"PROBE_FAIL_INIT": "1"})) as (_, client):
        response, body = call(client, "probe", {})
    assert response["FunctionError"] == "Unhandled"
    assert body["errorType"] == "RuntimeError" and "init failed on purpose" in body["errorMessage"]


def test_idle_instances_are_reaped():
    with running(probe(), idle_timeout_s=0.3) as (host, client):
        _, first = call(client, "probe", {})
        wait_for(lambda: not host.pools["probe"].instances, timeout=10)
        _, second = call(client, "probe", {})
        assert second["pid"] != first["pid"]
        assert host.meter.snapshot()["functions"]["probe"]["cold_starts"] == 2


def test_host_limit_evicts_idle_instances_and_throttles_when_all_are_busy():
    with running(probe("a"), probe("b"), max_instances=1) as (host, client):
        _, a = call(client, "a", {})
        _, b = call(client, "b", {})  # a's idle instance makes room for b's
        wait_for(lambda: not host.pools["a"].instances)
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(call, client, "b", {"sleep": 1.0})
            time.sleep(0.3)
            with pytest.raises(client.exceptions.TooManyRequestsException) as info:
                call(client, "a", {})
            busy.result()
        assert info.value.response["Reason"] == "ConcurrentInvocationLimitExceeded"
        assert a["pid"] != b["pid"]


def test_invocation_types_and_bad_requests():
    with running(probe()) as (host, client):
        assert client.invoke(FunctionName="probe", InvocationType="DryRun")["StatusCode"] == 204
        assert client.invoke(FunctionName="probe", InvocationType="Event", Payload=b"{}")["StatusCode"] == 202
        wait_for(lambda: host.meter.snapshot()["functions"]["probe"]["requests"] == 1)
        with pytest.raises(client.exceptions.InvalidRequestContentException):
            client.invoke(FunctionName="probe", Payload=b"{not json")
        with pytest.raises(client.exceptions.RequestTooLargeException):
            client.invoke(FunctionName="probe", Payload=json.dumps({"x": "a" * (6 * 1024 * 1024)}))
        with pytest.raises(client.exceptions.ResourceNotFoundException):
            client.invoke(FunctionName="missing", Payload=b"{}")
        # a qualified ARN works as a name, as on AWS
        arn = client.get_function(FunctionName="probe")["Configuration"]["FunctionArn"]
        assert call(client, f"{arn}:live", {})[1]["arn"] == f"{arn}:live"
        assert [f["FunctionName"] for f in client.list_functions()["Functions"]] == ["probe"]


def test_meter_matches_the_report_lines():
    with running(probe(memory_mb=512)) as (host, client):
        reports = []
        for event in ({}, {"sleep": 0.05}, {}):
            response, _ = call(client, "probe", event, LogType="Tail")
            reports.append(base64.b64decode(response["LogResult"]).decode().splitlines()[-1])
        bill = host.meter.snapshot()
    billed = [int(r.split("Billed Duration: ")[1].split(" ms")[0]) for r in reports]
    row = bill["functions"]["probe"]
    assert row["billed_ms"] == sum(billed) and billed[1] >= 50
    assert row["gb_seconds"] == pytest.approx(sum(billed) / 1000 * 512 / 1024)
    prices = bill["prices"]
    expected = 3 * prices["per_request"] + row["gb_seconds"] * prices["per_gb_second"]
    assert row["cost_usd"] == pytest.approx(expected)


def test_stopping_the_host_fails_an_invoke_in_flight_explicitly_and_leaves_no_process():
    import psutil

    host = LambdaHost([probe()]).start()
    client = lambda_client(host.endpoint_url)
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(call, client, "probe", {"sleep": 5.0})
        wait_for(lambda: host.pools["probe"].in_flight() == 1)
        pids = [i["pid"] for i in host.pools["probe"].describe()]
        started = time.monotonic()
        host.stop()
        # the caller hears of it at once: an error naming what happened, not a 5 s wait or a hang
        try:
            response, body = in_flight.result(timeout=30)
        except Exception as exc:  # the listener is gone: a connection error is explicit too
            assert str(exc)
        else:
            assert response.get("FunctionError") and body["errorType"]
        assert time.monotonic() - started < 5.0
    assert not [
        p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
