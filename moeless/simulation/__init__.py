"""Replaying traffic through a plan on the whole model: arrivals, step routing, the batched
event simulator, the policies and their deployment, the study that compares them, its report
and plots."""

from moeless.simulation.arrivals import Arrivals, read_arrivals
from moeless.simulation.policies import Deployment, simulate_policy
from moeless.simulation.simulator import PolicyResult, Request, Simulator
from moeless.simulation.study import run_study

__all__ = [
    "Arrivals",
    "Deployment",
    "PolicyResult",
    "Request",
    "Simulator",
    "read_arrivals",
    "run_study",
    "simulate_policy",
]
