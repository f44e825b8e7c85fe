"""Re-check every artifact against the manifest: present, right size, right sha256."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from moeless.contracts.manifest import ExpertEntry, FileEntry, load_manifest
from moeless.errors import ArtifactError
from moeless.fileio import sha256_file


@dataclass(frozen=True)
class Problem:
    """One file that does not match the manifest."""

    file: str
    reason: str  # "missing" | "size" | "sha256"

    def __str__(self) -> str:
        return f"{self.file}: {self.reason}"


def check_file(artifacts_dir: Path, entry: FileEntry) -> Problem | None:
    """Compare one file with its manifest entry (size first: it is free)."""
    path = Path(artifacts_dir) / entry.file
    if not path.is_file():
        return Problem(entry.file, "missing")
    if path.stat().st_size != entry.bytes:
        return Problem(entry.file, f"size {path.stat().st_size} != {entry.bytes} in manifest")
    if sha256_file(path) != entry.sha256:
        return Problem(entry.file, "sha256 differs from manifest")
    return None


def verify_artifacts(artifacts_dir: Path) -> list[Problem]:
    """Every file of the package that is missing or differs from the manifest (empty: all good).

    Raises:
        ArtifactError: the manifest itself is missing or invalid.
    """
    manifest = load_manifest(artifacts_dir)
    problems = [check_file(artifacts_dir, entry) for entry in manifest.all_files()]
    return [p for p in problems if p is not None]


def read_verified(artifacts_dir: Path, entry: FileEntry | ExpertEntry) -> bytes:
    """Read one artifact, refusing it unless its size and sha256 match the manifest entry.

    Raises:
        ArtifactError: the file is missing or differs from the manifest.
    """
    path = Path(artifacts_dir) / entry.file
    if not path.is_file():
        raise ArtifactError(f"{entry.file} is missing from {artifacts_dir}")
    data = path.read_bytes()
    if len(data) != entry.bytes or hashlib.sha256(data).hexdigest() != entry.sha256:
        raise ArtifactError(f"{entry.file} does not match its manifest checksum: refusing to load it")
    return data
