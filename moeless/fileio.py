"""Atomic writes and checksums.

Every artifact is written to a temporary name in the same folder and renamed into place,
so an interrupted run never leaves a file that looks complete. ``ENOSPC`` becomes a
:class:`PackagingError` that names the file and the free space left.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from moeless.errors import PackagingError

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (artifacts can be many GB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the body succeeds.

    The temporary file is removed on any failure, and a full disk is reported as a
    :class:`PackagingError` naming ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno == errno.ENOSPC:
            free_mb = shutil.disk_usage(path.parent).free / 1e6
            raise PackagingError(f"disk full while writing {path} ({free_mb:.0f} MB free)") from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    write_bytes_atomic(path, (json.dumps(obj, indent=2) + "\n").encode())


def write_with_atomic(path: Path, writer: Callable[[Path], None]) -> None:
    """Call ``writer(tmp_path)`` and move its output onto ``path`` atomically."""
    with atomic_path(path) as tmp:
        writer(tmp)
