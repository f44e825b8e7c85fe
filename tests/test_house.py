"""The house rules (docs/design.md, "The house"): imports in ``moeless/`` point down the layers,
the engine never imports a deployable or the CLI (``cli/``, beside the other deployables), nothing
imports the CLI, and every part shows its public face in ``__all__`` without pulling in the heavy
libraries."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "moeless"

# Lowest first: a part may import its own modules and those of the parts before it, never after.
LAYERS = (
    "moeless",  # the foundation: errors, fileio, aws_prices, version, checkout
    "contracts",
    "artifacts",
    "experts",
    "model",
    "prediction",
    "planning",
    "lambda_host",
    "serving",
    "simulation",
    "sizing",
    "deployment",
    "demo",
)
# what stands on the engine, each importing it one way; the engine imports none of them
DEPLOYABLES = ("cli", "backbone_service", "functions", "cdk", "moeless_cdk")
HEAVY = ("torch", "transformers", "onnxruntime", "matplotlib", "fastapi", "boto3", "sentence_transformers")


def part_of(module: str) -> str:
    """``moeless.serving.backbone`` -> ``serving``; ``moeless.errors`` -> ``moeless``."""
    pieces = module.split(".")
    if len(pieces) > 1 and (ENGINE / pieces[1]).is_dir():
        return pieces[1]
    return "moeless"


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (top level, inside functions, under TYPE_CHECKING): (line, name)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


ENGINE_FILES = sorted(ENGINE.rglob("*.py"))


def test_every_part_has_a_layer():
    parts = {p.name for p in ENGINE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert parts == set(LAYERS) - {"moeless"}


def test_imports_point_down_the_layers():
    upward = []
    for path in ENGINE_FILES:
        here = part_of(module_name(path))
        for line, target in imports_of(path):
            if target.split(".")[0] != "moeless":
                continue
            there = part_of(target)
            if LAYERS.index(there) > LAYERS.index(here):
                upward.append(f"{path.relative_to(REPO)}:{line} ({here}) imports {target} ({there})")
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_the_engine_never_imports_a_deployable():
    offending = [
        f"{path.relative_to(REPO)}:{line} imports {target}"
        for path in ENGINE_FILES
        for line, target in imports_of(path)
        if target.split(".")[0] in DEPLOYABLES
    ]
    assert not offending, "\n".join(offending)


def test_nothing_outside_the_cli_imports_it():
    outside = [
        p
        for folder in ("moeless", "backbone_service", "functions", "cdk", "benchmarks")
        for p in (REPO / folder).rglob("*.py")
        if "node_modules" not in p.parts
    ]
    offending = [
        f"{path.relative_to(REPO)}:{line} imports {target}"
        for path in outside
        for line, target in imports_of(path)
        if target.split(".")[0] == "cli"
    ]
    assert not offending, "\n".join(offending)


def test_no_two_modules_import_each_other():
    graph = {
        module_name(path): {t for _, t in imports_of(path) if t.startswith("moeless")}
        for path in ENGINE_FILES
    }
    pairs = sorted(
        f"{a} <-> {b}"
        for a, targets in graph.items()
        for b in targets
        if a < b and a in graph.get(b, set()) and not b.startswith(a + ".") and not a.startswith(b + ".")
    )
    assert not pairs, "\n".join(pairs)


@pytest.mark.parametrize("part", [p for p in LAYERS if p != "moeless"])
def test_public_face(part):
    package = importlib.import_module(f"moeless.{part}")
    # GIVEN a part's __all__, THEN every name in it exists, and nothing private is exported
    assert package.__doc__, f"moeless.{part} says what it is for"
    assert package.__all__ == sorted(package.__all__)
    missing = [name for name in package.__all__ if not hasattr(package, name)]
    assert not missing
    assert not [name for name in package.__all__ if name.startswith("_")]


def test_importing_every_part_stays_light():
    parts = ", ".join(f"moeless.{p}" for p in LAYERS if p != "moeless")
    code = f"import sys, {parts}; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
