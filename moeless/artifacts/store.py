"""A package in S3: upload it once (skipping what is already there), download what a process needs.

Layout: ``s3://BUCKET/PREFIX/<file as named in the manifest>``, with ``manifest.json`` (and the
deploy's ``plan.json``) beside. Each object carries its sha256 as metadata, so a re-upload skips
unchanged files; every download is checked against the manifest, so a tampered or truncated
object is refused rather than loaded. The manifest is uploaded last: a reader never sees a
manifest whose files are not all there yet.

Callers pass a boto3 S3 client (moto's in tests, LocalStack's or AWS's otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moeless.artifacts.verify import check_file, verify_artifacts
from moeless.contracts.manifest import MANIFEST_NAME, ExpertEntry, FileEntry, Manifest, load_manifest
from moeless.errors import ArtifactError
from moeless.fileio import atomic_path, sha256_file

SHA256_METADATA = "sha256"


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ``("bucket", "some/prefix")``."""
    if not uri.startswith("s3://"):
        raise ArtifactError(f"{uri!r} is not an s3:// URI")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise ArtifactError(f"{uri!r} names no bucket")
    return bucket, prefix.strip("/")


def _key(prefix: str, rel: str) -> str:
    return f"{prefix}/{rel}" if prefix else rel


@dataclass
class UploadReport:
    uploaded: list[str]
    skipped: list[str]
    bytes_uploaded: int

    def __str__(self) -> str:
        return (
            f"{len(self.uploaded)} file(s) uploaded ({self.bytes_uploaded / 2**20:.1f} MiB), "
            f"{len(self.skipped)} unchanged"
        )


def _remote_sha256(s3: Any, bucket: str, key: str) -> str | None:
    from botocore.exceptions import ClientError

    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    return head.get("Metadata", {}).get(SHA256_METADATA)


def upload_artifacts(
    s3: Any,
    artifacts_dir: Path,
    uri: str,
    extra_files: dict[str, Path] | None = None,
    progress: bool = False,
) -> UploadReport:
    """Upload a verified package (and ``extra_files``, e.g. ``{"plan.json": path}``) under ``uri``.

    Raises:
        ArtifactError: a local file differs from its manifest entry (nothing is uploaded then).
    """
    from tqdm import tqdm

    artifacts_dir = Path(artifacts_dir)
    if problems := verify_artifacts(artifacts_dir):
        listed = "; ".join(str(p) for p in problems[:3])
        raise ArtifactError(f"{artifacts_dir} fails its manifest, refusing to upload it: {listed}")
    bucket, prefix = parse_s3_uri(uri)
    manifest = load_manifest(artifacts_dir)
    files = [(e.file, artifacts_dir / e.file, e.sha256) for e in manifest.all_files()]
    files += [(rel, Path(path), sha256_file(Path(path))) for rel, path in (extra_files or {}).items()]
    files.append((MANIFEST_NAME, artifacts_dir / MANIFEST_NAME, sha256_file(artifacts_dir / MANIFEST_NAME)))
    report = UploadReport([], [], 0)
    for rel, path, digest in tqdm(files, desc="upload", unit="file", disable=not progress):
        key = _key(prefix, rel)
        if _remote_sha256(s3, bucket, key) == digest:
            report.skipped.append(rel)
            continue
        s3.upload_file(str(path), bucket, key, ExtraArgs={"Metadata": {SHA256_METADATA: digest}})
        report.uploaded.append(rel)
        report.bytes_uploaded += path.stat().st_size
    return report


def download_artifacts(
    s3: Any,
    uri: str,
    dest: Path,
    experts: list[tuple[int, int]] | None = None,
    backbone: bool = True,
) -> Manifest:
    """Fetch the manifest and the files a process needs into ``dest``; files already there and
    matching their checksum are kept (a restarted task resumes).

    Args:
        experts: the (layer, expert) files to fetch; ``None``: all of them; ``[]``: none.
        backbone: whether to fetch the backbone's files.

    Raises:
        ArtifactError: an expert is not in the manifest, or a downloaded file fails its checksum.
    """
    bucket, prefix = parse_s3_uri(uri)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest / MANIFEST_NAME) as tmp:
        s3.download_file(bucket, _key(prefix, MANIFEST_NAME), str(tmp))
    manifest = load_manifest(dest)
    wanted: list[FileEntry] = manifest.backbone_files() if backbone else []
    if experts is None:
        chosen = manifest.experts
    else:
        try:
            chosen = [manifest.expert(layer, expert) for layer, expert in experts]
        except KeyError as exc:
            raise ArtifactError(f"expert {exc.args[0]} is not in the manifest") from None
    wanted += [FileEntry(e.file, e.bytes, e.sha256) for e in chosen]
    for entry in wanted:
        download_entry(s3, uri, dest, entry)
    return manifest


def download_entry(s3: Any, uri: str, dest: Path, entry: FileEntry | ExpertEntry) -> bool:
    """Fetch one file of the package at ``uri`` into ``dest`` unless it is there and matches its
    checksum (a restarted process resumes); returns whether it fetched.

    Raises:
        ArtifactError: the object does not match its manifest checksum (it is not kept).
    """
    bucket, prefix = parse_s3_uri(uri)
    target = Path(dest) / entry.file
    if check_file(Path(dest), FileEntry(entry.file, entry.bytes, entry.sha256)) is None:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as tmp:
        s3.download_file(bucket, _key(prefix, entry.file), str(tmp))
        if sha256_file(tmp) != entry.sha256:
            raise ArtifactError(
                f"s3://{bucket}/{_key(prefix, entry.file)} does not match its manifest checksum: refusing it"
            )
    return True


def download_file(s3: Any, uri: str, dest: Path) -> Path:
    """Fetch one object (``s3://bucket/key``) to ``dest`` atomically."""
    bucket, key = parse_s3_uri(uri)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest) as tmp:
        s3.download_file(bucket, key, str(tmp))
    return dest
