"""``moeless predict eval-routing``: predictors on per-token routing files (or profile traces)."""

from __future__ import annotations

import json
from pathlib import Path

import click

ROUTING_METHODS = ("freq", "sps", "kernel", "table", "crosslayer", "oracle")
routing_path = click.Path(exists=True, path_type=Path)


@click.command("eval-routing")
@click.argument("routing", metavar="ROUTING", type=routing_path)
@click.option(
    "--train",
    "train_path",
    type=routing_path,
    help="Fit on every request of this routing file (or trace) and test on every request of ROUTING "
    "[default: split ROUTING by request].",
)
@click.option("--method", type=click.Choice(ROUTING_METHODS), required=True)
@click.option(
    "--distance",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Token-level methods predict layer l+d from layers <= l.",
)
@click.option(
    "--test-fraction",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=0.3,
    show_default=True,
    help="Share of ROUTING's requests held out when there is no --train.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the split and the fitting.")
@click.option(
    "--save",
    "save_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="crosslayer: write the fitted networks here (e.g. ARTIFACTS/predictors).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def eval_routing(
    routing: Path,
    train_path: Path | None,
    method: str,
    distance: int,
    test_fraction: float,
    seed: int,
    save_dir: Path | None,
    as_json: bool,
) -> None:
    """Score METHOD on ROUTING (STEM.npz beside STEM.requests.jsonl, or a `moeless profile` trace).

    Load-level methods (freq, sps, kernel) predict each request's per-layer expert shares from its
    prompt; token-level ones (table, crosslayer) a token's experts at layer l+d from its experts at
    layers <= l.
    """
    from moeless.prediction.routing_eval import evaluate_routing
    from moeless.prediction.routing_file import load_routing_or_trace

    trace = load_routing_or_trace(routing)
    train = load_routing_or_trace(train_path) if train_path else None
    result = evaluate_routing(trace, method, distance, seed, train, test_fraction, save_dir=save_dir)
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    click.echo(
        f"{method}, distance {distance}: {result['train_requests']} train / {result['test_requests']} "
        f"test requests ({result['split']}), {result['test_tokens']} test tokens"
    )
    echo_metrics(result)


def echo_metrics(result: dict) -> None:
    """The per-layer and mean metrics of a predictor evaluation, as a table."""
    click.echo(f"{'layer':>5} {'hit rate':>9} {'set recall':>10} {'load acc':>9} {'ms p50':>8} {'ms p99':>8}")
    for row in [*result["layers"], {"layer": "mean", **result["mean"]}]:
        click.echo(
            f"{row['layer']:>5} {row['hit_rate']:9.3f} {row['set_recall']:10.3f} {row['load_accuracy']:9.3f} "
            f"{row['latency_ms_p50']:8.4f} {row['latency_ms_p99']:8.4f}"
        )
