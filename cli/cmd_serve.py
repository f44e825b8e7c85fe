"""``moeless serve``: the backbone service and its REST endpoint, experts as Lambda functions."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cli.options import echo_step, plan_option, quiet_option
from cli.running import expert_task_root, host_options, wait_for_stop_signal
from moeless.contracts.environment import (
    ALIAS,
    DEFAULT_DRAFT_CONFIDENCE,
    DEFAULT_MAX_BATCH,
    DEFAULT_REPLAN_INTERVAL_S,
)

if TYPE_CHECKING:
    from moeless.serving.backbone import BackboneConfig


@click.command()
@click.argument("artifacts", type=click.Path(exists=True, file_okay=False, path_type=Path))
@plan_option
@click.option(
    "--local", "local", is_flag=True, help="Run the expert functions on a local Lambda host started here."
)
@click.option(
    "--lambda-endpoint",
    metavar="URL",
    help="Invoke experts at this Lambda API (e.g. a running `moeless functions up`) "
    "[default: AWS, with boto3's usual credentials].",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Port of the REST endpoint on 127.0.0.1 (0: any free port).",
)
@click.option(
    "--functions-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Port of the local Lambda host with --local (0: any free port).",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="Where the backbone runs (auto: CUDA when present).",
)
@click.option(
    "--max-batch",
    type=click.IntRange(1, 256),
    default=DEFAULT_MAX_BATCH,
    show_default=True,
    help="Sequences decoded together per step.",
)
@click.option(
    "--prefill-chunk",
    type=click.IntRange(1),
    help="Chunked prefill: prompt tokens per step, shared by its new sequences, so a long prompt "
    "stalls the decoding batch one chunk at a time [default: the plan's, else whole prompts].",
)
@click.option(
    "--speculate",
    type=click.IntRange(0, 16),
    help="Drafted tokens each decoding sequence carries into one forward, verified there (0: off): "
    "fewer round trips per token, the same tokens [default: the plan's, else 0].",
)
@click.option(
    "--draft-model",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="With --speculate: a small causal LM with this model's tokenizer drafts the tokens "
    "[default: prompt lookup, n-grams of the text so far].",
)
@click.option(
    "--draft-confidence",
    type=click.FloatRange(0, 1),
    default=DEFAULT_DRAFT_CONFIDENCE,
    show_default=True,
    help="With --draft-model: a draft stops before the first guess the draft model gives less "
    "probability (0: always K guesses): fewer rejected rows, so fewer experts per layer; worth it "
    "where the draft's probabilities track how often it is right.",
)
@click.option("--model-name", help="The `model` clients name [default: the artifacts folder's name].")
@click.option(
    "--max-tokens-limit",
    type=click.IntRange(1),
    default=1024,
    show_default=True,
    help="Largest max_tokens a request may ask for.",
)
@click.option(
    "--predictor-trace",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A trace of this model (`moeless profile`): pre-warm each request's predicted functions.",
)
@click.option(
    "--predictor",
    type=click.Choice(["kernel", "sps"]),
    default="kernel",
    show_default=True,
    help="With --predictor-trace: kernel-weighted neighbours (best measured) or Remoe's SPS.",
)
@click.option(
    "--token-predictor",
    type=click.Choice(["crosslayer", "none"]),
    default="crosslayer",
    show_default=True,
    help="With --predictor-trace: also pre-warm what each token's experts so far predict one layer "
    "ahead (the cross-layer model, fitted on the trace), or not.",
)
@click.option(
    "--replan-interval",
    type=click.FloatRange(0),
    default=DEFAULT_REPLAN_INTERVAL_S,
    show_default=True,
    help="Seconds between re-provisioning the functions from observed loads (0: never).",
)
@host_options
@quiet_option
def serve(
    artifacts: Path,
    plan_path: Path | None,
    local: bool,
    lambda_endpoint: str | None,
    port: int,
    functions_port: int,
    device: str,
    max_batch: int,
    prefill_chunk: int | None,
    speculate: int | None,
    draft_model: Path | None,
    draft_confidence: float,
    model_name: str | None,
    max_tokens_limit: int,
    predictor_trace: Path | None,
    predictor: str,
    token_predictor: str,
    replan_interval: float,
    alias: str,
    max_instances: int,
    idle_timeout: float,
    timeout: float,
    log_dir: Path | None,
    meter_out: Path | None,
    task_root: Path | None,
    quiet: bool,
) -> None:
    """Serve ARTIFACTS behind an OpenAI-style REST endpoint until Ctrl-C or SIGTERM.

    POST /v1/completions and /v1/chat/completions, GET /v1/models, /tokenize, /detokenize,
    /health, /version, /healthz, /metrics. With --local the experts run on a local Lambda host
    (awslambdaric processes) and its bill is printed on shutdown.
    """
    from moeless.serving.backbone import BackboneConfig

    if local and lambda_endpoint:
        raise click.UsageError("--local starts its own Lambda host: drop --lambda-endpoint")
    if draft_model is not None and speculate == 0:
        raise click.UsageError("--draft-model drafts for --speculate K: give K >= 1 or drop --draft-model")
    config = BackboneConfig(
        artifacts,
        plan_path,
        lambda_endpoint=lambda_endpoint,
        qualifier=alias,
        device=device,
        model_name=model_name,
        max_batch=max_batch,
        prefill_chunk=prefill_chunk,
        speculate=speculate,
        draft_model=draft_model,
        draft_confidence=draft_confidence,
        max_tokens_limit=max_tokens_limit,
        replan_interval_s=replan_interval,
        predictor_trace=predictor_trace,
        predictor=predictor,
        token_predictor=token_predictor,
    )
    host = LocalHost(functions_port, alias, max_instances, idle_timeout, timeout, log_dir, task_root)
    serve_until_stopped(config, port, host if local else None, meter_out, quiet)


@dataclass(frozen=True)
class LocalHost:
    """The local Lambda host's options (``--functions-port`` and :func:`host_options`)."""

    port: int = 0
    alias: str = ALIAS
    max_instances: int = 64
    idle_timeout_s: float = 300.0
    timeout_s: float = 30.0
    log_dir: Path | None = None
    task_root: Path | None = None


