"""``manifest.json``: what ``moeless package`` produced, with a checksum for every file.

Schema (version 1)::

    {"schema_version": 1, "moeless_version": "...", "architecture": "mixtral", "display_name": "Mixtral",
     "num_layers": L, "moe_layers": [..], "num_experts": E, "top_k": k,
     "routing": {"rule": "...", "params": {...}}, "hidden_size": H, "intermediate_size": I,
     "expert_kind": "swiglu" | "gpt_oss", "activation": {...}, "dtype": "fp32" | "fp16" | "int8",
     "backbone": {"dtype": "bfloat16", "num_params": N, "files": [{"file", "bytes", "sha256"}]},
     "experts": [{"layer", "expert", "file", "bytes", "sha256", "max_abs_error", "rel_rms_error"}],
     "stats": {...}}

Paths are relative to the artifacts folder.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from moeless.errors import ArtifactError

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
DIGEST_CHARS = 16


@dataclass
class FileEntry:
    file: str
    bytes: int
    sha256: str


@dataclass
class ExpertEntry:
    layer: int
    expert: int
    file: str
    bytes: int
    sha256: str
    max_abs_error: float
    rel_rms_error: float


@dataclass
class Manifest:
    architecture: str
    display_name: str
    num_layers: int
    moe_layers: list[int]
    num_experts: int
    top_k: int
    routing: dict[str, Any]
    hidden_size: int
    intermediate_size: int
    expert_kind: str
    activation: dict[str, Any]
    dtype: str
    backbone: dict[str, Any]
    experts: list[ExpertEntry]
    stats: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    moeless_version: str = ""

    def expert(self, layer: int, expert: int) -> ExpertEntry:
        """The entry of one (layer, expert); ``KeyError`` if absent."""
        return self._by_pair[(layer, expert)]

    @cached_property
    def _by_pair(self) -> dict[tuple[int, int], ExpertEntry]:
        """The entries by (layer, expert): a DeepSeek-V3 package has 14,848, looked up per function."""
        return {(entry.layer, entry.expert): entry for entry in self.experts}

    def backbone_files(self) -> list[FileEntry]:
        return [FileEntry(**f) for f in self.backbone["files"]]

    def all_files(self) -> list[FileEntry]:
        """Every file the manifest vouches for: backbone files, then experts."""
        experts = [FileEntry(e.file, e.bytes, e.sha256) for e in self.experts]
        return self.backbone_files() + experts

    def digest(self) -> str:
        """The package's identity: the sha256 of this manifest's canonical JSON (it lists every
        file's sha256), shortened.

        A deployment keeps each package under its digest, so a new package never overwrites the
        files an old one's functions are reading, and a function's or task's configuration that
        names the digest changes (and rolls) exactly when the package does.
        """
        return canonical_digest(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        order = ["schema_version", "moeless_version"]
        return {key: data[key] for key in order} | {k: v for k, v in data.items() if k not in order}


def canonical_digest(data: Any) -> str:
    """sha256 of ``data`` as canonical JSON (sorted keys, no spaces), its first hex digits."""
    import hashlib

    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_CHARS]


def manifest_from_dict(data: dict[str, Any]) -> Manifest:
    """Build a :class:`Manifest`, refusing unknown schema versions and malformed content."""
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ArtifactError(
            f"manifest schema_version {version!r} is not supported (expected {SCHEMA_VERSION})"
        )
    try:
        fields = dict(data)
        fields["experts"] = [ExpertEntry(**e) for e in data["experts"]]
        return Manifest(**fields)
    except (TypeError, KeyError) as exc:
        raise ArtifactError(f"manifest is malformed: {exc}") from exc


def load_manifest(artifacts_dir: Path) -> Manifest:
    """Read ``ARTIFACTS/manifest.json``.

    Raises:
        ArtifactError: missing, not JSON, or not a manifest this version understands.
    """
    path = Path(artifacts_dir) / MANIFEST_NAME
    if not path.is_file():
        raise ArtifactError(
            f"{path} is missing: {artifacts_dir} is not a complete package "
            "(run `moeless package` to finish it)"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ArtifactError(f"{path} is not a manifest object")
    return manifest_from_dict(data)
