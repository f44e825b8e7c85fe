"""``moeless deploy``'s control-plane paths against moto (a real AWS API implementation, on
127.0.0.1), and the CDK CLI's place in it stood in for by a recording runner.

moto implements no provisioned-concurrency calls and runs no container-image Lambda without
Docker: provisioned concurrency is tested on the local Lambda host (test_apply_plan.py) and in
the synthesised templates (test_cdk_app.py), not here.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("moto.server", reason="needs moto[server] (the dev extra)")
import boto3
from moto.server import ThreadedMotoServer

from cli.main import cli
from moeless.artifacts.store import download_artifacts, upload_artifacts
from moeless.contracts.manifest import load_manifest
from moeless.contracts.plan import one_function_per_expert, plan_for
from moeless.contracts.rest import PUBLIC_ROUTES
from moeless.deployment.cloud_mirror import mirror_deployment
from moeless.deployment.deploy import DeployError, DeployRequest, check, deploy, destroy, synthesize
from moeless.errors import ArtifactError, PlanDoesNotFit


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def moto_url():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def session(monkeypatch) -> boto3.Session:
    for key in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    return boto3.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )


def planned(artifacts: Path):
    plan = one_function_per_expert(load_manifest(artifacts))
    plan.functions[0].memory_mb = 3008
    plan.functions[0].reserved_concurrency = 4
    plan.functions[1].provisioned_concurrency = 1
    return plan


class TestArtifactStore:
    def test_upload_resumes_and_download_refuses_a_tampered_object(self, tiny, moto_url, session, tmp_path):
        s3 = session.client("s3", endpoint_url=moto_url)
        s3.create_bucket(Bucket="store")
        artifacts = tiny.package()
        first = upload_artifacts(s3, artifacts, "s3://store/pkg")
        again = upload_artifacts(s3, artifacts, "s3://store/pkg")
        assert first.uploaded and not first.skipped
        assert not again.uploaded and len(again.skipped) == len(first.uploaded)
        assert first.uploaded[-1] == "manifest.json"  # last: readers never see a partial package

        manifest = download_artifacts(
            s3, "s3://store/pkg", tmp_path / "copy", experts=[(manifest_layer(artifacts), 0)], backbone=False
        )
        assert len(list((tmp_path / "copy").rglob("*.onnx"))) == 1

        entry = manifest.experts[1]
        s3.put_object(Bucket="store", Key=f"pkg/{entry.file}", Body=b"tampered")
        with pytest.raises(ArtifactError, match="does not match its manifest checksum"):
            download_artifacts(
                s3, "s3://store/pkg", tmp_path / "copy2", experts=[(entry.layer, entry.expert)]
            )
        assert not (tmp_path / "copy2" / entry.file).exists()

    def test_a_package_failing_its_manifest_is_not_uploaded(self, tiny, moto_url, session, tmp_path):
        import shutil

        s3 = session.client("s3", endpoint_url=moto_url)
        s3.create_bucket(Bucket="refuse")
        copy = tmp_path / "pkg"
        shutil.copytree(tiny.package(), copy)
        victim = next(copy.rglob("*.onnx"))
        victim.write_bytes(victim.read_bytes()[:-4] + b"XXXX")
        with pytest.raises(ArtifactError, match="fails its manifest"):
            upload_artifacts(s3, copy, "s3://refuse/pkg")
        assert s3.list_objects_v2(Bucket="refuse").get("KeyCount", 0) == 0


def manifest_layer(artifacts: Path) -> int:
    return load_manifest(artifacts).moe_layers[0]


class TestMirror:
    def test_creates_the_stacks_resources_and_a_rerun_updates(self, tiny, moto_url, session):
        artifacts = tiny.package()
        plan = planned(artifacts)
        report = mirror_deployment(session, artifacts, plan, "mirror", "http://127.0.0.1:8000", moto_url)
        lam = session.client("lambda", endpoint_url=moto_url)
        names = {
            f["FunctionName"]: f
            for f in lam.list_functions()["Functions"]
            if f["FunctionName"].startswith("moeless-mirror-")
        }
        assert sorted(names) == sorted(report.functions) and len(names) == len(plan.functions)
        first = report.functions[0]
        assert names[first]["MemorySize"] == 3008 and names[first]["PackageType"] == "Image"
        assert lam.get_function_concurrency(FunctionName=first)["ReservedConcurrentExecutions"] == 4
        assert lam.get_alias(FunctionName=first, Name="live")["FunctionVersion"] == "1"
        assert report.notes and "provisioned concurrency" in report.notes[0]

        s3 = session.client("s3", endpoint_url=moto_url)
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket=report.bucket)["Contents"]}
        digest = load_manifest(artifacts).digest()
        assert {f"mirror/plans/{plan.digest()}.json", f"mirror/artifacts/{digest}/manifest.json"} <= keys

        apigw = session.client("apigateway", endpoint_url=moto_url)
        paths = {r["path"]: r for r in apigw.get_resources(restApiId=report.api_id)["items"]}
        assert {route.path for route in PUBLIC_ROUTES} <= set(paths)
        method = apigw.get_method(
            restApiId=report.api_id, resourceId=paths["/v1/completions"]["id"], httpMethod="POST"
        )
        assert method["apiKeyRequired"] is True
        assert method["methodIntegration"]["uri"] == "http://127.0.0.1:8000/v1/completions"
        (usage_plan,) = [p for p in apigw.get_usage_plans()["items"] if p["name"] == "moeless-mirror"]
        assert usage_plan["throttle"]["rateLimit"] == 50.0
        assert report.api_key

        again = mirror_deployment(session, artifacts, plan, "mirror", "http://127.0.0.1:8000", moto_url)
        assert again.api_id == report.api_id and again.api_key == report.api_key
        assert lam.get_alias(FunctionName=first, Name="live")["FunctionVersion"] == "2"


class RecordingCdk:
    """Stands in for the CDK CLI: records each command and, for a deploy, does what the stacks
    would (creates the bucket and API key in moto) and writes the outputs file."""

    def __init__(self, session: boto3.Session, moto_url: str, fail_on: str | None = None) -> None:
        self.session, self.moto_url, self.fail_on = session, moto_url, fail_on
        self.commands: list[list[str]] = []

    def __call__(self, command: list[str], **kwargs) -> subprocess.CompletedProcess:
        self.commands.append(command)
        if self.fail_on and self.fail_on in command:
            return subprocess.CompletedProcess(command, 1)
        if command[1] == "deploy":
            outputs_file = Path(command[command.index("--outputs-file") + 1])
            outputs_file.parent.mkdir(parents=True, exist_ok=True)
            outputs = {"Moeless-t-Artifacts": {"BucketName": "moeless-t-bucket"}}
            self.session.client("s3", endpoint_url=self.moto_url).create_bucket(Bucket="moeless-t-bucket")
            if "--all" in command:
                key = self.session.client("apigateway", endpoint_url=self.moto_url).create_api_key(
                    name="k", enabled=True
                )
                outputs["Moeless-t-Api"] = {
                    "Endpoint": "https://example.execute-api/t/",
                    "ApiKeyId": key["id"],
                }
            outputs_file.write_text(json.dumps(outputs))
        return subprocess.CompletedProcess(command, 0)


class AccountLambda:
    """The Lambda control plane of an account, for what moto lacks (account settings, provisioned
    concurrency): ``limit`` concurrent executions, the stage's functions deployed as ``deployed``,
    and allocations that end READY, or FAILED for the functions in ``failing``."""

    class exceptions:
        class ResourceNotFoundException(Exception):
            pass

        class ProvisionedConcurrencyConfigNotFoundException(Exception):
            pass

    def __init__(self, limit: int = 1000, deployed: list[str] = (), failing: set[str] = frozenset()) -> None:
        self.limit, self.deployed, self.failing = limit, list(deployed), failing
        self.provisioned: dict[str, int] = {}

    def get_account_settings(self) -> dict:
        return {
            "AccountLimit": {"ConcurrentExecutions": self.limit, "UnreservedConcurrentExecutions": self.limit}
        }

    def get_paginator(self, operation: str):
        assert operation == "list_functions"
        pages = [{"Functions": [{"FunctionName": name} for name in self.deployed]}]
        return type("Paginator", (), {"paginate": lambda _self: iter(pages)})()

    def get_function_concurrency(self, FunctionName: str) -> dict:
        if FunctionName not in self.deployed:
            raise self.exceptions.ResourceNotFoundException(FunctionName)
        return {}

    def get_provisioned_concurrency_config(self, FunctionName: str, Qualifier: str) -> dict:
        if FunctionName not in self.provisioned:
            raise self.exceptions.ProvisionedConcurrencyConfigNotFoundException(FunctionName)
        failed = FunctionName in self.failing
        return {
            "RequestedProvisionedConcurrentExecutions": self.provisioned[FunctionName],
            "Status": "FAILED" if failed else "READY",
            "StatusReason": "init failed" if failed else "",
        }

    def put_provisioned_concurrency_config(
        self, FunctionName: str, Qualifier: str, ProvisionedConcurrentExecutions: int
    ) -> None:
        self.provisioned[FunctionName] = ProvisionedConcurrentExecutions


class EndpointSession:
    """A boto3 Session whose clients all talk to moto, but Lambda's control plane (``lam``)."""

    def __init__(self, session: boto3.Session, url: str, lam: AccountLambda | None = None) -> None:
        self.session, self.url, self.lam = session, url, lam or AccountLambda()
        self.region_name = session.region_name

    def client(self, service: str):
        if service == "lambda":
            return self.lam
        return self.session.client(service, endpoint_url=self.url)


