"""The expert Lambda handler, called directly with JSON events and a fake context."""

from __future__ import annotations

import importlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from moeless.contracts.manifest import load_manifest
from moeless.contracts.payload import (
    MAX_PAYLOAD_BYTES,
    decode_matrix,
    encode_bundle,
    encode_request,
    max_tokens_per_request,
    payload_json,
)
from moeless.errors import ArtifactError
from moeless.experts.function import ExpertFunction

REPO = Path(__file__).resolve().parents[2]
EVENTS = Path(__file__).resolve().parents[1] / "events"


@dataclass
class FakeContext:
    aws_request_id: str = "req-1"
    function_name: str = "moeless-expert"
    memory_limit_in_mb: int = 1769


@pytest.fixture
def artifacts(tiny):
    return tiny.package("mixtral")


def _direct(artifacts: Path, layer: int, expert: int, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    entry = load_manifest(artifacts).expert(layer, expert)
    session = ort.InferenceSession(str(artifacts / entry.file), providers=["CPUExecutionProvider"])
    return session.run(["output"], {"hidden": x})[0]


def test_handler_output_equals_onnxruntime_on_the_file(artifacts, monkeypatch):
    # GIVEN the handler module initialised from the environment, hosting two experts
    monkeypatch.setenv("MOELESS_EXPERTS_URI", str(artifacts))
    monkeypatch.setenv("MOELESS_EXPERTS", "0:1,1:5")
    monkeypatch.syspath_prepend(str(REPO / "functions" / "expert"))
    handler = importlib.reload(importlib.import_module("handler"))
    x = np.random.default_rng(0).standard_normal((7, 64), dtype=np.float32)
    # WHEN it is invoked twice
    first = json.loads(handler.handler(encode_request(1, 5, x), FakeContext()))
    second = json.loads(handler.handler(encode_request(1, 5, x), FakeContext("req-2")))
    # THEN the output is onnxruntime's on the same file, and only the first call reports init
    np.testing.assert_array_equal(decode_matrix(first), _direct(artifacts, 1, 5, x))
    assert first["init_ms"] > 0 and second["init_ms"] == 0
    assert first["compute_ms"] >= 0 and first["shape"] == [7, 64]
    assert sorted(handler.FUNCTION.sessions) == [(0, 1), (1, 5)]


def test_float16_wire_format(artifacts):
    function = ExpertFunction(str(artifacts), [(0, 0)], threads=1, log_stream=io.StringIO())
    x = np.random.default_rng(1).standard_normal((3, 64), dtype=np.float32)
    reply = function.invoke(encode_request(0, 0, x, "float16"))
    assert reply["dtype"] == "float16"
    np.testing.assert_allclose(decode_matrix(reply), _direct(artifacts, 0, 0, x), rtol=1e-2, atol=1e-2)


def test_provisioned_instance_reports_no_init(artifacts, monkeypatch):
    monkeypatch.setenv("MOELESS_EXPERTS_URI", str(artifacts))
    monkeypatch.setenv("AWS_LAMBDA_INITIALIZATION_TYPE", "provisioned-concurrency")
    function = ExpertFunction.from_env(os.environ)
    reply = function.invoke(encode_request(0, 0, np.zeros((1, 64), np.float32)))
    assert reply["init_ms"] == 0
    assert function.init_ms > 0


def test_a_load_longer_than_the_init_wait_goes_on_into_the_first_invoke(artifacts, monkeypatch):
    # given experts that take 0.5 s to read, and an init that waits 0.05 s for them (Lambda's
    # on-demand init is limited to 10 s; the function waits 9)
    import moeless.experts.function as module

    def slow_read(root, entry):
        time.sleep(0.5)
        return read(root, entry)

    read = module.read_verified
    monkeypatch.setattr(module, "read_verified", slow_read)
    started = time.perf_counter()
    function = ExpertFunction(str(artifacts), [(0, 0)], threads=1, log_stream=io.StringIO(), init_wait_s=0.05)
    # then init returns before the experts are loaded
    assert time.perf_counter() - started < 0.4 and not function.sessions
    # and the first invoke waits for them, reporting the whole load as its cold start
    reply = function.invoke(encode_request(0, 0, np.ones((2, 64), np.float32)))
    assert "error" not in reply and reply["init_ms"] >= 500


def test_a_failed_load_after_init_fails_the_invoke_that_waits_for_it(artifacts, monkeypatch):
    import moeless.experts.function as module

    def broken_read(root, entry):
        time.sleep(0.2)
        raise ArtifactError(f"{entry.file} does not match its manifest checksum: refusing to load")

    monkeypatch.setattr(module, "read_verified", broken_read)
    function = ExpertFunction(str(artifacts), [(0, 0)], threads=1, log_stream=io.StringIO(), init_wait_s=0.01)
    with pytest.raises(ArtifactError, match="checksum"):
        function.invoke(encode_request(0, 0, np.ones((1, 64), np.float32)))


def test_an_on_demand_environment_waits_9_s_a_provisioned_one_until_loaded(artifacts, monkeypatch):
    import moeless.experts.function as module

    waits = []
    monkeypatch.setattr(module.threading.Thread, "join", lambda self, timeout=None: waits.append(timeout))
    monkeypatch.setenv("MOELESS_EXPERTS_URI", str(artifacts))
    for kind in ("on-demand", "provisioned-concurrency"):
        monkeypatch.setenv("AWS_LAMBDA_INITIALIZATION_TYPE", kind)
        ExpertFunction.from_env(os.environ)._ready()
    assert waits == [module.ON_DEMAND_INIT_WAIT_S, None]


@pytest.mark.parametrize(
    "case", json.loads((EVENTS / "bad_expert_payloads.json").read_text()), ids=lambda c: c["id"]
)
def test_bad_payloads_get_a_named_error_and_the_instance_keeps_serving(artifacts, case):
    log = io.StringIO()
    function = ExpertFunction(str(artifacts), [(0, 0)], threads=1, log_stream=log)
    reply = function.invoke(case["event"], "bad-1")
    assert reply["error"]["type"] == case["type"], reply
    assert reply["error"]["message"]
    ok = function.invoke(encode_request(0, 0, np.ones((2, 64), np.float32)), "good-1")
    assert "error" not in ok and ok["init_ms"] > 0  # the failed call did not consume the cold start
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    assert (
        lines[0]["level"] == "ERROR"
        and lines[0]["request_id"] == "bad-1"
        and lines[0]["type"] == case["type"]
    )
    assert lines[1]["cold_start"] is True and lines[1]["request_id"] == "good-1"


def test_a_bundle_runs_each_expert_on_its_own_rows_in_one_invoke(artifacts):
    # GIVEN a function hosting three experts of layer 1 and rows for two of them, out of id order
    function = ExpertFunction(str(artifacts), [(1, 2), (1, 5), (1, 7)], threads=1, log_stream=io.StringIO())
    x = np.random.default_rng(1).standard_normal((5, 64), dtype=np.float32)
    # WHEN one request carries expert 5's three rows, then expert 2's two
    reply = function.invoke(encode_bundle(1, [(5, x[:3]), (2, x[3:])]))
    # THEN the reply holds each expert's output on its own rows, in the request's order
    output = decode_matrix(reply)
    assert output.shape == (5, 64)
    np.testing.assert_allclose(output[:3], _direct(artifacts, 1, 5, x[:3]), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(output[3:], _direct(artifacts, 1, 2, x[3:]), rtol=1e-6, atol=1e-6)
    # and a bundle of one is the plain one-expert request
    assert encode_bundle(1, [(7, x)]) == encode_request(1, 7, x)


def test_over_size_payload_is_refused():
    from moeless.contracts.payload import PayloadError, decode_request

    event = {
        "layer": 0,
        "expert": 0,
        "dtype": "float32",
        "shape": [1, 1],
        "data": "A" * (MAX_PAYLOAD_BYTES + 4),
    }
    with pytest.raises(PayloadError, match="over Lambda's .* byte limit"):
        decode_request(event)
    rows = max_tokens_per_request(4096)
    request = encode_request(0, 0, np.zeros((rows, 4096), np.float32))
    assert len(json.dumps(request)) <= MAX_PAYLOAD_BYTES


def test_tampered_expert_is_refused_at_init(artifacts, tmp_path):
    copy = tmp_path / "art"
    shutil.copytree(artifacts, copy)
    entry = load_manifest(copy).expert(1, 2)
    data = bytearray((copy / entry.file).read_bytes())
    data[-5] ^= 0xFF
    (copy / entry.file).write_bytes(bytes(data))
    ExpertFunction(str(copy), [(1, 1)], threads=1)  # other experts still load
    with pytest.raises(ArtifactError, match="does not match its manifest checksum"):
        ExpertFunction(str(copy), [(1, 2)], threads=1)


def test_experts_fetched_from_s3_with_checksums(artifacts, tmp_path, monkeypatch):
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with moto.mock_aws():
        # GIVEN the package uploaded under a prefix
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="moeless-artifacts")
        for path in artifacts.rglob("*"):
            if path.is_file():
                s3.upload_file(str(path), "moeless-artifacts", f"tiny/{path.relative_to(artifacts)}")
        # WHEN a function hosting one expert starts from the s3:// URI
        function = ExpertFunction(
            "s3://moeless-artifacts/tiny", [(1, 3)], threads=1, cache_dir=tmp_path / "c"
        )
        x = np.ones((2, 64), np.float32)
        np.testing.assert_array_equal(
            decode_matrix(function.invoke(encode_request(1, 3, x))), _direct(artifacts, 1, 3, x)
        )
        # THEN only that expert was downloaded, and a tampered object is refused
        assert [p.name for p in (tmp_path / "c" / "experts").iterdir()] == ["L001_E003.onnx"]
        s3.put_object(Bucket="moeless-artifacts", Key="tiny/experts/L001_E004.onnx", Body=b"evil")
        with pytest.raises(ArtifactError, match="checksum"):
            ExpertFunction("s3://moeless-artifacts/tiny", [(1, 4)], threads=1, cache_dir=tmp_path / "c")


def test_function_code_imports_no_torch(artifacts):
    code = (
        "import sys; sys.path.insert(0, 'functions/expert'); import handler; "
        "print(sorted(m for m in ('torch', 'transformers', 'click', 'tqdm') if m in sys.modules))"
    )
    env = {"MOELESS_EXPERTS_URI": str(artifacts), "MOELESS_EXPERTS": "0:0", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_dockerfile_copies_only_what_exists():
    dockerfile = (REPO / "functions" / "expert" / "Dockerfile").read_text()
    sources = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    assert sources, "the Dockerfile copies nothing?"
    for src in sources:
        assert (REPO / src).exists(), f"Dockerfile copies {src}, which does not exist"
    requirements = (REPO / "functions" / "expert" / "requirements.txt").read_text()
    assert "torch" not in requirements.replace("# The expert image needs no torch", "")


@pytest.mark.parametrize(
    "payload",
    [
        encode_request(3, 1, np.arange(6, dtype=np.float32).reshape(2, 3)),
        {"error": {"type": "InvalidShape", "message": 'quote " and \\ backslash'}},
        {"data": "QUJD"},
    ],
)
def test_payload_json_is_the_json_of_the_payload(payload):
    assert json.loads(payload_json(payload)) == payload
