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
    "model": "cli.cmd_model:model",
    "package": "cli.cmd_package:package",
    "verify": "cli.cmd_verify:verify",
    "demo": "cli.cmd_demo:demo",
    "functions": "cli.cmd_functions:functions",
    "serve": "cli.cmd_serve:serve",
    "invoke": "cli.cmd_invoke:invoke",
    "plan": "cli.cmd_plan:plan",
    "profile": "cli.cmd_profile:profile",
    "trace": "cli.cmd_profile:trace",
    "predict": "cli.cmd_profile:predict",
    "simulate": "cli.cmd_simulate:simulate",
    "apply-plan": "cli.cmd_plan:apply_plan",
    "deploy": "cli.cmd_deploy:deploy",
    "destroy": "cli.cmd_deploy:destroy",
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
