"""``moeless plan`` and ``moeless apply-plan``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
from moeless.contracts.environment import ALIAS
from moeless.contracts.plan import Policy

# Which options apply to which way of planning: ``sized`` (with --slo-tpot-ms: the optimiser, the
# simulator judging) or ``analytic`` (without: the policy's planner and the cost model). Options
# not named here apply to both. Given where it does not apply, an option is refused, never ignored.
SIZED_ONLY = (
    "slo_ttft_ms", "search_path", "frontier", "arrivals_path", "arrival", "rate", "duration",
    "prompt_tokens", "output_tokens", "seed", "resample_experts", "max_batch", "prefill_chunk",
    "context_tokens", "expert_dtype", "gpu_dtype", "instances_path", "api_price_text", "speculate",
    "draft_acceptance_text",
)  # fmt: skip
ANALYTIC_ONLY = (
    "workers", "slots", "memory_gb", "slo_ms", "artifacts", "previous", "top_k", "batch_tokens",
    "steps_per_s", "local_costs",
)  # fmt: skip
# options that apply only beside another's value: (option, why it does not apply otherwise)
ONLY_WITH_ARRIVALS = ("rate",)
ONLY_WITHOUT_ARRIVALS = ("arrival", "prompt_tokens", "output_tokens")
POLICY_ONLY = {
    "slo_ms": (Policy.REMOE,),
    "previous": (Policy.MOELESS,),
    "slots": (Policy.MOELESS,),
    "memory_gb": (Policy.MOELESS, Policy.REMOE),
}


class OptionsRefused(click.ClickException):
    """Options given where they do not apply: a usage error (exit 2), said in one line."""

    exit_code = 2


def _print_search(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from moeless.sizing import DEFAULT_SEARCH

    click.echo(DEFAULT_SEARCH.to_json())
    ctx.exit()


def _given(ctx: click.Context, name: str) -> bool:
    """Whether the user set ``name`` (on the command line or in the environment), not its default."""
    source = ctx.get_parameter_source(name)
    return source not in (None, click.core.ParameterSource.DEFAULT)


def _flag(ctx: click.Context, name: str) -> str:
    param = next(p for p in ctx.command.params if p.name == name)
    return "/".join(param.opts) if isinstance(param, click.Option) else name


def refuse_what_does_not_apply(ctx: click.Context, params: dict[str, Any]) -> None:
    """Refuse (:class:`OptionsRefused`) naming each option given where it does not apply, and why."""
    sized = params["slo_tpot_ms"] is not None
    wrong = []
    for name in SIZED_ONLY if not sized else ANALYTIC_ONLY:
        if _given(ctx, name):
            wrong.append(
                f"{_flag(ctx, name)} " + ("needs --slo-tpot-ms" if not sized else "not with --slo-tpot-ms")
            )
    if sized:
        for name in ONLY_WITH_ARRIVALS:
            if _given(ctx, name) and params["arrivals_path"] is None:
                wrong.append(f"{_flag(ctx, name)} rescales --arrivals, which is not given")
        for name in ONLY_WITHOUT_ARRIVALS:
            if _given(ctx, name) and params["arrivals_path"] is not None:
                wrong.append(f"{_flag(ctx, name)} not with --arrivals (the trace sets it)")
        if params["speculate"] and params["draft_acceptance_text"] is None:
            wrong.append(
                f"--speculate {params['speculate']} needs --draft-acceptance (how many drafts are kept)"
            )
        if params["policy"] not in ("moeless", "remoe"):
            wrong.append(
                f"--policy {params['policy']} with --slo-tpot-ms (the optimiser sizes moeless or remoe)"
            )
    else:
        for name, policies in POLICY_ONLY.items():
            if _given(ctx, name) and params["policy"] not in policies:
                wrong.append(f"{_flag(ctx, name)} applies to --policy {'/'.join(policies)} only")
    if wrong:
        raise OptionsRefused("; ".join(wrong))


class _TerseOption(click.Option):
    """An option whose help gives its default in its own words and leaves the range to the error
    a wrong value gets: ``plan --help`` fits one screen."""

    def get_help_extra(self, ctx: click.Context) -> Any:
        return {key: value for key, value in super().get_help_extra(ctx).items() if key == "required"}


class _Command(click.Command):
    """``plan``, its options terse in its help (:class:`_TerseOption`)."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        for param in params:
            if type(param) is click.Option:
                param.__class__ = _TerseOption
        return params


