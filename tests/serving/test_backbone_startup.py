"""A backbone task starting from a package in S3 (moto, in process): it fetches the backbone and
its in-process experts only, resumes what a predecessor left, and fetches fallback experts on
demand into a cache bounded by bytes, least recently used out first."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

moto = pytest.importorskip("moto", reason="needs moto (the dev extra)")
import boto3  # noqa: E402

from backbone_service.startup import config_from_env  # noqa: E402
from moeless.artifacts.store import upload_artifacts  # noqa: E402
from moeless.contracts import environment as E  # noqa: E402
from moeless.contracts.manifest import load_manifest  # noqa: E402
from moeless.contracts.plan import Placement, Plan, one_function_per_expert  # noqa: E402
from moeless.experts.runtime import OnnxExpertPool  # noqa: E402

BUCKET = "moeless-test-startup"


@pytest.fixture
def s3(monkeypatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with moto.mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        yield client


def with_two_on_the_backbone(artifacts: Path) -> Plan:
    plan = one_function_per_expert(load_manifest(artifacts))
    kept = {(p.layer, p.expert) for p in plan.experts[:2]}
    plan.experts = [
        replace(p, placement=Placement.HOST) if (p.layer, p.expert) in kept else p for p in plan.experts
    ]
    plan.functions = [f for f in plan.functions if not set(f.experts) <= kept]
    return plan


def test_a_task_fetches_its_backbone_and_in_process_experts_only_and_resumes(tiny, s3, tmp_path):
    artifacts = tiny.package()
    plan = with_two_on_the_backbone(artifacts)
    plan.save(tmp_path / "plan.json")
    upload_artifacts(s3, artifacts, f"s3://{BUCKET}/pkg")
    s3.upload_file(str(tmp_path / "plan.json"), BUCKET, "plan.json")
    env = {
        E.ARTIFACTS: f"s3://{BUCKET}/pkg",
        E.PLAN: f"s3://{BUCKET}/plan.json",
        E.ARTIFACTS_CACHE: str(tmp_path / "cache"),
        E.FALLBACK_CACHE_BYTES: "12345",
    }
    config = config_from_env(env)
    manifest = load_manifest(artifacts)
    on_disk = {p.relative_to(config.artifacts).as_posix() for p in config.artifacts.rglob("*") if p.is_file()}
    expert_files = {e.file for e in manifest.experts} & on_disk
    assert expert_files == {manifest.expert(*pair).file for pair in plan.in_process()}
    assert {f.file for f in manifest.backbone_files()} <= on_disk
    assert (config.experts_source, config.fallback_cache_bytes) == (f"s3://{BUCKET}/pkg", 12345)
    # a task restarted on the same instance downloads nothing again
    stamps = {p: p.stat().st_mtime_ns for p in config.artifacts.rglob("*.onnx")}
    config_from_env(env)
    assert {p: p.stat().st_mtime_ns for p in config.artifacts.rglob("*.onnx")} == stamps


def test_fallback_experts_come_on_demand_within_a_byte_budget(tiny, s3, tmp_path):
    artifacts = tiny.package()
    manifest = load_manifest(artifacts)
    upload_artifacts(s3, artifacts, f"s3://{BUCKET}/pkg")
    pinned = frozenset({(manifest.experts[0].layer, manifest.experts[0].expert)})
    cache = tmp_path / "cache"
    cache.mkdir()
    budget = 2 * max(e.bytes for e in manifest.experts)  # room for two fallback experts
    pool = OnnxExpertPool(cache, manifest, source=f"s3://{BUCKET}/pkg", budget_bytes=budget, pinned=pinned)
    reference = OnnxExpertPool(artifacts, manifest)
    rows = np.random.default_rng(0).standard_normal((3, manifest.hidden_size)).astype(np.float32)
    for entry in manifest.experts:
        got = pool.run(entry.layer, {entry.expert: rows})[entry.expert]
        np.testing.assert_array_equal(got, reference.run(entry.layer, {entry.expert: rows})[entry.expert])
        assert pool.cached_bytes() <= budget
    assert pool.fetched == len(manifest.experts)
    assert pool.evicted == len(manifest.experts) - 1 - 2
    # the pinned expert stays open and on disk; only the last two fallback experts stay beside it
    files = {p.name for p in (cache / "experts").glob("*.onnx")}
    assert Path(manifest.experts[0].file).name in files and len(files) == 3


def test_a_tampered_object_is_refused_not_run(tiny, s3, tmp_path):
    artifacts = tiny.package()
    manifest = load_manifest(artifacts)
    upload_artifacts(s3, artifacts, f"s3://{BUCKET}/pkg")
    victim = manifest.experts[1]
    s3.put_object(Bucket=BUCKET, Key=f"pkg/{victim.file}", Body=b"not an expert")
    (tmp_path / "cache").mkdir()
    pool = OnnxExpertPool(tmp_path / "cache", manifest, source=f"s3://{BUCKET}/pkg", budget_bytes=10**9)
    from moeless.errors import ArtifactError

    with pytest.raises(ArtifactError, match="does not match its manifest checksum"):
        pool.session(victim.layer, victim.expert)
