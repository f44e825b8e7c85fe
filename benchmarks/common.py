"""What the benchmarks share: the trained model they measure, on the best text available."""

from __future__ import annotations

from pathlib import Path

from moeless.training import TrainSpec, trained_model

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"


def bench_model() -> Path:
    """The default `moeless model train` model, trained on ../shared/data/text (arXiv, C4, GitHub,
    Wikipedia) when that folder exists, else on Python's own documentation. Cached."""
    texts = sorted((SHARED / "text").glob("*.txt")) if (SHARED / "text").is_dir() else None
    return trained_model(REPO / ".moeless" / "models", TrainSpec(), texts)