@click.command(cls=_Command)
@click.option(
    "--loads",
    "loads_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Per-expert token counts (JSON).",
)
@click.option(
    "--policy",
    type=click.Choice([p.value for p in Policy]),
    required=True,
    metavar="NAME",
    help="static, moeless or remoe.",
)
@model_option
@click.option(
    "--slo-tpot-ms",
    type=click.FloatRange(0, min_open=True),
    metavar="MS",
    help="Size for this p99 TPOT on the traffic.",
)
@click.option(
    "--slo-ttft-ms", type=click.FloatRange(0, min_open=True), metavar="MS", help="And this p99 TTFT."
)
@account_concurrency_option
@max_function_memory_option
@api_price_option
@traffic_options
@deployment_options
@speculation_options
@click.option(
    "--search",
    "search_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The optimiser's search space (JSON).",
)
@click.option(
    "--print-search",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_search,
    help="Print the default --search file; exit.",
)
@click.option("--frontier", is_flag=True, help="Also OUTPUT.frontier.csv/.png.")
@click.option(
    "--artifacts",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="No SLO: sizes from this package.",
)
@click.option("--workers", type=click.IntRange(1), metavar="W", help="No SLO: expert-parallel workers.")
@click.option("--slots", type=click.IntRange(1), metavar="S", help="moeless: replica slots per layer.")
@click.option(
    "--memory-gb",
    type=click.FloatRange(0, min_open=True),
    metavar="GB",
    help="moeless: GB per layer; remoe: GPU GB.",
)
@click.option(
    "--slo-ms", type=click.FloatRange(0, min_open=True), metavar="MS", help="remoe: MoE-layer bound [100]."
)
@click.option(
    "--previous",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="moeless: the running plan, kept.",
)
@click.option("--top-k", type=click.IntRange(1), metavar="K", help="No SLO: experts per token.")
@click.option(
    "--batch-tokens",
    type=click.IntRange(1),
    default=64,
    metavar="N",
    help="No SLO: tokens per step [64].",
)
@click.option(
    "--steps-per-s",
    type=click.FloatRange(0, min_open=True),
    default=10.0,
    metavar="R",
    help="No SLO: steps per second [10].",
)
@click.option("--local", "local_costs", is_flag=True, help="No SLO: price the local host.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.pass_context
def plan(ctx: click.Context, **params: Any) -> None:
    """Plan replicas, placement, memory and warm environments from expert loads.

    With --slo-tpot-ms: the cheapest plan that meets the SLO on the traffic (docs/planner.md).
    Without: the policy's planner, costed by the cost model."""
    refuse_what_does_not_apply(ctx, params)
    if params["slo_tpot_ms"] is not None:
        _sized(ctx, params)
    else:
        _analytic(params)


def _analytic(params: dict[str, Any]) -> None:
    """``plan`` without an SLO: the policy's planner and the cost model's estimate."""
    from moeless.contracts.loads import load_loads
    from moeless.contracts.manifest import load_manifest
    from moeless.contracts.plan import load_plan
    from moeless.planning.cost_model import CostModel
    from moeless.planning.planner import PlanRequest, expert_shape, make_plan
    from moeless.planning.quotas import AccountQuotas, require_quotas
    from moeless.planning.remoe import Workload

    policy, output, artifacts, previous = (
        params["policy"],
        params["output"],
        params["artifacts"],
        params["previous"],
    )
    loads = load_loads(params["loads_path"])
    manifest = load_manifest(artifacts) if artifacts else None
    k = params["top_k"] or loads.top_k or (manifest.top_k if manifest else 2)
    shape, shape_source = expert_shape(loads, manifest, model=params["model_spec"])
    request = PlanRequest(
        policy,
        params["workers"],
        params["slots"],
        params["memory_gb"],
        params["slo_ms"],
        Workload(top_k=k, batch_tokens=params["batch_tokens"], steps_per_s=params["steps_per_s"]),
        CostModel(aws=not params["local_costs"]),
        previous=load_plan(previous) if previous else None,
    )
    result = make_plan(loads, request, manifest, shape)
    if manifest is not None:
        result.check_fits(manifest)
    require_quotas(result, AccountQuotas(params["account_concurrency"], params["max_function_memory_mb"]))
    result.save(output)
    estimate = result.estimate
    assert estimate is not None, "make_plan estimates every plan"
    replicas = sum(p.replicas for p in result.experts)
    on_backbone = sum(p.resident for p in result.experts)
    click.echo(
        f"plan: {policy}, {len(loads.layers)} layers x {loads.num_experts} experts (top-{k}) -> {output}"
    )
    click.echo(
        f"  {replicas} replicas, {on_backbone} experts on the backbone, {len(result.functions)} functions, "
        f"{estimate.provisioned_concurrency} provisioned instances"
    )
    if "balancedness" in result.params:
        click.echo(
            f"  balancedness (mean/max worker load, mean over layers): {result.params['balancedness']:.4f}"
        )
    if "warm_start_moved_replicas" in result.params:
        click.echo(
            f"  warm start: {result.params['warm_start_moved_replicas']} replicas moved from the previous one"
        )
    if policy == Policy.REMOE:
        click.echo(
            f"  backbone memory: {result.params['resident_gb']:.2f} GB resident + "
            f"{result.params['mmp_gb']:.2f} GB MMP buffer"
        )
    click.echo(
        f"  estimate: ${estimate.cost_per_1k_requests:.4f} per 1k requests ({estimate.priced_as}), "
        f"MoE latency {estimate.makespan_ms:.1f} ms per token step, planned in "
        f"{estimate.plan_seconds * 1e3:.0f} ms"
    )
    click.echo(f"  expert size: {shape.hidden} x {shape.intermediate} ({shape_source})")


def _sized(ctx: click.Context, params: dict[str, Any]) -> None:
    """``plan --slo-tpot-ms``: size the plan with the simulator in the loop; print the choice."""
    from moeless.errors import PlanDoesNotFit, SimulationError
    from moeless.simulation.inputs import deployment_for, replay_for, shape_and_routing
    from moeless.simulation.policies import simulate_policy
    from moeless.simulation.report import ms
    from moeless.simulation.study import api_line
    from moeless.sizing import DEFAULT_SEARCH, Slo, SloUnreachable, load_search, size_for_slo
    from moeless.sizing.report import (
        alternative_lines,
        left_out_lines,
        speculation_lines,
        stall_lines,
        tier_line,
        warmth,
    )

    policy, output, frontier = params["policy"], params["output"], params["frontier"]
    search = load_search(params["search_path"]) if params["search_path"] else DEFAULT_SEARCH
    if frontier:
        search = search.with_overrides(exhaustive=True)
    # the account's quotas: given on the command line, they win over the search file's
    quotas = ("account_concurrency", "max_function_memory_mb")
    search = search.with_overrides(**{name: params[name] for name in quotas if _given(ctx, name)})
    shape, routing = shape_and_routing(
        None, params["loads_path"], params["model_spec"], params["resample_experts"], params["seed"]
    )
    duration = params["duration"]
    replay, source = replay_for(
        routing,
        params["arrivals_path"],
        params["rate"],
        params["arrival"],
        duration,
        params["prompt_tokens"],
        params["output_tokens"],
        params["seed"],
    )
    deployment = deployment_for(
        shape,
        params["expert_dtype"],
        params["gpu_dtype"],
        params["max_batch"],
        params["context_tokens"],
        params["instances_path"],
        params["prefill_chunk"],
        params["speculate"],
        draft_acceptance(params["draft_acceptance_text"], shape.name),
    )
    slo = Slo(params["slo_tpot_ms"], params["slo_ttft_ms"])
    click.echo(f"sizing {policy} for {slo.describe()} on {len(replay)} requests ({source}, {duration:g} s)")
    sizings, own, failure = [], None, None
    for name in ("moeless", "remoe") if frontier else (policy,):
        try:
            sizing = size_for_slo(
                name, deployment, routing, replay, duration, slo, search, seed=params["seed"], progress=True
            )
        except SloUnreachable as exc:
            sizing = exc.sizing
            if name == policy:
                failure = exc
        except (SimulationError, PlanDoesNotFit) as exc:
            if name == policy:
                raise
            click.echo(f"  frontier: {exc}")
            continue
        sizings.append(sizing)
        if name == policy:
            own = sizing
    if frontier:
        from moeless.sizing.frontier import write_frontier

        fleet = simulate_policy("static", deployment, routing, replay, duration, timeline=False).summary()
        for path in write_frontier(sizings, fleet, output, slo.tpot_ms):
            click.echo(f"  frontier: {path}")
    if failure is not None or own is None or own.chosen is None:
        raise failure or click.ClickException(f"{policy} could not be sized")
    chosen = own.chosen
    chosen.plan.save(output)
    summary = chosen.summary
    click.echo(f"plan: {policy} sized for {slo.describe()} -> {output}")
    click.echo(f"  {tier_line(chosen)}")
    if chosen.plan.functions:
        click.echo(
            f"  {len(chosen.plan.functions)} functions of {chosen.memory_mb} MB, "
            f"{chosen.expert_dtype} experts, replicas x{chosen.replica_scale}, "
            f"{chosen.packing} layers' experts per function, {chosen.group} per layer, "
            f"{chosen.provisioned} provisioned environments, {chosen.keep_warm} kept warm by pings "
            f"({warmth(chosen, own.premium_paid, search.every_level_premium)})"
        )
    price = api_price(params["api_price_text"], shape.name)
    reference = [f"  {api_line(price, replay).removeprefix('- ')}"] if price else []
    lines = (
        stall_lines(own) + speculation_lines(own) + alternative_lines(own) + reference + left_out_lines(own)
    )
    for line in lines:
        click.echo(line)
    click.echo(
        f"  simulated after a quiet (nothing warm but what the plan keeps warm): "
        f"${summary['usd_per_1k_requests']:.2f} per 1k requests, p99 TPOT "
        f"{ms(summary['tpot_ms_p99'])} ms (all-Lambda floor {own.floor_ms:.1f}), p99 TTFT "
        f"{ms(summary['ttft_ms_p99'])} ms, cold starts {summary['cold_starts']} of "
        f"{summary['invokes']} invokes"
    )
    click.echo(
        f"  simulated {own.simulated} plans beside the probes; {own.skipped} more skipped, their cost "
        "bound above what could be chosen"
    )


@click.command("apply-plan")
@click.argument("plan_path", metavar="PLAN", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--endpoint", metavar="URL", help="A local host's Lambda API [default: AWS].")
@click.option(
    "--alias", default=ALIAS, show_default=True, help="The alias that carries provisioned concurrency."
)
@click.option("--dry-run", is_flag=True, help="Print the changes, make none.")
def apply_plan(plan_path: Path, endpoint: str | None, alias: str, dry_run: bool) -> None:
    """Set each function's reserved and provisioned concurrency to PLAN's, changing only what differs."""
    from moeless.contracts.plan import load_plan
    from moeless.lambda_host.client import lambda_client
    from moeless.planning.provisioning import apply_changes, plan_changes

    client = lambda_client(endpoint, max_attempts=3)
    target = load_plan(plan_path)
    changes = plan_changes(client, target, alias)
    for change in changes:
        click.echo(("would change " if dry_run else "") + str(change))
    if not changes:
        click.echo(f"nothing to change: {len(target.functions)} functions already match {plan_path}")
        return
    if not dry_run:
        apply_changes(client, changes, alias)
        click.echo(f"applied {len(changes)} change(s) to {len({c.function for c in changes})} function(s)")
