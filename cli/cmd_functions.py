"""``moeless functions``: the expert functions on a local Lambda host."""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path

import click

from cli.options import echo_step, quiet_option

REPO_ROOT = Path(__file__).resolve().parent.parent


def default_task_root() -> Path:
    """``functions/expert`` of the checkout this CLI runs from."""
    return REPO_ROOT / "functions" / "expert"


@click.group()
def functions() -> None:
    """Run the expert functions locally, with Lambda's semantics and Lambda's API."""


@functions.command()
@click.argument("artifacts", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="plan.json from `moeless plan` [default: one function per expert].",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=9001,
    show_default=True,
    help="Port of the Lambda API on 127.0.0.1 (0: any free port).",
)
@click.option(
    "--alias", default="live", show_default=True, help="Qualifier that carries provisioned concurrency."
)
@click.option(
    "--max-instances",
    type=click.IntRange(1),
    default=64,
    show_default=True,
    help="Instances alive at once, all functions together (the local account limit).",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(0.1),
    default=300.0,
    show_default=True,
    help="Seconds before an idle on-demand instance is stopped.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0.1),
    default=30.0,
    show_default=True,
    help="Function timeout in seconds.",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep each instance's log stream here [default: a temporary folder].",
)
@click.option(
    "--meter-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the final bill as JSON to this file.",
)
@click.option(
    "--task-root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Folder of the expert handler [default: functions/expert of this checkout].",
)
@quiet_option
def up(
    artifacts: Path,
    plan_path: Path | None,
    port: int,
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
    from moeless.lambda_host import LambdaHost
    from moeless.lambda_host.client import lambda_client
    from moeless.lambda_host.experts import expert_function_configs
    from moeless.lambda_host.meter import format_bill
    from moeless.manifest import load_manifest
    from moeless.plan import load_plan, one_function_per_expert
    from moeless.provisioning import apply_concurrency

    task_root = task_root or default_task_root()
    if not (task_root / "handler.py").is_file():
        raise click.ClickException(f"no expert handler at {task_root}/handler.py: pass --task-root")
    manifest = load_manifest(artifacts)
    plan = load_plan(plan_path, manifest) if plan_path else one_function_per_expert(manifest)
    configs = expert_function_configs(artifacts, plan, task_root, timeout_s=timeout)
    try:
        host = LambdaHost(configs, port, max_instances, idle_timeout, log_dir).start()
    except OSError as exc:
        raise click.ClickException(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):  # also when started with SIGINT ignored (`cmd &`)
        signal.signal(signum, lambda *_: stop.set())
    try:
        client = lambda_client(host.endpoint_url)
        provisioned = {name: n for name, n in apply_concurrency(client, plan, alias).items() if n}
        if provisioned:
            echo_step(f"initialising {sum(provisioned.values())} provisioned instance(s)...", quiet)
            status = host.wait_provisioned(timeout_s=120)
            if failed := {
                k: v.get("StatusReason", v["Status"]) for k, v in status.items() if v["Status"] != "READY"
            }:
                raise click.ClickException(f"provisioned concurrency not ready: {failed}")
        click.echo(f"Lambda API: {host.endpoint_url}  ({len(configs)} functions, plan: {plan.policy})")
        click.echo(f"  invoke:  boto3.client('lambda', endpoint_url='{host.endpoint_url}').invoke(...)")
        click.echo(
            f"  bill:    {host.endpoint_url}/moeless/meter   instances: {host.endpoint_url}/moeless/instances"
        )
        click.echo(f"  logs:    {host.log_dir}")
        sys.stdout.flush()
        stop.wait()
    finally:
        echo_step("stopping instances...", quiet)
        host.stop()
    bill = host.meter.snapshot()
    click.echo(format_bill(bill))
    if meter_out:
        meter_out.write_text(json.dumps(bill, indent=2))
