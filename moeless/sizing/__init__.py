"""Sizing a plan for a latency SLO: the search space and its defaults, the candidate structures,
their families of warmth, the simulator judging them, the choice, and what the plan says of it
(docs/planner.md, "Sizing provisioned concurrency for an SLO")."""

from moeless.sizing.choice import Sizing, SloUnreachable, choose
from moeless.sizing.family import FrontierPoint
from moeless.sizing.optimiser import size_for_slo, size_for_slos
from moeless.sizing.settings import DEFAULT_SEARCH, SearchSpace, load_search
from moeless.sizing.slo import Slo
from moeless.sizing.tiers import lambda_floor_ms

__all__ = [
    "DEFAULT_SEARCH",
    "FrontierPoint",
    "SearchSpace",
    "Sizing",
    "Slo",
    "SloUnreachable",
    "choose",
    "lambda_floor_ms",
    "load_search",
    "size_for_slo",
    "size_for_slos",
]
