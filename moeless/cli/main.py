"""Entry point: a click group that imports each command's module only when it runs.

``moeless --help`` therefore starts without importing torch, transformers or onnxruntime.
User errors (:class:`moeless.errors.MoelessError`) end as one line on stderr and exit 1.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from moeless.version import __version__

# command name -> "module:attribute"
COMMANDS: dict[str, str] = {
    "model": "moeless.cli.cmd_model:model",
    "package": "moeless.cli.cmd_package:package",
    "verify": "moeless.cli.cmd_verify:verify",
    "demo": "moeless.cli.cmd_demo:demo",
    "functions": "moeless.cli.cmd_functions:functions",
    "serve": "moeless.cli.cmd_serve:serve",
    "invoke": "moeless.cli.cmd_invoke:invoke",
    "plan": "moeless.cli.cmd_plan:plan",
    "profile": "moeless.cli.cmd_profile:profile",
    "trace": "moeless.cli.cmd_profile:trace",
    "predict": "moeless.cli.cmd_profile:predict",
    "simulate": "moeless.cli.cmd_simulate:simulate",
    "apply-plan": "moeless.cli.cmd_plan:apply_plan",
    "deploy": "moeless.cli.cmd_deploy:deploy",
    "destroy": "moeless.cli.cmd_deploy:destroy",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def __init__(self, *args: Any, lazy_commands: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy_commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_commands:
            module_name, attr = self.lazy_commands[cmd_name].split(":")
            return getattr(importlib.import_module(module_name), attr)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        from moeless.errors import MoelessError

        try:
            return super().invoke(ctx)
        except MoelessError as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=LazyGroup, lazy_commands=COMMANDS)
@click.version_option(__version__, prog_name="moeless")
def cli() -> None:
    """Serverless Mixture-of-Experts inference: split, package, plan, serve and deploy MoE models."""
