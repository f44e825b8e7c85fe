"""``moeless simulate``: replay traffic through serving policies on the whole model; cost and
latency side by side, against the serverful fleet that holds the model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import click

from cli.options import (
    account_concurrency_option,
    api_price,
    api_price_option,
    deployment_options,
    draft_acceptance,
    max_function_memory_option,
    model_option,
    speculation_options,
    traffic_options,
)


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
    default="static,hybrid,moeless,remoe,oracle",
    show_default=True,
    help="Any of static (the GPU fleet), hybrid (one GPU node, experts on its CPUs), moeless, remoe, oracle.",
)
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Replay exactly this plan (from `moeless plan --slo-tpot-ms`) as its policy, beside the "
    "serverful fleet, instead of planning each policy from the routing.",
)
@account_concurrency_option
@max_function_memory_option
@api_price_option
@traffic_options
@deployment_options
@speculation_options
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
    "--replan-interval",
    "replan_s",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Re-plan every this many seconds (0: never): a plan that carries the forecasting re-planner "
    "runs it, as `serve` does; the others are re-planned by their policy from each window's loads "
    "(`serve --replan-interval` re-sizes only provisioned concurrency, from rolling rates).",
)
@click.option("--no-plots", is_flag=True, help="Skip the plots (faster on whole models).")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False, path_type=Path))
def simulate(
    trace_path: Path | None,
    loads_path: Path | None,
    model_spec: str | None,
    policies: str,
    plan_path: Path | None,
    account_concurrency: int,
    max_function_memory_mb: int,
    api_price_text: str | None,
    arrivals_path: Path | None,
    arrival: str,
    rate: float | None,
    duration: float,
    prompt_tokens: int,
    output_tokens: int,
    seed: int,
    resample_experts: bool,
    max_batch: int,
    prefill_chunk: int | None,
    context_tokens: int,
    expert_dtype: str,
    gpu_dtype: str,
    instances_path: Path | None,
    speculate: int,
    draft_acceptance_text: str | None,
    no_predictors: bool,
    prewarm_evals: tuple[str, ...],
    replan_s: float | None,
    no_plots: bool,
    output: Path,
) -> None:
    """Simulate each policy on the same requests over every MoE layer of the model; write
    report.md, results.csv and plots to OUTPUT."""
    from moeless.contracts.plan import load_plan
    from moeless.planning.quotas import AccountQuotas, require_quotas
    from moeless.simulation.inputs import deployment_for, replay_for, shape_and_routing
    from moeless.simulation.policies import POLICIES
    from moeless.simulation.study import run_study

    names = [p.strip() for p in policies.split(",") if p.strip()]
    if unknown := [name for name in names if name not in POLICIES]:
        raise click.BadParameter(
            f"unknown policy {unknown[0]!r}; choose from {', '.join(POLICIES)}", param_hint="--policies"
        )
    given = load_plan(plan_path) if plan_path else None
    quotas = AccountQuotas(account_concurrency, max_function_memory_mb)
    recorded = (given.params.get("deployment") or {}) if given is not None else {}
    if given is not None:
        require_quotas(given, quotas)  # as Lambda would refuse it: before anything is simulated
        names = ["static", "hybrid", given.policy]
        expert_dtype, max_batch, context_tokens, prefill_chunk, speculate = _SizedFor.of(
            recorded, expert_dtype, max_batch, context_tokens, prefill_chunk, speculate
        )
    elif speculate == 0 and draft_acceptance_text is not None:
        raise click.UsageError("--draft-acceptance applies only with --speculate K above 0")
    shape, routing = shape_and_routing(trace_path, loads_path, model_spec, resample_experts, seed)
    if given is not None:
        _check_plan_model(recorded, shape.name)
    acceptance = _acceptance(draft_acceptance_text, shape.name, recorded.get("draft_acceptance"))
    if speculate and acceptance is None:
        raise click.UsageError(f"--speculate {speculate} needs --draft-acceptance: how many drafts are kept")
    replay, source = replay_for(
        routing, arrivals_path, rate, arrival, duration, prompt_tokens, output_tokens, seed
    )
    chosen = deployment_for(
        shape,
        expert_dtype,
        gpu_dtype,
        max_batch,
        context_tokens,
        instances_path,
        prefill_chunk,
        speculate,
        acceptance,
    )
    deployment = replace(chosen, account_concurrency=quotas.concurrency)
    describe = [f"- requests: {len(replay)} ({source}, {duration:g} s, seed {seed})"]
    if given is not None:
        describe.append(f"- {given.policy} replays the plan {plan_path} as it is")
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
        plans={given.policy: given} if given is not None else None,
        api_price=api_price(api_price_text, shape.name),
    )
    click.echo((output / "report.md").read_text())
    if plots:
        click.echo("plots: " + ", ".join(str(p) for p in plots))


class _SizedFor(NamedTuple):
    """What a sized plan's functions and concurrency were sized for (``params.deployment``)."""

    expert_dtype: str
    max_batch: int
    context_tokens: int
    prefill_chunk: int | None
    speculate: int

    @classmethod
    def of(
        cls,
        recorded: dict,
        expert_dtype: str,
        max_batch: int,
        context_tokens: int,
        prefill_chunk: int | None,
        speculate: int,
    ) -> _SizedFor:
        """The plan's recorded values win over the options left at their defaults; an option given
        that contradicts them is an error."""
        from click.core import ParameterSource

        context = click.get_current_context()
        given = {"expert_dtype": expert_dtype, "max_batch": max_batch, "context_tokens": context_tokens,
                 "prefill_chunk": prefill_chunk, "speculate": speculate}  # fmt: skip
        chosen = {}
        for key, value in given.items():
            planned = recorded.get(key, value)
            if context.get_parameter_source(key) is not ParameterSource.DEFAULT and value != planned:
                raise click.UsageError(f"the plan was sized for {key} {planned}, not {value}")
            chosen[key] = planned
        chunk = chosen["prefill_chunk"]
        return cls(
            str(chosen["expert_dtype"]),
            int(chosen["max_batch"] or 0),
            int(chosen["context_tokens"] or 0),
            int(chunk) if chunk else None,
            int(chosen["speculate"] or 0),
        )


def _acceptance(text: str | None, model: str, recorded: dict | None) -> Any:
    """The drafter's acceptance: ``--draft-acceptance`` for ``model``, or what a replayed plan was
    sized with (``recorded``), which a given one must not contradict."""
    from moeless.simulation.speculation import Acceptance

    acceptance = draft_acceptance(text, model)
    if not recorded:
        return acceptance
    planned = Acceptance.from_json(recorded)
    if acceptance is not None and acceptance.rates != planned.rates:
        raise click.UsageError(
            f"the plan was sized for a draft acceptance of {list(planned.rates)}, "
            f"not {list(acceptance.rates)}"
        )
    return planned


def _check_plan_model(recorded: dict, model: str) -> None:
    planned = recorded.get("model")
    if planned and planned != model:
        raise click.UsageError(
            f"the plan was sized for {planned}, but the routing is {model}'s: pass --model"
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
