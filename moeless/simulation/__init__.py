"""Replaying traffic through a plan: the event simulator, the study that compares policies,
and its plots."""

from moeless.simulation.simulator import (
    Request,
    Simulator,
    arrivals,
    requests_from_trace,
    sample_requests,
    simulate_policy,
)
from moeless.simulation.study import run_study

__all__ = [
    "Request",
    "Simulator",
    "arrivals",
    "requests_from_trace",
    "run_study",
    "sample_requests",
    "simulate_policy",
]
