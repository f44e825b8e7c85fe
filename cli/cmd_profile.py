"""``moeless profile`` and ``moeless trace``: record routing over real prompts, and reduce it."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cli.options import quiet_option


@click.command()
@click.argument(
    "source", metavar="MODEL_OR_ARTIFACTS", type=click.Path(exists=True, file_okay=False, path_type=Path)
)
@click.option(
    "--prompts",
    "prompts_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help='JSONL with a "prompt" per line (e.g. ../shared/data/prompts/dev.jsonl).',
)
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--max-new-tokens", type=click.IntRange(0), default=32, show_default=True)
@click.option("--limit", type=click.IntRange(1), help="Use only the first N prompts.")
@click.option(
    "--hidden-sample",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Fraction of tokens whose router inputs are kept (to train the layer-aware predictor).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@quiet_option
def profile(
    source: Path,
    prompts_path: Path,
    output: Path,
    max_new_tokens: int,
    limit: int | None,
    hidden_sample: float,
    seed: int,
    quiet: bool,
) -> None:
    """Run MODEL_OR_ARTIFACTS over prompts and record every token's experts and gate weights."""
    from moeless.trace import load_trace, read_prompts
    from moeless.trace import profile as run_profile

    prompts = read_prompts(prompts_path, limit)
    run_profile(source, prompts, output, max_new_tokens, hidden_sample, seed, progress=not quiet)
    trace = load_trace(output)
    click.echo(
        f"{output}: {len(trace.prompts)} requests, {len(trace.request)} tokens, "
        f"{len(trace.layers)} MoE layers x {trace.num_experts} experts, "
        f"{len(trace.hidden_rows)} hidden-state samples"
    )


@click.group()
def trace() -> None:
    """Work with routing traces."""


@trace.command("loads")
@click.argument("trace_dir", metavar="TRACE", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--phase", type=click.Choice(["all", "prefill", "decode"]), default="all", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here [stdout].")
def loads(trace_dir: Path, phase: str, output: Path | None) -> None:
    """Reduce TRACE to the loads JSON the planner reads."""
    from moeless.trace import load_trace

    text = json.dumps(load_trace(trace_dir).loads(phase).to_dict(), indent=1)
    if output:
        output.write_text(text)
        click.echo(f"loads -> {output}", err=True)
    else:
        click.echo(text)
