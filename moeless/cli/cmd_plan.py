"""``moeless plan`` and ``moeless apply-plan``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from moeless.cli.options import deployment_options, model_option, traffic_options
from moeless.contracts.environment import ALIAS
from moeless.contracts.plan import Placement, Policy

if TYPE_CHECKING:
    from moeless.simulation.sizing import FrontierPoint, Sizing


@click.command()
@click.option(
    "--loads",
    "loads_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Loads JSON (docs/design.md): per layer, tokens routed to each expert.",
)
@click.option("--policy", type=click.Choice(["static", "moeless", "remoe"]), required=True)
@click.option(
    "--workers", type=click.IntRange(1), help="Expert-parallel workers (functions hosting several experts)."
)
@click.option("--slots", type=click.IntRange(1), help="Replica slots per layer, all workers together.")
@click.option(
    "--memory-gb",
    type=click.FloatRange(0, min_open=True),
    help="moeless: GB of functions per layer; remoe: backbone memory for resident experts + MMP.",
)
@click.option(
    "--slo-ms", type=click.FloatRange(0, min_open=True), help="remoe: per-layer MoE latency bound [100]."
)
@click.option(
    "--artifacts",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The package: expert sizes and layer numbers come from its manifest.",
)
@model_option
@click.option(
    "--previous",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="moeless: the plan now running; replicas stay where they are when that costs little balance.",
)
@click.option(
    "--top-k", type=click.IntRange(1), help="Experts per token [from the loads or artifacts, else 2]."
)
@click.option(
    "--batch-tokens",
    type=click.IntRange(1),
    default=64,
    show_default=True,
    help="Tokens per layer step the plan is sized for.",
)
@click.option(
    "--steps-per-s",
    type=click.FloatRange(0, min_open=True),
    default=10.0,
    show_default=True,
    help="Layer steps per second (traffic) the costs are computed for.",
)
@click.option("--local", "local_costs", is_flag=True, help="Cost invokes as on the local host, not AWS.")
@click.option(
    "--slo-tpot-ms",
    type=click.FloatRange(0, min_open=True),
    help="Size provisioned concurrency for this p99 time per output token on the given traffic "
    "(--arrivals/--rate or --arrival), at the lowest cost, the simulator judging (docs/planner.md).",
)
@click.option(
    "--slo-ttft-ms", type=click.FloatRange(0, min_open=True), help="With --slo-tpot-ms: p99 TTFT bound too."
)
@click.option(
    "--memory-mb",
    "memory_options",
    type=click.IntRange(128, 10240),
    multiple=True,
    help="With --slo-tpot-ms: function memory sizes to choose from [the smallest that holds an "
    "expert, and one vCPU more]. Repeatable.",
)
@click.option(
    "--replica-scale",
    "replica_scales",
    type=click.IntRange(1, 64),
    multiple=True,
    help="With --slo-tpot-ms: factors on the planner's replicas to choose from [1 and 4]; more "
    "replicas split a prefill over more concurrent environments. Repeatable.",
)
@click.option(
    "--packing",
    "packings",
    type=click.IntRange(1, 64),
    multiple=True,
    help="With --slo-tpot-ms: experts of consecutive layers per function to choose from [1 and 4]; "
    "a packed function's warm environment serves layer after layer. Repeatable.",
)
@click.option(
    "--group-experts",
    "groups",
    type=click.IntRange(1, 256),
    multiple=True,
    help="With --slo-tpot-ms: co-activated experts of one layer per function to choose from [1]; "
    "a step's rows for all of them travel in one bundled invoke. Repeatable.",
)
@click.option(
    "--allow-expert-dtype",
    "allowed_dtypes",
    type=click.Choice(["fp32", "fp16", "int8"]),
    multiple=True,
    help="With --slo-tpot-ms: the optimiser may also choose experts in this dtype. fp16 and int8 "
    "change the outputs (the served tokens then differ from the unsplit model's). Repeatable.",
)
@click.option(
    "--allow-prefill-chunk",
    "allowed_chunks",
    type=click.IntRange(1),
    multiple=True,
    help="With --slo-tpot-ms: the optimiser may also choose this chunked prefill (prompt tokens per "
    "step) besides --prefill-chunk's [whole prompts]: smaller chunks lower p99 TPOT on long prompts "
    "and raise TTFT and invokes. Repeatable.",
)
@click.option(
    "--frontier",
    is_flag=True,
    help="With --slo-tpot-ms: size moeless and remoe and simulate the fleet; write every point to "
    "OUTPUT.frontier.csv and .png (cost against p99 TPOT).",
)
@click.option(
    "--replan-interval",
    "replan_s",
    type=click.FloatRange(0, min_open=True),
    help="With --slo-tpot-ms: the plan carries the forecasting re-planner, re-sizing every function "
    "this often (s) at the plan's price of a cold start; sized and replayed with it.",
)
@click.option(
    "--no-keep-warm",
    is_flag=True,
    help="With --slo-tpot-ms: keep environments warm by provisioned concurrency only, never by the "
    "backbone's pings (Lambda guarantees provisioned ones; an idle pinged one may still be reclaimed).",
)
@click.option(
    "--stall-bound/--no-stall-bound",
    default=None,
    help="With --slo-tpot-ms: also keep p99 TPOT within the bound for a full batch decoding beside a "
    "prefill chunk (whole prompts: one of --context-tokens), every environment warm; replicas, "
    "packing and memory that cannot are not chosen, and the plan says what they would have cost. "
    "For traffic whose prompts overlap decoding more than the planning traffic's "
    "[default: --stall-bound]. --no-stall-bound: size on this traffic's overlaps alone.",
)
@click.option(
    "--warm-every-level",
    "every_level",
    is_flag=True,
    help="With --slo-tpot-ms: keep warm every environment a step can use at once (provisioned, or "
    "pinged where provisioning does not pay and pings are allowed), not only the levels the traffic "
    "used: no cold start on the request path whatever the traffic, at that price.",
)
@click.option(
    "--every-level-premium",
    "every_level_premium",
    type=click.FloatRange(0),
    help="With --slo-tpot-ms: also judge each structure's plan with every level a step can use kept "
    "warm, and take it where it costs at most 1 + this times the structure's cheapest plan that "
    "meets the SLO: insurance against traffic unlike this one's, at most that much dearer on it "
    "[default: 0.1]. 0: only where it is cheapest.",
)
@click.option(
    "--uniform-levels",
    is_flag=True,
    help="With --slo-tpot-ms: also judge the brute force's plans, every function warm to one level "
    "(0 to 4, capped at the levels a step can use), so the plan never costs more than one of them "
    "that meets the SLO on this traffic; up to 4 more simulations per candidate structure. Not with "
    "--warm-every-level.",
)
@traffic_options
@deployment_options
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
def plan(
    loads_path: Path,
    policy: str,
    workers: int | None,
    slots: int | None,
    memory_gb: float | None,
    slo_ms: float | None,
    artifacts: Path | None,
    model_spec: str | None,
    previous: Path | None,
    top_k: int | None,
    batch_tokens: int,
    steps_per_s: float,
    local_costs: bool,
    slo_tpot_ms: float | None,
    slo_ttft_ms: float | None,
    memory_options: tuple[int, ...],
    replica_scales: tuple[int, ...],
    packings: tuple[int, ...],
    groups: tuple[int, ...],
    allowed_dtypes: tuple[str, ...],
    allowed_chunks: tuple[int, ...],
    frontier: bool,
    replan_s: float | None,
    no_keep_warm: bool,
    stall_bound: bool | None,
    every_level: bool,
    every_level_premium: float | None,
    uniform_levels: bool,
    output: Path,
    **traffic: Any,
) -> None:
    """Plan replicas, placement, memory and provisioned concurrency from expert loads.

    With --slo-tpot-ms: the cheapest provisioned concurrency per function that meets the SLO on
    the given traffic, as the simulator replays it over the whole model."""
    if slo_tpot_ms is not None:
        analytic = {"--workers": workers, "--slots": slots, "--memory-gb": memory_gb, "--slo-ms": slo_ms,
                    "--previous": previous, "--artifacts": artifacts}  # fmt: skip
        if given := [name for name, value in analytic.items() if value is not None]:
            raise click.UsageError(f"{', '.join(given)}: not with --slo-tpot-ms (the optimiser chooses)")
        if every_level and uniform_levels:
            raise click.UsageError(
                "--warm-every-level or --uniform-levels: the first sizes one plan per structure, "
                "the second adds to the plans priced level by level"
            )
        if every_level and every_level_premium is not None:
            raise click.UsageError(
                "--warm-every-level or --every-level-premium: the first keeps every level warm "
                "whatever it costs, the second only where it costs at most that premium"
            )
        traffic["keep_warm"] = not no_keep_warm
        traffic["replica_scales"] = list(replica_scales) or None
        traffic["packings"] = list(packings) or None
        traffic["groups"] = list(groups) or None
        traffic["expert_dtypes"] = list(dict.fromkeys([traffic["expert_dtype"], *allowed_dtypes]))
        traffic["prefill_chunks"] = list(dict.fromkeys([traffic["prefill_chunk"], *allowed_chunks]))
        traffic["replan_s"] = replan_s
        traffic["stall_bound"] = stall_bound is not False  # the default keeps the bound
        traffic["every_level"] = every_level
        traffic["uniform_levels"] = uniform_levels
        traffic["every_level_premium"] = every_level_premium
        _sized(
            policy,
            loads_path,
            model_spec,
            slo_tpot_ms,
            slo_ttft_ms,
            list(memory_options),
            frontier,
            output,
            traffic,
        )
        return
    sized_only = (
        memory_options, replica_scales, packings, groups, allowed_dtypes, allowed_chunks, frontier,
        no_keep_warm, replan_s, stall_bound is not None, every_level, uniform_levels,
        every_level_premium is not None,
    )  # fmt: skip
    if slo_ttft_ms is not None or any(sized_only):
        raise click.UsageError(
            "--slo-ttft-ms, --memory-mb, --replica-scale, --packing, --group-experts, "
            "--allow-expert-dtype, --allow-prefill-chunk, --frontier, --replan-interval, "
            "--no-keep-warm, --[no-]stall-bound, --warm-every-level, --every-level-premium and "
            "--uniform-levels "
            "go with --slo-tpot-ms"
        )
    from moeless.contracts.loads import load_loads
    from moeless.contracts.manifest import load_manifest
    from moeless.contracts.plan import load_plan
    from moeless.planning.cost_model import CostModel
    from moeless.planning.planner import PlanRequest, expert_shape, make_plan
    from moeless.planning.remoe import Workload

    loads = load_loads(loads_path)
    manifest = load_manifest(artifacts) if artifacts else None
    k = top_k or loads.top_k or (manifest.top_k if manifest else 2)
    shape, shape_source = expert_shape(loads, manifest, model=model_spec)
    request = PlanRequest(
        policy,
        workers,
        slots,
        memory_gb,
        slo_ms,
        Workload(top_k=k, batch_tokens=batch_tokens, steps_per_s=steps_per_s),
        CostModel(aws=not local_costs),
        previous=load_plan(previous) if previous else None,
    )
    result = make_plan(loads, request, manifest, shape)
    if manifest is not None:
        result.check_fits(manifest)
    result.save(output)
    estimate = result.estimate
    assert estimate is not None, "make_plan estimates every plan"
    replicas = sum(p.replicas for p in result.experts)
    on_backbone = sum(p.placement == Placement.BACKBONE for p in result.experts)
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


def _sized(
    policy: str,
    loads_path: Path,
    model_spec: str | None,
    slo_tpot_ms: float,
    slo_ttft_ms: float | None,
    memory_options: list[int],
    frontier: bool,
    output: Path,
    traffic: dict[str, Any],
) -> None:
    """``plan --slo-tpot-ms``: size the plan with the simulator in the loop; print the choice."""
    from moeless.errors import SimulationError
    from moeless.simulation.inputs import deployment_for, replay_for, shape_and_routing
    from moeless.simulation.policies import simulate_policy
    from moeless.simulation.sizing import DEFAULT_EVERY_LEVEL_PREMIUM, Slo, SloUnreachable, size_for_slo

    if policy not in ("moeless", "remoe"):
        raise click.UsageError("--slo-tpot-ms sizes the moeless or remoe policy")
    shape, routing = shape_and_routing(
        None, loads_path, model_spec, traffic["resample_experts"], traffic["seed"]
    )
    duration = traffic["duration"]
    replay, source = replay_for(
        routing,
        traffic["arrivals_path"],
        traffic["rate"],
        traffic["arrival"],
        duration,
        traffic["prompt_tokens"],
        traffic["output_tokens"],
        traffic["seed"],
    )
    deployment = deployment_for(
        shape,
        traffic["expert_dtype"],
        traffic["gpu_dtype"],
        traffic["max_batch"],
        traffic["context_tokens"],
        traffic["instances_path"],
        traffic["prefill_chunk"],
    )
    slo = Slo(slo_tpot_ms, slo_ttft_ms)
    premium = traffic["every_level_premium"]
    premium = DEFAULT_EVERY_LEVEL_PREMIUM if premium is None else premium
    click.echo(f"sizing {policy} for {slo.describe()} on {len(replay)} requests ({source}, {duration:g} s)")
    sizings, own, failure = [], None, None
    for name in ("moeless", "remoe") if frontier else (policy,):
        try:
            sizing = size_for_slo(
                name, deployment, routing, replay, duration, slo, memory_options=memory_options or None,
                replica_scales=traffic["replica_scales"], keep_warm=traffic["keep_warm"],
                replan_s=traffic["replan_s"], packings=traffic["packings"], groups=traffic["groups"],
                stall_bound=traffic["stall_bound"], every_level=traffic["every_level"],
                uniform_levels=traffic["uniform_levels"],
                every_level_premium=None if traffic["every_level"] else premium,
                expert_dtypes=traffic["expert_dtypes"], prefill_chunks=traffic["prefill_chunks"],
                seed=traffic["seed"], progress=True,
            )  # fmt: skip
        except SloUnreachable as exc:
            sizing = exc.sizing
            if name == policy:
                failure = exc
        except SimulationError as exc:
            if name == policy:
                raise
            click.echo(f"  frontier: {exc}")
            continue
        sizings.append(sizing)
        if name == policy:
            own = sizing
    if frontier:
        from moeless.simulation.frontier import write_frontier

        fleet = simulate_policy("static", deployment, routing, replay, duration, timeline=False).summary()
        for path in write_frontier(sizings, fleet, output, slo_tpot_ms):
            click.echo(f"  frontier: {path}")
    if failure is not None or own is None or own.chosen is None:
        raise failure or click.ClickException(f"{policy} could not be sized")
    chosen = own.chosen
    chosen.plan.save(output)
    summary = chosen.summary
    click.echo(f"plan: {policy} sized for {slo.describe()} -> {output}")
    click.echo(
        f"  {len(chosen.plan.functions)} functions of {chosen.memory_mb} MB, "
        f"{chosen.expert_dtype} experts, replicas x{chosen.replica_scale}, "
        f"{chosen.packing} layers' experts per function, {chosen.group} per layer, "
        f"{chosen.provisioned} provisioned environments, {chosen.keep_warm} kept warm by pings "
        f"({_warmth(chosen, own.premium_paid, premium)})"
    )
    for line in _stall_lines(own):
        click.echo(line)
    click.echo(
        f"  simulated after a quiet (nothing warm but what the plan keeps warm): "
        f"${summary['usd_per_1k_requests']:.2f} per 1k requests, p99 TPOT "
        f"{summary['tpot_ms_p99']:.1f} ms (Lambda floor {own.floor_ms:.1f}), p99 TTFT "
        f"{summary['ttft_ms_p99']:.1f} ms, cold starts {summary['cold_starts']} of "
        f"{summary['invokes']} invokes"
    )


def _warmth(chosen: FrontierPoint, paid: float | None, premium: float) -> str:
    """How the chosen point's warmth was decided, as ``plan`` states it (``paid``: what keeping
    every level warm cost over its structure's cheapest plan)."""
    if chosen.every_level and paid is not None:
        return (
            f"every level a step can use, for {paid:.3f}x the cheapest plan of its structure: "
            f"--every-level-premium {premium:g}"
        )
    if chosen.every_level:
        return "every level a step can use"
    if chosen.uniform_level is not None:
        return f"every function warm to level {chosen.uniform_level}"
    return f"cold start priced at ${chosen.usd_per_cold_start:g}"


