"""``moeless simulate``: replay traffic through serving policies; cost and latency side by side."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option(
    "--trace",
    "trace_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Replay this trace's requests with their recorded routing.",
)
@click.option(
    "--loads",
    "loads_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Or sample each token's experts from these loads.",
)
@click.option(
    "--policies",
    default="static,static-replicated,moeless,remoe,oracle",
    show_default=True,
    help="Any of static, static-replicated, moeless, remoe, oracle.",
)
@click.option(
    "--arrival",
    default="poisson:2",
    show_default=True,
    help="poisson:RATE, bursty:RATE:PEAK:PERIOD (requests per second) or timestamps:FILE.",
)
@click.option("--duration", type=click.FloatRange(0, min_open=True), default=60.0, show_default=True)
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
    "--workers",
    type=click.IntRange(1),
    default=4,
    show_default=True,
    help="Serverful GPU workers (static), and the workers moeless balances over.",
)
@click.option(
    "--hidden", type=click.IntRange(1), help="Expert hidden size [the loads' model, else Mixtral's]."
)
@click.option("--intermediate", type=click.IntRange(1), help="Expert intermediate size.")
@click.option("--prompt-tokens", type=click.IntRange(1), default=128, show_default=True, help="With --loads.")
@click.option("--output-tokens", type=click.IntRange(0), default=64, show_default=True, help="With --loads.")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False, path_type=Path))
def simulate(
    trace_dir: Path | None,
    loads_path: Path | None,
    policies: str,
    arrival: str,
    duration: float,
    seed: int,
    no_predictors: bool,
    prewarm_evals: tuple[str, ...],
    replan_s: float | None,
    workers: int,
    hidden: int | None,
    intermediate: int | None,
    prompt_tokens: int,
    output_tokens: int,
    output: Path,
) -> None:
    """Simulate each policy on the same requests and write report.md and results.csv to OUTPUT."""
    import numpy as np

    from moeless.contracts.loads import load_loads
    from moeless.errors import SimulationError
    from moeless.prediction.trace import load_trace
    from moeless.simulation.simulator import POLICIES, arrivals, requests_from_trace, sample_requests
    from moeless.simulation.study import run_study

    if (trace_dir is None) == (loads_path is None):
        raise click.UsageError("give one of --trace or --loads")
    rng = np.random.default_rng(seed)
    try:
        times = arrivals(arrival, duration, rng)
    except SimulationError as exc:
        raise click.BadParameter(str(exc), param_hint="--arrival") from None
    if trace_dir is not None:
        trace = load_trace(trace_dir)
        loads, top_k = trace.loads(), int(trace.meta["top_k"])
        replay = requests_from_trace(trace, times)
    else:
        assert loads_path is not None
        loads = load_loads(loads_path)
        top_k = loads.top_k or 2
        replay = sample_requests(loads, times, top_k, prompt_tokens, output_tokens, rng)
    prewarm = _prewarm_models(prewarm_evals)
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if unknown := [name for name in names if name not in POLICIES]:
        raise click.BadParameter(
            f"unknown policy {unknown[0]!r}; choose from {', '.join(POLICIES)}", param_hint="--policies"
        )
    source = f"{len(replay)} ({arrival} for {duration:.0f} s, seed {seed}), from {trace_dir or loads_path}"
    _results, plots = run_study(
        loads,
        top_k,
        replay,
        names,
        duration,
        output,
        [f"- requests: {source}"],
        workers,
        hidden,
        intermediate,
        replan_s or None,
        not no_predictors,
        prewarm=prewarm,
    )
    click.echo((output / "report.md").read_text())
    click.echo("plots: " + ", ".join(str(p) for p in plots))


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
