"""``moeless model``: get a model to work with."""

from __future__ import annotations

from pathlib import Path

import click

from cli.options import echo_step, quiet_option
from moeless.tiny import TINY_ARCHS, TinySpec


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
    from moeless.tiny import build_tiny_model

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