def serve_until_stopped(
    config: BackboneConfig,
    port: int,
    local_host: LocalHost | None = None,
    meter_out: Path | None = None,
    quiet: bool = False,
) -> None:
    """Serve ``config`` on 127.0.0.1:``port`` until Ctrl-C or SIGTERM; with ``local_host``, its
    expert functions on a local Lambda host whose bill is printed at the end."""
    from backbone_service.local import running_service
    from moeless.contracts.manifest import load_manifest
    from moeless.contracts.plan import plan_for
    from moeless.lambda_host.experts import start_expert_host
    from moeless.lambda_host.meter import format_bill

    plan = plan_for(load_manifest(config.artifacts), config.plan)

    def start_host():
        assert local_host is not None
        echo_step(f"starting {len(plan.functions)} expert functions on a local Lambda host...", quiet)
        return start_expert_host(
            config.artifacts,
            plan,
            expert_task_root(local_host.task_root),
            local_host.port,
            local_host.alias,
            local_host.max_instances,
            local_host.idle_timeout_s,
            local_host.timeout_s,
            local_host.log_dir,
            on_progress=lambda message: echo_step(message, quiet),
        )

    with running_service(
        config, port, start_host if local_host else None, lambda message: echo_step(message, quiet)
    ) as (server, backbone, host):
        click.echo(
            f"REST endpoint: {server.url}/v1  (model {backbone.model_name!r}, backbone on {backbone.device})"
        )
        click.echo(f'  try: moeless invoke "Hello" --endpoint {server.url}')
        click.echo(
            f"  experts: {backbone.config.lambda_endpoint or 'AWS Lambda'}   metrics: {server.url}/metrics"
        )
        sys.stdout.flush()
        wait_for_stop_signal()
    if host is not None:
        bill = host.meter.snapshot()
        click.echo(format_bill(bill))
        if meter_out:
            meter_out.write_text(json.dumps(bill, indent=2))
