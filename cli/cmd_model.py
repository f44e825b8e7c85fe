"""``moeless model``: get a model to work with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from cli.options import echo_step, quiet_option
from moeless.model.tiny import TINY_ARCHS, TinySpec


@click.group()
def model() -> None:
    """Build models to split (tiny random ones for tests and demos)."""


@model.command("tiny")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--arch", type=click.Choice(TINY_ARCHS), default="mixtral", show_default=True)
@click.option("--layers", type=click.IntRange(min=1), default=TinySpec.layers, show_default=True)
@click.option("--experts", type=click.IntRange(min=2), default=TinySpec.experts, show_default=True)
@click.option("--top-k", type=click.IntRange(min=1), default=TinySpec.top_k, show_default=True)
@click.option("--hidden", type=click.IntRange(min=16), default=TinySpec.hidden, show_default=True)
@click.option("--intermediate", type=click.IntRange(min=8), default=TinySpec.intermediate, show_default=True)
@click.option("--vocab", type=click.IntRange(min=300), default=TinySpec.vocab, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@quiet_option
def tiny(
    out_dir: Path,
    arch: str,
    layers: int,
    experts: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    vocab: int,
    seed: int,
    quiet: bool,
) -> None:
    """Write a random-init ARCH checkpoint and tokenizer to OUT_DIR, offline and deterministic."""
    from moeless.model.tiny import build_tiny_model

    if top_k > experts:
        raise click.BadParameter(f"--top-k {top_k} exceeds --experts {experts}", param_hint="--top-k")
    if hidden % 4:
        raise click.BadParameter(
            "--hidden must be a multiple of 4 (4 attention heads)", param_hint="--hidden"
        )
    spec = TinySpec(arch, layers, experts, top_k, hidden, intermediate, vocab, seed)
    echo_step(
        f"building tiny {arch}: {layers} layers x {experts} experts (top-{top_k}), hidden {hidden}", quiet
    )
    build_tiny_model(out_dir, spec)
    click.echo(str(out_dir))


def texts_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--text FILE`` (repeatable): the text a model trains on."""
    return click.option(
        "--text",
        "texts",
        multiple=True,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help=help_text,
    )


@model.command("train")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--arch", type=click.Choice(TINY_ARCHS), default="mixtral", show_default=True)
@click.option("--layers", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--experts", type=click.IntRange(min=2), default=8, show_default=True)
@click.option("--top-k", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--hidden", type=click.IntRange(min=16), default=128, show_default=True)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=600,
    show_default=True,
    help="Optimizer steps (16 x 128 tokens each); the same seed and steps give the same model.",
)
@click.option(
    "--minutes",
    type=click.FloatRange(0, min_open=True),
    help="Stop after this long even if steps remain (the report says so).",
)
@texts_option("Train on these files [default: Python's own documentation, which every Python carries].")
@click.option("--seed", type=int, default=0, show_default=True)
@quiet_option
def train(
    out_dir: Path,
    arch: str,
    layers: int,
    experts: int,
    top_k: int,
    hidden: int,
    steps: int,
    minutes: float | None,
    texts: tuple[Path, ...],
    seed: int,
    quiet: bool,
) -> None:
    """Train a small MoE on real text on the CPU (load-balancing loss on) and save it to OUT_DIR."""
    from moeless.model.training import TrainSpec, train_model

    if top_k > experts:
        raise click.BadParameter(f"--top-k {top_k} exceeds --experts {experts}", param_hint="--top-k")
    spec = TrainSpec(
        arch=arch,
        layers=layers,
        experts=experts,
        top_k=top_k,
        hidden=hidden,
        intermediate=2 * hidden,
        steps=steps,
        minutes=minutes,
        seed=seed,
    )
    echo_step(
        f"training {arch}: {layers} layers x {experts} experts (top-{top_k}), hidden {hidden}, {steps} steps",
        quiet,
    )
    report = train_model(out_dir, spec, list(texts) or None, progress=not quiet)
    click.echo(
        f"{out_dir}: {report.steps} steps in {report.seconds:.0f} s, train loss {report.train_loss:.3f}, "
        f"held-out perplexity {report.heldout_perplexity:.1f} on {report.heldout_tokens} tokens"
        + (" (stopped by --minutes)" if report.stopped_by_time else "")
    )


@model.command("train-draft")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--target",
    "target_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The model it drafts for (a checkpoint folder with its tokenizer): the draft shares it.",
)
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--hidden", type=click.IntRange(min=16), default=128, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=600, show_default=True)
@texts_option("Train on these files (the target's own text is best) [default: Python's own documentation].")
@click.option("--seed", type=int, default=0, show_default=True)
@quiet_option
def train_draft(
    out_dir: Path,
    target_dir: Path,
    layers: int,
    hidden: int,
    steps: int,
    texts: tuple[Path, ...],
    seed: int,
    quiet: bool,
) -> None:
    """Train a small dense draft (Llama blocks) with TARGET's tokenizer, for `serve --draft-model`."""
    from moeless.model.training import DraftSpec, train_draft_model

    spec = DraftSpec(layers=layers, hidden=hidden, intermediate=2 * hidden, steps=steps, seed=seed)
    echo_step(
        f"training a dense draft for {target_dir}: {layers} layers, hidden {hidden}, {steps} steps", quiet
    )
    report = train_draft_model(out_dir, target_dir, spec, list(texts) or None, progress=not quiet)
    click.echo(
        f"{out_dir}: {report.steps} steps in {report.seconds:.0f} s, held-out perplexity "
        f"{report.heldout_perplexity:.1f}; serve with --speculate K --draft-model {out_dir}"
    )