def fake_cdk_dir(tmp_path: Path) -> Path:
    cdk_dir = tmp_path / "cdk"
    (cdk_dir / "node_modules" / ".bin").mkdir(parents=True)
    (cdk_dir / "node_modules" / ".bin" / "cdk").write_text("#!/bin/sh\n")
    (cdk_dir / "cdk.json").write_text('{"app": "python3 app.py", "context": {}}')
    return cdk_dir


def stage_functions(artifacts: Path, stage: str = "t") -> list[str]:
    return [f.name for f in planned(artifacts).prefixed(f"moeless-{stage}-").functions]


class TestDeploy:
    def test_check_then_artifacts_stack_then_upload_then_all_stacks_then_concurrency_then_key(
        self, tiny, moto_url, session, tmp_path
    ):
        artifacts = tiny.package()
        plan = planned(artifacts)
        plan.save(tmp_path / "plan.json")
        request = DeployRequest(artifacts, tmp_path / "plan.json", stage="t", cdk_dir=fake_cdk_dir(tmp_path))
        cdk = RecordingCdk(session, moto_url)
        lam = AccountLambda(deployed=stage_functions(artifacts), failing={stage_functions(artifacts)[1]})
        said: list[str] = []
        result = deploy(request, EndpointSession(session, moto_url, lam), runner=cdk, say=said.append)
        verbs = [(c[1], c[2]) for c in cdk.commands]
        assert verbs == [("deploy", "Moeless-t-Artifacts"), ("deploy", "--all")]
        assert f"moeless:plan={(tmp_path / 'plan.json').resolve()}" in cdk.commands[0]
        s3 = session.client("s3", endpoint_url=moto_url)
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket="moeless-t-bucket")["Contents"]}
        digest = load_manifest(artifacts).digest()
        assert {f"t/plans/{plan.digest()}.json", f"t/artifacts/{digest}/manifest.json"} <= keys
        assert result.endpoint.startswith("https://") and len(result.api_key) >= 20
        # provisioned concurrency is set after the stacks, and a failed allocation is reported
        assert lam.provisioned == {stage_functions(artifacts)[1]: 1}
        assert [a.status for a in result.allocations] == ["FAILED"] == [a.status for a in result.unallocated]
        assert any("not ready" in line and "init failed" in line for line in said)
        assert said[0].startswith("[1/6] checking the account")

    def test_a_plan_the_account_cannot_hold_stops_before_any_stack(self, tiny, moto_url, session, tmp_path):
        artifacts = tiny.package()
        plan = planned(artifacts)
        plan.functions[2].reserved_concurrency = 950
        plan.save(tmp_path / "plan.json")
        request = DeployRequest(artifacts, tmp_path / "plan.json", stage="t", cdk_dir=fake_cdk_dir(tmp_path))
        cdk = RecordingCdk(session, moto_url)
        with pytest.raises(PlanDoesNotFit, match="ask for 55 more"):
            deploy(request, EndpointSession(session, moto_url), runner=cdk, say=lambda _m: None)
        assert cdk.commands == []

    def test_a_failing_step_names_itself_and_stops(self, tiny, moto_url, session, tmp_path):
        request = DeployRequest(tiny.package(), stage="t", cdk_dir=fake_cdk_dir(tmp_path))
        cdk = RecordingCdk(session, moto_url, fail_on="Moeless-t-Artifacts")
        with pytest.raises(DeployError, match="deploying the artifacts stack failed"):
            deploy(request, EndpointSession(session, moto_url), runner=cdk, say=lambda _m: None)
        assert len(cdk.commands) == 1

    def test_destroy_then_deploy_again(self, tiny, moto_url, session, tmp_path):
        # given a stage whose stacks a `cdk destroy` removed, leaving the retained bucket and repositories
        request = DeployRequest(tiny.package(), stage="again", cdk_dir=fake_cdk_dir(tmp_path))
        endpoint = EndpointSession(session, moto_url)
        account = session.client("sts", endpoint_url=moto_url).get_caller_identity()["Account"]
        bucket = request.names.bucket(account, "us-east-1")
        s3 = session.client("s3", endpoint_url=moto_url)
        s3.create_bucket(Bucket=bucket)
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        s3.put_object(Bucket=bucket, Key="again/artifacts/x", Body=b"1")
        s3.put_object(Bucket=bucket, Key="again/artifacts/x", Body=b"2")
        ecr = session.client("ecr", endpoint_url=moto_url)
        ecr.create_repository(repositoryName=request.names.repository("expert"))
        # then a deploy refuses at once, naming them and the way out
        with pytest.raises(DeployError, match=f"bucket {bucket}, repository moeless-again-expert remain"):
            deploy(request, endpoint, runner=RecordingCdk(session, moto_url), say=lambda _m: None)
        # and `moeless destroy` removes them after the stacks, so the stage deploys again
        cdk = RecordingCdk(None, "")
        removed = destroy(request, endpoint, runner=cdk)
        assert cdk.commands[0][1:4] == ["destroy", "--all", "--app"] and "--force" in cdk.commands[0]
        assert removed == [f"bucket {bucket}", "repository moeless-again-expert"]
        assert bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}
        manifest = load_manifest(request.artifacts)
        assert check(request, endpoint, manifest, plan_for(manifest, None)).shortfalls == ()

    def test_destroy_keeping_data_removes_only_the_stacks(self, tiny, moto_url, session, tmp_path):
        cdk = RecordingCdk(None, "")
        request = DeployRequest(tiny.package(), stage="t", cdk_dir=fake_cdk_dir(tmp_path))
        assert destroy(request, EndpointSession(session, moto_url), runner=cdk, keep_data=True) == []
        assert len(cdk.commands) == 1

    def test_missing_cli_says_how_to_install_it(self, tiny, tmp_path):
        cdk_dir = fake_cdk_dir(tmp_path)
        (cdk_dir / "node_modules" / ".bin" / "cdk").unlink()
        with pytest.raises(DeployError, match="npm ci --prefix"):
            destroy(
                DeployRequest(tiny.package(), cdk_dir=cdk_dir), session=None, runner=RecordingCdk(None, "")
            )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("limit", "memory_cap", "exit_code", "said"),
    [
        pytest.param(1000, 10_240, 0, "the account holds stage t's plan", id="holds"),
        pytest.param(100, 10_240, 1, "ask for 5 more", id="too-little-concurrency"),
        pytest.param(
            1000,
            2048,
            1,
            "Lambda function memory: the plan needs 3,008, the account has 2,048",
            id="memory-cap",
        ),
    ],
)
def test_cli_check_reads_the_account_and_names_what_to_raise(
    tiny, moto_url, session, tmp_path, monkeypatch, limit, memory_cap, exit_code, said
):
    # given an account of ``limit`` concurrent executions, and the plan reserving 4 and provisioning 1
    artifacts = tiny.package()
    planned(artifacts).save(tmp_path / "plan.json")
    account = EndpointSession(session, moto_url, AccountLambda(limit=limit))
    monkeypatch.setattr("cli.cmd_deploy.aws_session", lambda _profile: account)
    command = ["deploy", str(artifacts), "--plan", str(tmp_path / "plan.json"), "--stage", "t", "--check"]
    result = CliRunner().invoke(cli, [*command, "--max-function-memory-mb", str(memory_cap)])
    # then --check says whether it fits and, where not, which quota to raise and by how much
    assert result.exit_code == exit_code, result.output
    assert said in result.output


