"""What the benchmarks share: the trained model they measure, on the best text available."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from moeless.model.training import TrainSpec, trained_model

if TYPE_CHECKING:
    from moeless.prediction.trace import Trace

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
GPTOSS_ROUTING = SHARED / "routing" / "gptoss20b_decode.npz"


def load_prompts(count: int) -> list[str]:
    """``count`` prompts for the serving benchmarks: ../shared/data/prompts/dev.jsonl (cut to 300
    characters, without the gsm8k test set) when it exists, else the demo's, cycled."""
    from moeless.demo.prompts import DEMO_PROMPTS

    path = SHARED / "prompts" / "dev.jsonl"
    if path.is_file():
        rows = [json.loads(line) for line in path.read_text().splitlines()[: count * 4]]
        prompts = [r["prompt"][:300] for r in rows if r.get("source") != "gsm8k_test"]
    else:
        prompts = list(DEMO_PROMPTS)
    return [prompts[i % len(prompts)] for i in range(count)]


def load_gptoss_routing() -> Trace:
    """gpt-oss-20b's per-token routing (../shared/data/routing/gptoss20b_decode.*); exits without it."""
    from moeless.prediction.routing_file import load_routing

    if not GPTOSS_ROUTING.is_file():
        sys.exit(f"needs {GPTOSS_ROUTING} (the project's shared data)")
    return load_routing(GPTOSS_ROUTING)


def bench_model() -> Path:
    """The default `moeless model train` model, trained on ../shared/data/text (arXiv, C4, GitHub,
    Wikipedia) when that folder exists, else on Python's own documentation. Cached."""
    texts = sorted((SHARED / "text").glob("*.txt")) if (SHARED / "text").is_dir() else None
    return trained_model(REPO / ".moeless" / "models", TrainSpec(), texts)


def tiny_mixtral(workdir: Path, progress: bool = False) -> tuple[Path, Path]:
    """A random Mixtral of the demo's size (4 layers x 8 experts, hidden 128) and its package under
    ``workdir``: built once, then reused (packaging resumes and re-checks)."""
    from moeless.model.packaging import package
    from moeless.model.tiny import TinySpec, build_tiny_model

    model_dir, artifacts = workdir / "model", workdir / "artifacts"
    if not (model_dir / "config.json").is_file():
        build_tiny_model(
            model_dir, TinySpec(arch="mixtral", layers=4, experts=8, hidden=128, intermediate=256)
        )
    package(model_dir, artifacts, progress=progress)
    return model_dir, artifacts
