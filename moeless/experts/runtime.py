"""Running packaged experts: the executor seam, and the in-process onnxruntime executor.

The backbone never calls an expert directly; it hands an :class:`ExpertExecutor` the token
rows of each needed expert of a layer, and gets their outputs back. In-process onnxruntime
(here) is one executor; the serverless dispatcher (Lambda invokes) is another.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from moeless.artifacts.verify import check_file, read_verified
from moeless.contracts.manifest import Manifest, load_manifest
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
    """

    def __init__(self, artifacts_dir: Path, manifest: Manifest | None = None, threads: int = 1) -> None:
        self.artifacts_dir = Path(artifacts_dir)
        self.manifest = manifest or load_manifest(self.artifacts_dir)
        self.threads = threads
        self._sessions: dict[tuple[int, int], Any] = {}
        self._lock = threading.Lock()

    def session(self, layer: int, expert: int) -> Any:
        """The onnxruntime session of one expert (checksum-verified on first use)."""
        key = (layer, expert)
        with self._lock:
            if key not in self._sessions:
                self._sessions[key] = self._open(layer, expert)
            return self._sessions[key]

    def _open(self, layer: int, expert: int) -> Any:
        import onnxruntime as ort

        try:
            entry = self.manifest.expert(layer, expert)
        except KeyError:
            raise ArtifactError(f"layer {layer} expert {expert} is not in the manifest") from None
        data = read_verified(self.artifacts_dir, entry)
        return ort.InferenceSession(data, session_options(self.threads), providers=["CPUExecutionProvider"])

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
