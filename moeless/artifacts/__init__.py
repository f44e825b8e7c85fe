"""A package on disk or in S3, read with its checksums checked (verify, fetch, resume)."""

from moeless.artifacts.store import download_artifacts, download_file, upload_artifacts
from moeless.artifacts.verify import read_verified, verify_artifacts

__all__ = ["download_artifacts", "download_file", "read_verified", "upload_artifacts", "verify_artifacts"]
