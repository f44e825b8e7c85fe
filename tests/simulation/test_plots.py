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
