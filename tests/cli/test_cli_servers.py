"""``moeless functions up`` as a user runs it: a process that serves until SIGTERM, then bills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from moeless.contracts.manifest import load_manifest
from moeless.contracts.payload import encode_request
from moeless.contracts.plan import one_function_per_expert
from tests.lambda_helpers import lambda_client

REPO = Path(__file__).resolve().parents[2]
MOELESS = str(Path(sys.executable).with_name("moeless"))  # the console script of this environment


def test_functions_up_serves_the_plan_and_prints_the_bill_on_sigterm(tiny, tmp_path):
    artifacts = tiny.package("mixtral")
    plan = one_function_per_expert(load_manifest(artifacts))
    plan.functions[0].provisioned_concurrency = 1
    plan.save(tmp_path / "plan.json")
    command = [
        MOELESS,
        "functions",
        "up",
        str(artifacts),
        "--plan",
        str(tmp_path / "plan.json"),
        "--port",
        "0",
        "--meter-out",
        str(tmp_path / "bill.json"),
        "--account-concurrency",
        "150",
    ]
    process = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("Lambda API: http://127.0.0.1:"), line + process.stderr.read()
        endpoint = line.split()[2]
        client = lambda_client(endpoint)
        x = np.ones((3, 64), np.float32)
        first = plan.functions[0]
        ((layer, expert),) = first.experts
        reply = json.loads(
            client.invoke(
                FunctionName=first.name,
                Qualifier="live",
                Payload=json.dumps(encode_request(layer, expert, x)),
            )["Payload"].read()
        )
        assert reply["shape"] == [3, 64] and reply["init_ms"] == 0  # provisioned before traffic
        # the account's concurrency as given: a reservation leaving under 100 unreserved is refused
        assert client.get_account_settings()["AccountLimit"]["ConcurrentExecutions"] == 150
        with pytest.raises(client.exceptions.InvalidParameterValueException):
            client.put_function_concurrency(FunctionName=first.name, ReservedConcurrentExecutions=51)
        with urllib.request.urlopen(f"{endpoint}/moeless/instances") as answer:
            pids = [i["pid"] for f in json.load(answer).values() for i in f["instances"]]
        assert pids
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "bill (what AWS Lambda would charge)" in out and first.name in out
    bill = json.loads((tmp_path / "bill.json").read_text())
    assert bill["functions"][first.name]["provisioned_inits"] == 1
    assert bill["totals"]["requests"] == 1 and bill["totals"]["provisioned_gb_seconds"] > 0
    for pid in pids:  # every instance process is gone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"instance process {pid} outlived the host")


def test_functions_up_refuses_a_bad_plan(tiny, tmp_path):
    (tmp_path / "plan.json").write_text('{"schema_version": 1, "policy": "x", "layers": []}')
    result = subprocess.run(
        [
            MOELESS,
            "functions",
            "up",
            str(tiny.package("mixtral")),
            "--plan",
            str(tmp_path / "plan.json"),
            "--port",
            "0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "places no replica" in result.stderr


def test_serve_local_answers_moeless_invoke_and_bills_on_sigterm(tiny, tmp_path):
    artifacts = tiny.package("mixtral")
    command = [
        MOELESS,
        "serve",
        str(artifacts),
        "--local",
        "--port",
        "0",
        "--meter-out",
        str(tmp_path / "bill.json"),
    ]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("REST endpoint: http://127.0.0.1:"), line + process.stderr.read()
        endpoint = line.split()[2].removesuffix("/v1")
        answer = subprocess.run(
            [
                MOELESS,
                "invoke",
                "The quick brown fox",
                "--endpoint",
                endpoint,
                "--max-tokens",
                "5",
                "--no-stream",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert answer.returncode == 0, answer.stderr
        assert "'completion_tokens':" in answer.stderr
        refused = subprocess.run(
            [MOELESS, "invoke", "hi", "--endpoint", endpoint, "--max-tokens", "999999"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 1 and "400" in refused.stderr and "max_tokens" in refused.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "bill (what AWS Lambda would charge)" in out
    assert json.loads((tmp_path / "bill.json").read_text())["totals"]["requests"] > 0
