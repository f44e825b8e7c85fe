"""The simulator's plots: the series they draw and the files they write."""

from __future__ import annotations

import pytest

from moeless.simulation.plots import concurrency_over_time, load_cv_over_time, write_plots
from moeless.simulation.simulator import PolicyResult


def test_plot_series_and_files(tmp_path):
    result = PolicyResult("p", duration_s=20.0, requests=1, request_latency_ms=[5.0], usd={"gpu": 1.0})
    result.busy = [(0.0, 5.0), (2.5, 7.5)]  # 10 instance-seconds in the first 10 s bin
    result.pieces = [(1.0, "a", 6), (2.0, "b", 2), (15.0, "a", 4), (16.0, "b", 4)]
    times, busy = concurrency_over_time(result, 10.0)
    assert list(times[:2]) == [0.0, 10.0] and busy[0] == pytest.approx(1.0) and busy[1] == 0
    _, cv = load_cv_over_time(result, 10.0)
    assert cv[0] == pytest.approx(0.5) and cv[1] == pytest.approx(0.0)
    names = [p.name for p in write_plots([result], tmp_path)]
    assert names == ["latency_cdf.png", "cost_breakdown.png", "load_cv.png", "concurrency.png"]
    assert all((tmp_path / n).stat().st_size > 1000 for n in names)


def test_the_frontier_keeps_the_plans_none_beats_on_both_cost_and_latency():
    """A plan is on the frontier when no other is both cheaper and faster; a run that left
    requests unfinished has a p99 over the few it finished (here 0 ms), so it is left off."""
    from moeless.sizing import FrontierPoint
    from moeless.sizing.frontier import pareto

    def point(tpot_ms: float, usd: float, completed: int = 4) -> FrontierPoint:
        summary = {"tpot_ms_p99": tpot_ms, "usd_per_1k_requests": usd, "completed": completed, "requests": 4}
        return FrontierPoint(None, 0.0, plan=None, summary=summary)  # type: ignore[arg-type]

    fast, dear_slow, middle, cheap = point(10, 9), point(30, 9.5), point(20, 5), point(40, 1)
    unfinished, dearer_tie = point(0, 0.5, completed=1), point(40, 2)
    assert pareto([cheap, dear_slow, unfinished, middle, fast, dearer_tie]) == [fast, middle, cheap]
