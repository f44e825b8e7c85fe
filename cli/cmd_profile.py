"""``moeless profile`` and ``moeless trace``: record routing over real prompts, and reduce it."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cli.cmd_predict_routing import echo_metrics, eval_routing
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
    from moeless.prediction.trace import load_trace, read_prompts
    from moeless.prediction.trace import profile as run_profile

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
    from moeless.prediction.trace import load_trace

    text = json.dumps(load_trace(trace_dir).loads(phase).to_dict(), indent=1)
    if output:
        output.write_text(text)
        click.echo(f"loads -> {output}", err=True)
    else:
        click.echo(text)


@click.group()
def predict() -> None:
    """Evaluate expert-load predictors on a trace."""


@predict.command("eval")
@click.argument("trace_dir", metavar="TRACE", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--method", type=click.Choice(["sps", "layer", "gate", "freq", "oracle"]), required=True)
@click.option(
    "--distance",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Predict layer l+d from layer l (token-level methods).",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the train/test split by request."
)
@click.option(
    "--save",
    "save_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="layer: write the fine-tuned router copies here (e.g. ARTIFACTS/predictors).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def evaluate(
    trace_dir: Path, method: str, distance: int, seed: int, save_dir: Path | None, as_json: bool
) -> None:
    """Score METHOD on TRACE's held-out requests: hit rate, set recall, load accuracy, latency."""
    from moeless.prediction.evaluation import evaluate as run
    from moeless.prediction.trace import load_trace

    result = run(load_trace(trace_dir), method, distance, seed, save_dir=save_dir)
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    click.echo(
        f"{method}, distance {distance}: {result['train_requests']} train / {result['test_requests']} "
        f"test requests"
    )
    echo_metrics(result)


predict.add_command(eval_routing)
