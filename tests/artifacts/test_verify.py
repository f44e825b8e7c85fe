"""``moeless verify`` and manifest loading."""

from __future__ import annotations

import json
import shutil

import pytest

from moeless.artifacts.verify import verify_artifacts
from moeless.contracts.manifest import MANIFEST_NAME, load_manifest
from moeless.errors import ArtifactError


@pytest.fixture
def artifacts(tiny, tmp_path):
    folder = tmp_path / "art"
    shutil.copytree(tiny.package("mixtral"), folder)
    return folder


def test_clean_package_verifies(artifacts):
    assert verify_artifacts(artifacts) == []


def test_each_kind_of_damage_is_named(artifacts):
    manifest = load_manifest(artifacts)
    flipped, removed, grown = (artifacts / manifest.experts[i].file for i in (0, 1, 2))
    data = bytearray(flipped.read_bytes())
    data[100] ^= 1
    flipped.write_bytes(bytes(data))
    removed.unlink()
    with open(grown, "ab") as handle:
        handle.write(b"x")
    problems = {p.file: p.reason for p in verify_artifacts(artifacts)}
    assert problems == {
        manifest.experts[0].file: "sha256 differs from manifest",
        manifest.experts[1].file: "missing",
        manifest.experts[
            2
        ].file: f"size {manifest.experts[2].bytes + 1} != {manifest.experts[2].bytes} in manifest",
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param("{not json", "not valid JSON", id="not-json"),
        pytest.param("[1, 2]", "not a manifest object", id="not-an-object"),
        pytest.param('{"schema_version": 99}', "schema_version 99 is not supported", id="future-schema"),
        pytest.param('{"schema_version": 1, "experts": []}', "manifest is malformed", id="missing-fields"),
    ],
)
def test_corrupt_manifest_is_refused(artifacts, content, message):
    (artifacts / MANIFEST_NAME).write_text(content)
    with pytest.raises(ArtifactError, match=message):
        verify_artifacts(artifacts)


def test_manifest_round_trips(artifacts):
    manifest = load_manifest(artifacts)
    data = json.loads((artifacts / MANIFEST_NAME).read_text())
    assert manifest.to_dict() == data
    assert list(data)[:2] == ["schema_version", "moeless_version"]