def _stall_lines(sizing: Sizing) -> list[str]:
    """What the stall probe says of the chosen structure: under the bound, what the planning
    traffic alone would have taken instead; without it, a warning where it is over the SLO."""
    chosen, stall_ms = sizing.chosen, sizing.chosen_stall_ms
    if chosen is None or stall_ms is None:
        return []
    line = f"p99 TPOT {stall_ms:.1f} ms decoding beside a prefill, every environment warm"
    if sizing.stall_ms is not None:
        alone = sizing.unbounded
        if alone is None or alone is chosen:
            return [f"  stall bound: {line} (the planning traffic alone asks for the same plan)"]
        return [
            f"  stall bound: {line}",
            f"  without it (--no-stall-bound): replicas x{alone.replica_scale}, {alone.memory_mb} MB, "
            f"{alone.packing} layers' experts per function, ${alone.usd_per_1k:.2f} per 1k requests on "
            f"this traffic, decoding at {alone.stall_tpot_ms:.1f} ms beside a prefill; the bound costs "
            f"{chosen.usd_per_1k / alone.usd_per_1k:.2f}x here",
        ]
    if stall_ms <= sizing.slo.tpot_ms:
        return [f"  stall probe: {line}, within the SLO"]
    return [
        f"  warning: stall probe {line}, over the SLO: traffic whose prompts overlap decoding more "
        "than this traffic's will miss it whatever is kept warm; the stall bound (without "
        "--no-stall-bound) sizes replicas for it"
    ]


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
