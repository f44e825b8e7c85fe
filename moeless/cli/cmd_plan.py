"""``moeless plan`` and ``moeless apply-plan``."""

from __future__ import annotations

from pathlib import Path

import click

from moeless.cli.options import model_option
from moeless.contracts.environment import ALIAS
from moeless.contracts.plan import Placement, Policy


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
    output: Path,
) -> None:
    """Plan replicas, placement, memory and provisioned concurrency from expert loads."""
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
