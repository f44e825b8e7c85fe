"""``moeless simulate``: replay traffic through serving policies on the whole model; cost and
latency side by side, against the serverful fleet that holds the model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from moeless.cli.options import model_option

if TYPE_CHECKING:
    from moeless.model.shapes import ModelShape
    from moeless.simulation.routing import StepRouting


@click.command()
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(exists=True, path_type=Path),
    help="Replay per-token routing as recorded: a `moeless profile` folder or a STEM.npz routing file.",
)
@click.option(
    "--loads",
    "loads_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Or sample each token's experts from these loads' per-layer shares.",
)
@model_option
@click.option(
    "--policies",
    default="static,moeless,remoe,oracle",
    show_default=True,
    help="Any of static, moeless, remoe, oracle.",
)
@click.option(
    "--arrivals",
    "arrivals_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Replay a recorded trace: CSV of timestamp_s,input_tokens,output_tokens "
    "(each request keeps its lengths).",
)
@click.option(
    "--arrival",
    default="poisson:2",
    show_default=True,
    help="Without --arrivals: poisson:RATE, bursty:RATE:PEAK:PERIOD (requests per second) "
    "or timestamps:FILE.",
)
@click.option(
    "--rate",
    type=click.FloatRange(0, min_open=True),
    help="With --arrivals: rescale the timestamps to this mean rate (requests/s), keeping the burst shape.",
)
@click.option("--duration", type=click.FloatRange(0, min_open=True), default=60.0, show_default=True)
@click.option(
    "--max-batch", type=click.IntRange(1), default=16, show_default=True, help="Sequences per step."
)
@click.option(
    "--context-tokens",
    type=click.IntRange(1),
    default=8192,
    show_default=True,
    help="KV cache each batched sequence is sized for (the fleet and the backbone must hold it).",
)
@click.option(
    "--expert-dtype",
    type=click.Choice(["fp32", "fp16", "int8"]),
    default="fp32",
    show_default=True,
    help="The functions' experts: sets their bytes, CPU time and cold start.",
)
@click.option(
    "--gpu-dtype",
    default="native",
    show_default=True,
    help="Weights on the GPUs: native (the published checkpoint's), bf16, fp16, fp8, int8.",
)
@click.option(
    "--instances",
    "instances_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Your own GPU instance catalogue (JSON) instead of the built-in on-demand prices.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--no-predictors", is_flag=True, help="moeless and remoe run without pre-warming from their predictors."
)
@click.option(
    "--prewarm-eval",
    "prewarm_evals",
    multiple=True,
    metavar="POLICY=EVAL.json",
    help="Pre-warm POLICY (moeless, remoe) at the accuracy of this `moeless predict eval` / "
    "`eval-routing --json` result instead of the built-in one. Repeatable.",
)
@click.option(
    "--replan",
    "replan_s",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Serverless policies re-plan from each window of this many seconds (0: never).",
)
@click.option(
    "--prompt-tokens",
    type=click.IntRange(1),
    default=128,
    show_default=True,
    help="With --loads and no --arrivals.",
)
@click.option(
    "--output-tokens",
    type=click.IntRange(1),
    default=64,
    show_default=True,
    help="With --loads and no --arrivals.",
)
@click.option(
    "--resample-experts",
    is_flag=True,
    help="Loads recorded on a model with another expert count: carry each layer's skew onto "
    "the model's experts.",
)
@click.option("--no-plots", is_flag=True, help="Skip the plots (faster on whole models).")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False, path_type=Path))
def simulate(
    trace_path: Path | None,
    loads_path: Path | None,
    model_spec: str | None,
    policies: str,
    arrivals_path: Path | None,
    arrival: str,
    rate: float | None,
    duration: float,
    max_batch: int,
    context_tokens: int,
    expert_dtype: str,
    gpu_dtype: str,
    instances_path: Path | None,
    seed: int,
    no_predictors: bool,
    prewarm_evals: tuple[str, ...],
    replan_s: float | None,
    prompt_tokens: int,
    output_tokens: int,
    resample_experts: bool,
    no_plots: bool,
    output: Path,
) -> None:
    """Simulate each policy on the same requests over every MoE layer of the model; write
    report.md, results.csv and plots to OUTPUT."""
    import numpy as np

    from moeless.simulation.arrivals import arrival_times, read_arrivals, synthetic
    from moeless.simulation.policies import POLICIES, Deployment, requests_for, requests_replaying
    from moeless.simulation.routing import RecordedRouting
    from moeless.simulation.study import run_study

    if (trace_path is None) == (loads_path is None):
        raise click.UsageError("give one of --trace or --loads")
    if rate is not None and arrivals_path is None:
        raise click.UsageError(
            "--rate rescales --arrivals; for a synthetic process give --arrival poisson:RATE"
        )
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if unknown := [name for name in names if name not in POLICIES]:
        raise click.BadParameter(
            f"unknown policy {unknown[0]!r}; choose from {', '.join(POLICIES)}", param_hint="--policies"
        )
    shape, routing = _shape_and_routing(trace_path, loads_path, model_spec, resample_experts, seed)
    rng = np.random.default_rng(seed)
    if arrivals_path is not None:
        traffic = read_arrivals(arrivals_path)
        traffic = (traffic.rescaled(rate) if rate else traffic).cut(duration)
        replay, source = requests_for(traffic), traffic.source
    elif isinstance(routing, RecordedRouting):  # each request keeps its recorded lengths
        replay, source = requests_replaying(arrival_times(arrival, duration, rng), routing), arrival
    else:
        traffic = synthetic(arrival, duration, rng, prompt_tokens, output_tokens)
        replay, source = requests_for(traffic), traffic.source
    catalogue = None
    if instances_path is not None:
        from moeless.planning.instances import load_catalogue

        catalogue = load_catalogue(instances_path)
    deployment = Deployment.choose(shape, expert_dtype, gpu_dtype, max_batch, context_tokens, catalogue)
    describe = [f"- requests: {len(replay)} ({source}, {duration:g} s, seed {seed})"]
    _results, plots = run_study(
        deployment,
        routing,
        replay,
        names,
        duration,
        output,
        describe,
        replan_s=replan_s or None,
        predictors=not no_predictors,
        prewarm=_prewarm_models(prewarm_evals),
        seed=seed,
        plots=not no_plots,
    )
    click.echo((output / "report.md").read_text())
    if plots:
        click.echo("plots: " + ", ".join(str(p) for p in plots))


def _shape_and_routing(
    trace_path: Path | None, loads_path: Path | None, model_spec: str | None, resample: bool, seed: int
) -> tuple[ModelShape, StepRouting]:
    """The model's shape (from --model, else what the data names) and the routing over its layers."""
    from moeless.contracts.loads import load_loads
    from moeless.model.shapes import resolve_model, shape_for_loads
    from moeless.prediction.routing_file import load_routing_or_trace
    from moeless.simulation.routing import RecordedRouting, SampledRouting

    if loads_path is not None:
        loads = load_loads(loads_path)
        shape = resolve_model(model_spec) if model_spec else shape_for_loads(loads.meta, None)
        if resample:
            experts, top_k = shape.num_experts, shape.top_k
        else:
            experts, top_k = None, loads.top_k or shape.top_k
            _check_experts(shape, loads.num_experts)
        routing = SampledRouting.from_loads(
            loads, top_k, list(shape.moe_layers), shape.num_layers, experts, seed
        )
        return shape, routing
    assert trace_path is not None
    trace = load_routing_or_trace(trace_path)
    if model_spec:
        shape = resolve_model(model_spec)
    else:
        config = Path(str(trace.meta.get("model", ""))) / "config.json"
        shape = resolve_model(str(config)) if config.is_file() else shape_for_loads(trace.meta, None)
    _check_experts(shape, trace.num_experts)
    return shape, RecordedRouting.from_trace(trace, list(shape.moe_layers), shape.num_layers)


def _check_experts(shape: ModelShape, recorded: int) -> None:
    if shape.num_experts != recorded:
        raise click.UsageError(
            f"the routing has {recorded} experts per layer but {shape.name} has {shape.num_experts}: "
            "pass the --model it was recorded on, or --resample-experts to carry its skew over"
        )


def _prewarm_models(specs: tuple[str, ...]) -> dict:
    """``POLICY=EVAL.json`` options -> policy -> PrewarmModel (one clear error per bad option)."""
    import json

    from moeless.simulation.simulator import PrewarmModel

    models = {}
    for spec in specs:
        policy, _, path = spec.partition("=")
        if policy not in ("moeless", "remoe") or not path:
            raise click.BadParameter(
                f"{spec!r}: expected moeless=FILE or remoe=FILE", param_hint="--prewarm-eval"
            )
        try:
            models[policy] = PrewarmModel.from_eval(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as exc:
            raise click.BadParameter(f"{path}: {exc}", param_hint="--prewarm-eval") from None
    return models
