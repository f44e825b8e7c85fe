"""Options shared by several commands, defined once."""

from __future__ import annotations

import click

quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress bars or step messages.")


def echo_step(message: str, quiet: bool = False) -> None:
    """A progress message, to stderr so stdout stays the command's result."""
    if not quiet:
        click.echo(message, err=True)
