"""The cost-latency frontier of sized plans: a CSV of every point and a plot of cost against
p99 TPOT per policy, with the serverful fleet as one point (``moeless plan ... --frontier``)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moeless.sizing.choice import Sizing
from moeless.sizing.family import FrontierPoint


def pareto(points: Sequence[FrontierPoint]) -> list[FrontierPoint]:
    """The points no other beats on both cost and p99 TPOT, fastest first, among those that
    completed every request (a run that left requests unfinished has no p99 to speak of: its
    latency covers only the requests it finished)."""
    done = sorted(
        (p for p in points if p.finished),
        key=lambda p: (p.summary["tpot_ms_p99"], p.usd_per_1k),
    )
    front: list[FrontierPoint] = []
    for point in done:  # each point on the front is cheaper than every faster one
        if not front or point.usd_per_1k < front[-1].usd_per_1k:
            front.append(point)
    return front


def frontier_rows(sizings: list[Sizing], fleet: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every simulated point of every policy (``on_frontier``: in :func:`pareto`), then the
    fleet's run (policy ``static``)."""
    rows = []
    for sizing in sizings:
        front = {id(p) for p in pareto(sizing.points)}
        rows += [
            point.row() | {"chosen": point is sizing.chosen, "on_frontier": id(point) in front}
            for point in sizing.points
        ]
    if fleet is not None:
        rows.append(
            {
                "policy": "static",
                "memory_mb": "",
                "usd_per_cold_start": "",
                "provisioned": "",
                "usd_per_1k_requests": fleet["usd_per_1k_requests"],
                "tpot_ms_p99": "" if fleet["tpot_ms_p99"] is None else fleet["tpot_ms_p99"],
                "ttft_ms_p99": "" if fleet["ttft_ms_p99"] is None else fleet["ttft_ms_p99"],
                "cold_start_share": 0.0,
                "completed": fleet["completed"],
                "requests": fleet["requests"],
                "chosen": False,
                "on_frontier": False,
            }
        )
    return rows


def write_frontier(
    sizings: list[Sizing], fleet: dict[str, Any] | None, stem: Path, slo_tpot_ms: float
) -> list[Path]:
    """``STEM.frontier.csv`` and ``STEM.frontier.png``; returns the files written."""
    rows = frontier_rows(sizings, fleet)
    table = stem.with_suffix(".frontier.csv")
    table.parent.mkdir(parents=True, exist_ok=True)
    with table.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for sizing in sizings:
        points = [p for p in sizing.points if p.finished]
        unfinished = len(sizing.points) - len(points)
        shown = axes.plot(
            [p.summary["tpot_ms_p99"] for p in points],
            [p.usd_per_1k for p in points],
            "o",
            alpha=0.4,
            label=f"{sizing.policy}: each plan simulated"
            + (f" ({unfinished} that left requests unfinished not shown)" if unfinished else ""),
        )
        front = pareto(sizing.points)
        axes.plot(
            [p.summary["tpot_ms_p99"] for p in front],
            [p.usd_per_1k for p in front],
            "-",
            color=shown[0].get_color(),
            label=f"{sizing.policy}: frontier (none both cheaper and faster)",
        )
        over = [p for p in points if sizing.stall_bound and (p.stall_tpot_ms or 0.0) > sizing.slo.tpot_ms]
        if over:  # simulated for what the bound costs, never chosen
            axes.plot(
                [p.summary["tpot_ms_p99"] for p in over],
                [p.usd_per_1k for p in over],
                "rx",
                label=f"{sizing.policy}: over the stall bound (not chosen)",
            )
        if sizing.chosen is not None:
            axes.plot(sizing.chosen.summary["tpot_ms_p99"], sizing.chosen.usd_per_1k, "k*", markersize=14)
    if fleet is not None and fleet["tpot_ms_p99"] is not None:
        axes.plot(fleet["tpot_ms_p99"], fleet["usd_per_1k_requests"], "s", label="serverful fleet (static)")
    axes.axvline(slo_tpot_ms, color="grey", linestyle="--", label=f"SLO: p99 TPOT {slo_tpot_ms:g} ms")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("p99 TPOT, ms (planning traffic, simulated)")
    axes.set_ylabel("$ per 1k requests")
    axes.set_title("Cost against latency: each point one plan (star: chosen)")
    axes.legend(fontsize=8)
    figure.tight_layout()
    picture = stem.with_suffix(".frontier.png")
    figure.savefig(picture, dpi=110)
    plt.close(figure)
    return [table, picture]
