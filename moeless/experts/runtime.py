"""Running packaged experts: the executor seam, and the in-process onnxruntime executor.

The backbone never calls an expert directly; it hands an :class:`ExpertExecutor` the token
rows of each needed expert of a layer, and gets their outputs back. In-process onnxruntime
(here) is one executor; the serverless dispatcher (Lambda invokes) is another.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from moeless.artifacts.verify import check_file, read_verified
from moeless.contracts.manifest import ExpertEntry, Manifest, load_manifest
from moeless.errors import ArtifactError
from moeless.experts.session import session_options


@runtime_checkable
class ExpertExecutor(Protocol):
    """Runs routed experts of one layer.

    ``run(layer, inputs)``: ``inputs`` maps expert id -> float32 ``[tokens_e, H]``; the result
    maps the same ids to float32 ``[tokens_e, H]`` (expert outputs before routing weights).
    """

    def run(self, layer: int, inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]: ...


class OnnxExpertPool:
    """Experts run in this process by onnxruntime, one session per (layer, expert), opened lazily.

    Each file's sha256 is checked against the manifest before its session is created, so a
    tampered artifact is refused at load, never run.

    For a backbone whose package is in S3, experts it runs only when a function fails need not be
    on disk: with ``source`` (``s3://bucket/prefix``) a missing one is fetched when first needed,
    and with ``budget_bytes`` the experts not ``pinned`` (the plan's in-process ones) are kept
    least recently used first within that many bytes, their sessions and files both dropped when
    they fall out: a burst of fallbacks cannot exhaust the host's memory or disk.
    """

    def __init__(
        self,
        artifacts_dir: Path,
        manifest: Manifest | None = None,
        threads: int = 1,
        source: str | None = None,
        budget_bytes: int | None = None,
        pinned: frozenset[tuple[int, int]] = frozenset(),
        on_gpu: frozenset[tuple[int, int]] = frozenset(),
        device: str = "cpu",
    ) -> None:
        self.artifacts_dir = Path(artifacts_dir)
        self.manifest = manifest or load_manifest(self.artifacts_dir)
        self.threads = threads
        self.source = source
        self.budget_bytes = budget_bytes
        self.pinned = pinned
        self.on_gpu = on_gpu if device == "cuda" else frozenset()
        self._sessions: OrderedDict[tuple[int, int], Any] = OrderedDict()
        self._cached_bytes = 0  # of the open experts not pinned
        self._s3: Any = None
        self._lock = threading.Lock()
        self.fetched = 0  # experts fetched on demand
        self.evicted = 0  # experts dropped to stay within the budget

    def session(self, layer: int, expert: int) -> Any:
        """The onnxruntime session of one expert (checksum-verified on first use)."""
        key = (layer, expert)
        with self._lock:
            if key in self._sessions:
                self._sessions.move_to_end(key)
                return self._sessions[key]
            session = self._sessions[key] = self._open(layer, expert)
            if key not in self.pinned:
                self._cached_bytes += self._entry(layer, expert).bytes
                self._evict(keep=key)
            return session

    def cached_bytes(self) -> int:
        """Bytes of the open experts that count against the budget (not pinned)."""
        return self._cached_bytes

    def _entry(self, layer: int, expert: int) -> ExpertEntry:
        try:
            return self.manifest.expert(layer, expert)
        except KeyError:
            raise ArtifactError(f"layer {layer} expert {expert} is not in the manifest") from None

    def _open(self, layer: int, expert: int) -> Any:
        import onnxruntime as ort

        entry = self._entry(layer, expert)
        if self.source is not None:
            import boto3

            from moeless.artifacts.store import download_entry

            self._s3 = self._s3 or boto3.client("s3")
            self.fetched += download_entry(self._s3, self.source, self.artifacts_dir, entry)
        data = read_verified(self.artifacts_dir, entry)
        return ort.InferenceSession(
            data, session_options(self.threads), providers=self.providers(layer, expert)
        )

    def providers(self, layer: int, expert: int) -> list[str]:
        """Where onnxruntime runs one expert: the plan's gpu-tier experts on the backbone's CUDA
        device when this onnxruntime has it (the backbone image installs onnxruntime-gpu), the
        others on the host's CPUs."""
        import onnxruntime as ort

        if (layer, expert) in self.on_gpu and "CUDAExecutionProvider" in ort.get_available_providers():
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def _evict(self, keep: tuple[int, int]) -> None:
        """Drop the least recently used unpinned experts (not ``keep``) until within the budget."""
        if self.budget_bytes is None:
            return
        for key in [k for k in self._sessions if k not in self.pinned and k != keep]:
            if self._cached_bytes <= self.budget_bytes:
                return
            del self._sessions[key]
            self._cached_bytes -= self._entry(*key).bytes
            if self.source is not None:  # a cache of the package in S3, never the package itself
                (self.artifacts_dir / self._entry(*key).file).unlink(missing_ok=True)
            self.evicted += 1

    def run(self, layer: int, inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        return {
            expert: self.session(layer, expert).run(
                ["output"], {"hidden": np.ascontiguousarray(rows, np.float32)}
            )[0]
            for expert, rows in inputs.items()
        }


def check_backbone_files(artifacts_dir: Path, manifest: Manifest) -> None:
    """Refuse to load a backbone whose files differ from the manifest."""
    for entry in manifest.backbone_files():
        problem = check_file(artifacts_dir, entry)
        if problem and problem.reason == "missing":
            raise ArtifactError(f"backbone file {entry.file} is missing")
        if problem:
            raise ArtifactError(
                f"backbone file {entry.file} does not match its manifest checksum: refusing to load"
            )
