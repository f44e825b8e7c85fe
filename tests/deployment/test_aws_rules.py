"""The synthesised templates for the tiny, a Mixtral-8x7B and a DeepSeek-V3 plan against AWS's own
rules: the service models in botocore (ranges CloudFormation's schema lacks), cfn-lint (no error),
cdk-nag (a synth with unacknowledged findings fails), and images built for the hosts' platform."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
pytest.importorskip("aws_cdk", reason="the CDK app needs the [deploy] extra (aws-cdk-lib)")
cfnlint_api = pytest.importorskip("cfnlint.api", reason="cfn-lint is in the dev extra")

from moeless.contracts.manifest import load_manifest  # noqa: E402
from moeless.planning.planner import PlanRequest, make_plan  # noqa: E402
from tests.conftest import REPO_ROOT  # noqa: E402
from tests.deployment.aws_models import check_template, covered_types  # noqa: E402
from tests.deployment.test_cdk_app import (  # noqa: E402
    CFN_RESOURCES_PER_STACK,
    CFN_TEMPLATE_BYTES,
    synth,
    synthetic_manifest,
    tiny_plan,
    zipf_loads,
)

sys.path.insert(0, str(REPO_ROOT / "cdk"))
from moeless_cdk.config import DeployConfig  # noqa: E402
from moeless_cdk.experts import FUNCTIONS_PER_SHARD  # noqa: E402


def test_the_ecs_start_period_that_cfn_lint_misses_is_found():
    task = {
        "Type": "AWS::ECS::TaskDefinition",
        "Properties": {
            "ContainerDefinitions": [
                {"Name": "b", "Image": "i", "HealthCheck": {"Command": ["CMD", "true"], "StartPeriod": 600}}
            ]
        },
    }
    [finding] = check_template({"Resources": {"Task": task}})
    assert finding.path == ".ContainerDefinitions[0].HealthCheck.StartPeriod"
    assert "outside 0-300" in finding.problem
    task["Properties"]["ContainerDefinitions"][0]["HealthCheck"]["StartPeriod"] = 300
    assert check_template({"Resources": {"Task": task}}) == []


def test_metadata_ranges_and_enums_are_found():
    function = {
        "Type": "AWS::Lambda::Function",
        "Properties": {"MemorySize": 40_000, "Architectures": ["x86"]},
    }
    problems = sorted(f.path for f in check_template({"Resources": {"F": function}}))
    assert problems == [".Architectures[0]", ".MemorySize"]


def test_a_streamed_integration_may_wait_15_minutes_a_buffered_one_29_seconds():
    def method(mode: str, timeout: int) -> dict:
        integration = {"Type": "HTTP_PROXY", "ResponseTransferMode": mode, "TimeoutInMillis": timeout}
        return {
            "Resources": {
                "M": {"Type": "AWS::ApiGateway::Method", "Properties": {"Integration": integration}}
            }
        }

    assert check_template(method("STREAM", 900_000)) == []
    assert [f.path for f in check_template(method("STREAM", 900_001))] == [".TimeoutInMillis"]
    assert [f.path for f in check_template(method("BUFFERED", 900_000))] == [".TimeoutInMillis"]


def _tiny(tiny) -> DeployConfig:
    artifacts = tiny.package()
    return DeployConfig(artifacts=artifacts, manifest=load_manifest(artifacts), plan=tiny_plan(artifacts))


def _large(
    name: str, layers: int, experts: int, shape: tuple[int, int], workers: int | None, tmp: Path
) -> DeployConfig:
    manifest = synthetic_manifest(layers, experts, *shape)
    plan = make_plan(zipf_loads(layers, experts), PlanRequest(policy="moeless", workers=workers), manifest)
    return DeployConfig(artifacts=tmp, manifest=manifest, plan=plan, stage=name)


PLANS = [
    pytest.param("tiny", id="tiny"),
    pytest.param("mixtral", id="mixtral-8x7b", marks=pytest.mark.slow),
    pytest.param("deepseek", id="deepseek-v3", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module")
def assemblies(tiny, tmp_path_factory) -> Callable[[str], tuple[DeployConfig, Path]]:
    """Each plan synthesised once, lazily (the large ones only where slow tests run)."""
    made: dict[str, tuple[DeployConfig, Path]] = {}

    def assembly(name: str) -> tuple[DeployConfig, Path]:
        if name not in made:
            tmp = tmp_path_factory.mktemp(name)
            config = {
                "tiny": lambda: _tiny(tiny),
                # one function per replica; and DeepSeek's experts packed by expert-parallel worker
                "mixtral": lambda: _large("mixtral", 32, 8, (4096, 14336), None, tmp),
                "deepseek": lambda: _large("deepseek", 58, 256, (7168, 2048), 8, tmp),
            }[name]()
            synth(config, tmp / "out")  # with cdk-nag: an unacknowledged finding fails the synth
            made[name] = (config, tmp / "out")
        return made[name]

    return assembly


@pytest.mark.parametrize("name", PLANS)
def test_plans_fit_cloudformation_limits(assemblies, name):
    config, outdir = assemblies(name)
    templates = list(outdir.glob("*.template.json"))
    functions = 0
    for path in templates:
        assert path.stat().st_size < CFN_TEMPLATE_BYTES, path.name
        template = json.loads(path.read_text())
        assert len(template["Resources"]) <= CFN_RESOURCES_PER_STACK, path.name
        if "Experts" in path.name:
            functions += sum(r["Type"] == "AWS::Lambda::Function" for r in template["Resources"].values())
    assert functions == len(config.plan.functions)
    assert len(templates) == 4 + -(-len(config.plan.functions) // FUNCTIONS_PER_SHARD)


@pytest.mark.parametrize("name", PLANS)
def test_every_resource_obeys_the_service_models(assemblies, name):
    _, outdir = assemblies(name)
    findings, types = [], set()
    for path in sorted(outdir.glob("*.template.json")):
        template = json.loads(path.read_text())
        findings += [f"{path.name}: {f}" for f in check_template(template)]
        types |= covered_types(template)
    assert findings == []
    assert {"AWS::ECS::TaskDefinition", "AWS::Lambda::Function", "AWS::ApiGateway::Method"} <= types


@pytest.mark.parametrize("name", PLANS)
def test_cfn_lint_finds_no_error(assemblies, name):
    _, outdir = assemblies(name)
    errors = [
        f"{path.name}: {match}"
        for path in sorted(outdir.glob("*.template.json"))
        for match in cfnlint_api.lint_file(path)
        if match.rule.id.startswith("E")
    ]
    assert errors == []


def test_images_are_built_for_the_hosts_platform(assemblies):
    images = {
        key: asset["source"]
        for path in assemblies("tiny")[1].glob("*.assets.json")
        for key, asset in json.loads(path.read_text()).get("dockerImages", {}).items()
    }
    assert images and all(source.get("platform") == "linux/amd64" for source in images.values())
