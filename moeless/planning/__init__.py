"""Replicas, placement, memory and provisioned concurrency: the planner, its policies, the cost
model and applying a plan through the Lambda API.

Glossary: a *logical expert* is (layer, expert) of the model; a *replica* is one copy of it that
takes an equal share of its tokens; a *slot* is room for one replica on a worker (a GPU, or a
function environment); a *function* is one Lambda function hosting one or more experts."""

from moeless.planning.cost_model import CostModel, ExpertShape
from moeless.planning.instances import Fleet, Instance, cheapest_fleet
from moeless.planning.planner import PlanRequest, make_plan
from moeless.planning.provisioning import apply_concurrency
from moeless.planning.remoe import Workload

__all__ = [
    "CostModel",
    "ExpertShape",
    "Fleet",
    "Instance",
    "PlanRequest",
    "Workload",
    "apply_concurrency",
    "cheapest_fleet",
    "make_plan",
]