def test_cli_synth_only_writes_the_assembly_offline(tiny, tmp_path, monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    artifacts = tiny.package()
    planned(artifacts).save(tmp_path / "plan.json")
    monkeypatch.chdir(tmp_path)  # -o is relative to the caller's folder, as in the README
    out = tmp_path / "assembly"
    result = CliRunner().invoke(
        cli,
        [
            "deploy",
            str(artifacts),
            "--plan",
            "plan.json",
            "--stage",
            "synth",
            "--synth-only",
            "-o",
            "assembly",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "5 templates" in result.output  # four stacks and one shard of functions
    shard = json.loads(next(out.glob("*Shard000*.nested.template.json")).read_text())
    memory = sorted(
        r["Properties"]["MemorySize"]
        for r in shard["Resources"].values()
        if r["Type"] == "AWS::Lambda::Function"
    )
    assert memory[-1] == 3008


def test_synthesize_writes_a_relative_outdir_under_the_callers_folder(tiny, tmp_path, monkeypatch):
    seen = {}

    def runner(command, cwd, env, **kwargs):
        seen["cwd"], seen["outdir"] = Path(cwd), Path(env["CDK_OUTDIR"])
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.chdir(tmp_path)
    written = synthesize(DeployRequest(tiny.package()), Path("cdk.out"), runner=runner)
    assert written == seen["outdir"] == tmp_path / "cdk.out"
    assert seen["outdir"].is_absolute() and seen["cwd"] != tmp_path


def test_bad_plan_is_refused_before_any_cloud_call(tiny, tmp_path):
    (tmp_path / "plan.json").write_text('{"schema_version": 1, "policy": "x", "layers": [{"layer": 0}]}')
    result = CliRunner().invoke(
        cli, ["deploy", str(tiny.package()), "--plan", str(tmp_path / "plan.json"), "--synth-only"]
    )
    assert result.exit_code == 1 and "plan is malformed" in result.output


def test_a_stage_name_with_a_dash_is_refused(tiny):
    result = CliRunner().invoke(cli, ["deploy", str(tiny.package()), "--stage", "dev-b", "--synth-only"])
    assert result.exit_code == 2 and "no '-'" in result.output


def test_aws_endpoint_needs_local(tiny):
    result = CliRunner().invoke(cli, ["deploy", str(tiny.package()), "--aws-endpoint", "http://127.0.0.1:1"])
    assert result.exit_code == 2 and "--aws-endpoint is for --local" in result.output


@pytest.mark.slow
def test_deploy_local_mirrors_to_moto_and_serves_until_sigterm(tiny, moto_url, session, tmp_path):
    """The whole local topology as a user starts it: emulator resources, local functions, REST endpoint."""
    import os
    import signal
    import sys
    import urllib.error
    import urllib.request

    artifacts = tiny.package()
    planned(artifacts).save(tmp_path / "plan.json")
    env = os.environ | {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    command = [
        str(Path(sys.executable).with_name("moeless")),
        "deploy",
        str(artifacts),
        "--plan",
        str(tmp_path / "plan.json"),
        "--stage",
        "loc",
        "--local",
        "--aws-endpoint",
        moto_url,
        "--port",
        "0",  # any free port, which it prints: no race with the other servers for a port found free
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = process.stdout.readline()
        bound = re.match(r"REST endpoint: http://127\.0\.0\.1:(\d+)/v1", line)
        assert bound, line + process.stderr.read()
        port = int(bound.group(1))
        body = json.dumps(
            {"model": artifacts.name, "prompt": "Hello", "max_tokens": 3, "temperature": 0}
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                assert json.loads(response.read())["usage"]["completion_tokens"] == 3
        except urllib.error.HTTPError as exc:
            raise AssertionError(exc.read().decode()) from None
        lam = session.client("lambda", endpoint_url=moto_url)
        mirrored = [
            f for f in lam.list_functions()["Functions"] if f["FunctionName"].startswith("moeless-loc-")
        ]
        assert len(mirrored) == len(planned(artifacts).functions)
    finally:
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "emulator at" in err
