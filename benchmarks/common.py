"""What the benchmarks share: the trained model they measure, on the best text available."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from moeless.model.training import TrainSpec, trained_model

if TYPE_CHECKING:
    from moeless.prediction.trace import Trace

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
GPTOSS_ROUTING = SHARED / "routing" / "gptoss20b_decode.npz"
RESULTS = REPO / "benchmarks" / "results"


def commit() -> str:
    """The checkout's short commit, saying so when uncommitted changes were measured with it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=REPO).stdout
    return head.stdout.strip() + (" (uncommitted changes included)" if dirty.strip() else "")


def machine() -> str:
    """What the figures were measured on: the CPU's model name where Linux says it, and its cores."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [
        line.split(":", 1)[1].strip()
        for line in (cpuinfo.read_text().splitlines() if cpuinfo.is_file() else [])
        if line.startswith("model name")
    ]
    cpu = names[0] if names else platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_result(name: str, title: str, body: Sequence[str], argv: Sequence[str] | None = None) -> Path:
    """Write ``benchmarks/results/NAME.md``: the title, the command that reproduces it (this
    script with ``argv``, default the process's own arguments), the commit, the date and the
    machine, then ``body`` (Markdown lines: tables, findings). Returns the file's path. Every
    benchmark writes its figures this way, so the README and docs link to a file that says how it
    was made, and a re-run replaces it rather than adding to a log."""
    script = Path(sys.argv[0]).resolve()
    args = list(sys.argv[1:] if argv is None else argv)
    command = shlex.join([".venv/bin/python", f"benchmarks/{script.name}", *args])
    header = [
        f"# {name}: {title}",
        "",
        f"Command: `{command}`  ",
        f"Commit: {commit()}; date: {datetime.now(UTC):%Y-%m-%d}; machine: {machine()}.",
        "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.md"
    out.write_text("\n".join([*header, *body]).rstrip() + "\n")
    print(f"wrote {out.relative_to(REPO)}")
    return out


def md_row(cells: Iterable[object]) -> str:
    """One Markdown table row; a benchmark prints its rows as it measures them and writes the same
    lines to its result file, so what the terminal shows and what the file keeps cannot differ."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def md_header(columns: Sequence[str], align: str = "") -> list[str]:
    """A Markdown table's header and rule; ``align`` has an ``l`` or ``r`` per column (default: the
    first left, the rest right, as figures read best)."""
    align = align or "l" + "r" * (len(columns) - 1)
    return [md_row(columns), "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]


def md_table(columns: Sequence[str], rows: Iterable[Iterable[object]], align: str = "") -> list[str]:
    """A whole Markdown table (:func:`md_header` and a :func:`md_row` per row)."""
    return [*md_header(columns, align), *(md_row(row) for row in rows)]


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
