"""The expert image's contents, run as Lambda would run them, without Docker.

The Dockerfile cannot be built here (no Docker engine). Instead: stage the files its COPY lines
name into a task root, install only ``functions/expert/requirements.txt`` plus ``awslambdaric``
into a clean virtual environment, and serve the handler from there through the local host.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import venv
from pathlib import Path

import numpy as np
import pytest

from moeless.contracts.manifest import load_manifest
from moeless.contracts.payload import decode_matrix, encode_request
from moeless.lambda_host import FunctionConfig, LambdaHost
from tests.lambda_helpers import call, lambda_client

REPO = Path(__file__).resolve().parents[2]
FUNCTION = REPO / "functions" / "expert"


def _pin(package: str) -> str:
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.lower().startswith(f"{package}=="):
            return line
    raise AssertionError(f"{package} is not pinned in constraints.txt")


def stage_image(root: Path) -> Path:
    """Copy what the Dockerfile's COPY lines copy; returns the staged task root."""
    task_root = root / "var" / "task"
    for source, target in re.findall(r"^COPY\s+(\S+)\s+(\S+)", (FUNCTION / "Dockerfile").read_text(), re.M):
        destination = root / target.replace("${LAMBDA_TASK_ROOT}", "/var/task").lstrip("/")
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, destination, dirs_exist_ok=True)
        else:
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / source, destination)
    return task_root


@pytest.mark.slow
def test_handler_runs_under_awslambdaric_in_a_clean_venv_with_only_its_requirements(tiny, tmp_path):
    import onnxruntime as ort

    artifacts = tiny.package("mixtral")
    task_root = stage_image(tmp_path / "image")
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = str(environment / "bin" / "python")
    install = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "-r",
            str(task_root / "requirements.txt"),
            _pin("awslambdaric"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True)
    assert probe.returncode != 0, "torch must not be installed in the function's environment"

    config = FunctionConfig(
        "expert-image",
        task_root=task_root,
        environment={"MOELESS_EXPERTS_URI": str(artifacts), "MOELESS_EXPERTS": "1:2"},
        python=python,
    )
    x = np.random.default_rng(3).standard_normal((4, 64), dtype=np.float32)
    with LambdaHost([config]) as host:
        response, body = call(lambda_client(host.endpoint_url), "expert-image", encode_request(1, 2, x))
    assert "FunctionError" not in response, body
    entry = load_manifest(artifacts).expert(1, 2)
    expected = ort.InferenceSession(str(artifacts / entry.file)).run(["output"], {"hidden": x})[0]
    np.testing.assert_array_equal(decode_matrix(body), expected)
    assert body["init_ms"] > 0
