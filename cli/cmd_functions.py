"""``moeless functions``: the expert functions on a local Lambda host."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from cli.options import account_concurrency_option, echo_step, plan_option, quiet_option
from cli.running import expert_task_root, host_options, wait_for_stop_signal
from moeless.aws_limits import DEFAULT_LIMITS


@click.group()
def functions() -> None:
    """Run the expert functions locally, with Lambda's semantics and Lambda's API."""


@functions.command()
@click.argument("artifacts", type=click.Path(exists=True, file_okay=False, path_type=Path))
@plan_option
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=9001,
    show_default=True,
    help="Port of the Lambda API on 127.0.0.1 (0: any free port).",
)
@account_concurrency_option
@host_options
@quiet_option
def up(
    artifacts: Path,
    plan_path: Path | None,
    port: int,
    account_concurrency: int,
    alias: str,
    max_instances: int,
    idle_timeout: float,
    timeout: float,
    log_dir: Path | None,
    meter_out: Path | None,
    task_root: Path | None,
    quiet: bool,
) -> None:
    """Host the expert functions of ARTIFACTS until stopped (Ctrl-C or SIGTERM).

    Each function instance is a process of AWS's runtime interface client (awslambdaric); callers
    use the Lambda API, e.g. boto3.client("lambda", endpoint_url=...). On shutdown it prints what
    AWS would have billed.
    """
    from dataclasses import replace

    from moeless.contracts.manifest import load_manifest
    from moeless.contracts.plan import plan_for
    from moeless.lambda_host.experts import start_expert_host
    from moeless.lambda_host.meter import format_bill

    manifest = load_manifest(artifacts)
    plan = plan_for(manifest, plan_path)
    host = start_expert_host(
        artifacts,
        plan,
        expert_task_root(task_root),
        port,
        alias,
        max_instances,
        idle_timeout,
        timeout,
        log_dir,
        on_progress=lambda message: echo_step(message, quiet),
        limits=replace(DEFAULT_LIMITS, account_concurrency=account_concurrency),
    )
    try:
        click.echo(f"Lambda API: {host.endpoint_url}  ({len(plan.functions)} functions, plan: {plan.policy})")
        click.echo(f"  invoke:  boto3.client('lambda', endpoint_url='{host.endpoint_url}').invoke(...)")
        click.echo(
            f"  bill:    {host.endpoint_url}/moeless/meter   instances: {host.endpoint_url}/moeless/instances"
        )
        click.echo(f"  logs:    {host.log_dir}")
        sys.stdout.flush()
        wait_for_stop_signal()
    finally:
        echo_step("stopping instances...", quiet)
        host.stop()
    bill = host.meter.snapshot()
    click.echo(format_bill(bill))
    if meter_out:
        meter_out.write_text(json.dumps(bill, indent=2))
