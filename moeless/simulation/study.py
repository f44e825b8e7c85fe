"""One simulation study: every policy on the same requests, written out as report.md, results.csv
and plots. Shared by ``moeless simulate`` and ``moeless demo``."""

from __future__ import annotations

from pathlib import Path

from moeless.contracts.loads import Loads
from moeless.simulation.simulator import PolicyResult, PrewarmModel, Request, simulate_policy


def run_study(
    loads: Loads,
    top_k: int,
    replay: list[Request],
    policies: list[str],
    duration_s: float,
    out_dir: Path,
    describe: list[str],
    workers: int = 4,
    hidden: int | None = None,
    intermediate: int | None = None,
    replan_s: float | None = None,
    predictors: bool = True,
    progress: bool = True,
    prewarm: dict[str, PrewarmModel] | None = None,
) -> tuple[list[PolicyResult], list[Path]]:
    """Simulate ``policies`` on ``replay``; returns the results and the plot files written.

    Args:
        describe: report header lines saying where the requests came from.
        prewarm: policy -> its predictor's measured pre-warming model (default ``PREDICTORS``).
    """
    from moeless.planning.cost_model import CostModel
    from moeless.planning.planner import expert_shape
    from moeless.simulation.plots import write_plots
    from moeless.simulation.simulator import write_report

    shape, source = expert_shape(loads, None, hidden, intermediate)
    model = CostModel()
    results = [
        simulate_policy(
            name,
            loads,
            top_k,
            shape,
            workers,
            replay,
            duration_s,
            model,
            progress,
            replan_s,
            predictors,
            prewarm,
        )
        for name in policies
    ]
    header = [
        *describe,
        f"- experts: {loads.num_experts} per layer, top-{top_k}, "
        f"{shape.hidden} x {shape.intermediate} ({source})",
        f"- policies: {', '.join(policies)}; workers {workers}; re-planning "
        + (f"every {replan_s:.0f} s" if replan_s else "off")
        + ("; moeless and remoe pre-warm from their predictors" if predictors else "; predictors off"),
        *(
            f"- {name} pre-warms {m.lead}-ahead at a measured accuracy of {m.hit_rate:.3f}"
            for name, m in (prewarm or {}).items()
            if predictors
        ),
    ]
    write_report(results, out_dir, header, model.sources())
    return results, write_plots(results, out_dir, bin_s=max(1.0, duration_s / 30))
