"""Options shared by several commands, defined once."""

from __future__ import annotations

from pathlib import Path

import click

quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress bars or step messages.")
plan_option = click.option(
    "--plan",
    "plan_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="plan.json from `moeless plan` [default: one function per expert].",
)

model_option = click.option(
    "--model",
    "model_spec",
    metavar="NAME|CONFIG",
    help="The model's shape: a preset (mixtral-8x7b, gpt-oss-120b, deepseek-v3...), a Hugging Face id "
    "of one, or a config.json [default: the model the loads name].",
)


def echo_step(message: str, quiet: bool = False) -> None:
    """A progress message, to stderr so stdout stays the command's result."""
    if not quiet:
        click.echo(message, err=True)
