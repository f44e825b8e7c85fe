"""Arrivals: synthetic processes, recorded timestamps, and a recorded CSV trace refused by line."""

from __future__ import annotations

import numpy as np
import pytest

from moeless.errors import SimulationError
from moeless.simulation.arrivals import arrival_times, read_arrivals


def test_arrival_processes():
    rng = np.random.default_rng(0)
    steady = arrival_times("poisson:10", 100.0, rng)
    assert 800 < len(steady) < 1200 and np.all(np.diff(steady) >= 0)
    bursty = arrival_times("bursty:10:1.8:20", 100.0, rng)
    assert 800 < len(bursty) < 1200
    first_halves = sum(1 for t in bursty if (t % 20) < 10)
    assert first_halves > 0.8 * len(bursty)
    for bad in ("uniform:3", "poisson:x", "poisson:-1", "bursty:1:2"):
        with pytest.raises(SimulationError, match="poisson:RATE"):
            arrival_times(bad, 1.0, rng)


def test_recorded_arrival_timestamps(tmp_path):
    (tmp_path / "arrivals.txt").write_text("100.5\n100.0\n107.25\n200\n")
    times = arrival_times(f"timestamps:{tmp_path / 'arrivals.txt'}", 50.0, np.random.default_rng(0))
    assert list(times) == [0.0, 0.5, 7.25]
    with pytest.raises(SimulationError, match="timestamps"):
        arrival_times(f"timestamps:{tmp_path / 'missing.txt'}", 1.0, np.random.default_rng(0))


def test_a_csv_trace_keeps_lengths_rescales_and_cuts(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("timestamp_s,input_tokens,output_tokens\n10,5,3\n12,7,0\n11,2,9\n14,4,1\n")
    trace = read_arrivals(path)
    assert trace.times_s.tolist() == [0.0, 1.0, 2.0, 4.0]
    assert trace.input_tokens.tolist() == [5, 2, 7, 4] and trace.output_tokens.tolist() == [3, 9, 1, 1]
    assert trace.mean_rate == pytest.approx(0.75)
    faster = trace.rescaled(3.0)
    assert faster.mean_rate == pytest.approx(3.0) and faster.times_s.tolist() == pytest.approx(
        [0, 0.25, 0.5, 1]
    )
    assert faster.input_tokens.tolist() == trace.input_tokens.tolist()
    assert len(faster.cut(0.5)) == 2 and "scaled" in faster.source


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("timestamp_s,input_tokens,output_tokens\n0,5,3\n1,x,3\n", "line 3"),
        ("timestamp_s,input_tokens,output_tokens\n0,5,3\n1,5\n", "line 3"),
        ("timestamp_s,input_tokens,output_tokens\n0,5,3\n\n-1,5,3\n", "line 4"),
        ("timestamp_s,input_tokens,output_tokens\n0,0,3\n", "line 2"),
        ("time,in,out\n0,5,3\n", "line 1"),
        ("timestamp_s,input_tokens,output_tokens\n", "no requests"),
    ],
)
def test_a_malformed_csv_is_refused_with_its_line_number(tmp_path, text, line):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(SimulationError, match=line):
        read_arrivals(path)
