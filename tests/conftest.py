"""Shared fixtures: tiny models and their packages, built once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


class TinyFactory:
    """Builds tiny checkpoints and packages on demand, caching them for the session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._models: dict[tuple, Path] = {}
        self._packages: dict[tuple, Path] = {}

    def model(self, arch: str = "mixtral", **sizes: int) -> Path:
        from moeless.model.tiny import TinySpec, build_tiny_model

        key = (arch, tuple(sorted(sizes.items())))
        if key not in self._models:
            out = self.root / f"model-{arch}-{len(self._models)}"
            self._models[key] = build_tiny_model(out, TinySpec(arch=arch, **sizes))
        return self._models[key]

    def package(self, arch: str = "mixtral", dtype: str = "fp32", **sizes: int) -> Path:
        from moeless.model.packaging import package

        key = (arch, dtype, tuple(sorted(sizes.items())))
        if key not in self._packages:
            out = self.root / f"art-{arch}-{dtype}-{len(self._packages)}"
            package(self.model(arch, **sizes), out, dtype=dtype, progress=False)
            self._packages[key] = out
        return self._packages[key]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyFactory:
    """Session-wide builder of tiny models and packages (treat its folders as read-only)."""
    return TinyFactory(tmp_path_factory.mktemp("tiny"))
