"""The account's quotas in the search: a plan they cannot hold is left out before it is judged.

A structure whose plan with nothing warm needs more than the account's quotas
(:func:`~moeless.planning.quotas.quota_shortfalls`: concurrent executions, function memory) is
left out before it is probed: warmth only adds to what a plan needs (a provisioned environment
takes the place of at most one on-demand invoke, a kept-warm one is held besides), so no plan of
its family would fit. A candidate of a structure that fits is left out before it is simulated
where its warmth needs more. Each one left out keeps its shortfalls: the plan says how many were
left out for which quota, and where none fits, the refusal names the smallest increase that admits
one (docs/planner.md, "Account quotas").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from moeless.contracts.plan import Plan
from moeless.planning.quotas import AccountQuotas, Shortfall, quota_shortfalls, refuse

T = TypeVar("T")
LeftOut = tuple[Shortfall, ...]  # what one plan left out needs more of


def fitting(
    items: Sequence[T],
    plan_of: Callable[[T], Plan],
    quotas: AccountQuotas,
    invokes_of: Callable[[T], Mapping[int, Mapping[str, int]]] | None = None,
) -> tuple[list[T], list[LeftOut]]:
    """The ``items`` whose plan fits ``quotas``, and the shortfalls of each distinct plan left out
    (items sharing one plan, as candidates that come out the same do, count once).

    ``invokes_of``: an item's plan's :func:`~moeless.planning.quotas.layer_invokes`, where known
    (a structure's candidates share their structure's: on DeepSeek-V3, a tenth of a second each).
    """
    kept: list[T] = []
    checked: dict[int, LeftOut] = {}
    for item in items:
        plan = plan_of(item)
        if id(plan) not in checked:
            invokes = invokes_of(item) if invokes_of else None
            checked[id(plan)] = tuple(quota_shortfalls(plan, quotas, invokes=invokes))
        if not checked[id(plan)]:
            kept.append(item)
    return kept, [shortfalls for shortfalls in checked.values() if shortfalls]


def least_needed(left_out: Sequence[LeftOut]) -> LeftOut:
    """The shortfalls of the plan left out that needs least: the fewest quotas raised, then the
    smallest increase relative to what the account has."""
    return min(left_out, key=lambda needs: (len(needs), sum(s.more / s.have for s in needs)))


def refuse_none_fits(policy: str, left_out: Sequence[LeftOut]) -> None:
    """Raise :class:`~moeless.errors.PlanDoesNotFit`: no candidate of ``policy`` fits, with the
    smallest increase that admits one."""
    refuse(
        least_needed(left_out),
        f"any of the {len(left_out)} {policy} candidates of the search; the one that needs least",
    )
