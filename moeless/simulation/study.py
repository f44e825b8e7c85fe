"""One simulation study: every policy on the same requests, written out as report.md, results.csv
and plots. Shared by ``moeless simulate`` and ``moeless demo``."""

from __future__ import annotations

from pathlib import Path

from moeless.contracts.plan import Plan
from moeless.errors import SimulationError
from moeless.planning.api_prices import ApiPrice, usd_per_1k_requests
from moeless.simulation.policies import Deployment, simulate_policy
from moeless.simulation.routing import StepRouting
from moeless.simulation.simulator import PolicyResult, PrewarmModel, Request


def run_study(
    deployment: Deployment,
    routing: StepRouting,
    replay: list[Request],
    policies: list[str],
    duration_s: float,
    out_dir: Path,
    describe: list[str],
    *,
    replan_s: float | None = None,
    predictors: bool = True,
    progress: bool = True,
    prewarm: dict[str, PrewarmModel] | None = None,
    seed: int = 0,
    plots: bool = True,
    plans: dict[str, Plan] | None = None,
    api_price: ApiPrice | None = None,
) -> tuple[list[PolicyResult], list[Path]]:
    """Simulate ``policies`` on ``replay``; returns the results and the plot files written.

    A policy that cannot plan this deployment (Remoe with no memory left on the backbone, say) is
    left out of the tables and named in the report, rather than failing the study.

    Args:
        describe: report header lines saying where the requests came from.
        prewarm: policy -> its predictor's measured pre-warming model (default ``PREDICTORS``).
        plans: policy -> a plan it replays as it is (with the warm-up pass its params ask for, but
            after a quiet where it was judged so: :func:`warm_up_replayed`), rather than planning
            from the routing's loads.
        api_price: a hosted API's price for the model: the report's reference line.
    """
    from moeless.simulation.plots import write_plots
    from moeless.simulation.report import write_report

    results, skipped = [], []
    given = plans or {}
    for name in policies:
        plan = given.get(name)
        try:
            results.append(
                simulate_policy(
                    name,
                    deployment,
                    routing,
                    replay,
                    duration_s,
                    progress=progress,
                    replan_s=replan_s,
                    predictors=predictors,
                    prewarm=prewarm,
                    seed=seed,
                    timeline=plots,
                    plan=plan,
                    warm_up=plan is not None and warm_up_replayed(plan),
                )
            )
        except SimulationError as exc:
            skipped.append(f"- left out: {exc}")
    if not results:
        raise SimulationError("no policy could be simulated:\n" + "\n".join(skipped))
    header = [
        *describe,
        *deployment.describe(),
        f"- routing: {routing.describe()}",
        f"- policies: {', '.join(r.policy for r in results)}; re-planning "
        + (f"every {replan_s:.0f} s" if replan_s else "off")
        + ("; moeless and remoe pre-warm from their predictors" if predictors else "; predictors off"),
        *(
            f"- {name} pre-warms {m.lead}-ahead at a measured accuracy of {m.hit_rate:.3f}"
            for name, m in (prewarm or {}).items()
            if predictors
        ),
        *skipped,
        *([api_line(api_price, replay)] if api_price else []),
    ]
    write_report(results, out_dir, header, deployment.sources())
    if not plots:
        return results, []
    return results, write_plots(results, out_dir, bin_s=max(1.0, duration_s / 30))


def warm_up_replayed(plan: Plan) -> bool:
    """Whether a replay of ``plan`` starts from the deployment's warm-up pass: where its params ask
    for the pass, unless the replica optimiser judged it after a quiet (nothing warm but what it
    keeps warm), which its replay then does too, so a plan is judged on any trace as it was sized."""
    sizing = plan.params.get("sizing")
    after_quiet = isinstance(sizing, dict) and bool(sizing.get("judged_after_quiet"))
    return bool(plan.params.get("warm_up")) and not after_quiet


def api_line(price: ApiPrice, replay: list[Request]) -> str:
    """The reference line: what these requests would cost on a hosted API for the model."""
    usd = usd_per_1k_requests(
        price, sum(r.prompt_tokens for r in replay), sum(r.output_tokens for r in replay), len(replay)
    )
    return (
        f"- reference: a hosted API at ${price.input_usd_per_m:g} / ${price.output_usd_per_m:g} per "
        f"million input / output tokens would bill ${usd:.4f} per 1k of these requests ({price.source})"
    )
