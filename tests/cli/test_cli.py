"""The command line: help on every command, exit codes, one-line errors, lazy imports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cli.main import COMMANDS, cli


@pytest.fixture
def runner():
    return CliRunner()


@pytest.mark.parametrize("args", [[], *([name] for name in COMMANDS), ["model", "tiny"]], ids=str)
def test_help_of_every_command(runner, args):
    result = runner.invoke(cli, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_cli_starts_without_heavy_imports():
    code = (
        "import sys; from click.testing import CliRunner; from cli.main import cli; "
        "CliRunner().invoke(cli, ['--help']); "
        "print([m for m in ('torch', 'transformers', 'onnxruntime') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_package_missing_directory_is_one_line_exit_1(runner, tmp_path):
    result = runner.invoke(cli, ["package", str(tmp_path / "nope"), "-o", str(tmp_path / "art")])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: model directory {tmp_path / 'nope'} does not exist"


def test_model_tiny_rejects_bad_sizes_with_usage_error(runner, tmp_path):
    result = runner.invoke(cli, ["model", "tiny", str(tmp_path / "m"), "--experts", "4", "--top-k", "5"])
    assert result.exit_code == 2
    assert "--top-k 5 exceeds --experts 4" in result.output


def test_tiny_package_verify_round_trip(runner, tmp_path):
    model_dir, artifacts = tmp_path / "m", tmp_path / "art"
    # GIVEN a tiny OLMoE built and packaged through the CLI
    result = runner.invoke(cli, ["model", "tiny", str(model_dir), "--arch", "olmoe", "--experts", "4", "-q"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["package", str(model_dir), "-o", str(artifacts), "-j", "2", "-q"])
    assert result.exit_code == 0, result.output
    assert "experts   8 ONNX files (2 layers x 4)" in result.output
    # WHEN verified clean, THEN exit 0
    result = runner.invoke(cli, ["verify", str(artifacts)])
    assert result.exit_code == 0 and result.output.startswith("ok: ")
    # WHEN one expert is altered, THEN exit 1 naming it
    manifest = json.loads((artifacts / "manifest.json").read_text())
    victim = manifest["experts"][2]["file"]
    (artifacts / victim).write_bytes(b"not an onnx file")
    result = runner.invoke(cli, ["verify", str(artifacts)])
    assert result.exit_code == 1
    assert f"FAIL {victim}: size" in result.output
    assert "1 file(s)" in result.output


def test_verify_without_manifest(runner, tmp_path):
    result = runner.invoke(cli, ["verify", str(tmp_path)])
    assert result.exit_code == 1
    assert "manifest.json is missing" in result.output
