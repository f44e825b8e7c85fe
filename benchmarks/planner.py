"""How good and how fast the planner is, on the real routing statistics in ../shared/data/routing.

Usage:
    .venv/bin/python benchmarks/planner.py

1. Balancedness (mean per-worker load / max per-worker load, mean over layers and datasets) of
   static expert parallelism, DeepSeek EPLB's global policy, and moeless's scaler + placer, for
   W in {4, 8} workers and slot budgets S = E, 1.125E, 1.25E, 1.5E (rounded up to a multiple of W).
2. Makespan of plain LPT and of pack_makespan (the packer Remoe's --workers uses) against the exact
   optimum (OR-Tools CP-SAT) on random and real instances of up to 16 items on 4 workers: mean and
   worst gap, instances solved optimally; then the packer's time per call (median of random
   instances) for 16 jobs on 4 workers and 256 on 16.
3. Plan time for 48 layers x 128 experts, each policy (median of 5 runs).
4. Remoe on Mixtral-8x7B's routing (c4): backbone-resident experts, MMP buffer, cost, and the
   Lagrangian duality gap, as the backbone memory budget varies.

Writes benchmarks/results/planner.md.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import numpy as np
from common import md_header, md_row, write_result

from moeless.contracts.loads import Loads, load_loads
from moeless.planning.cost_model import CostModel
from moeless.planning.placement import balancedness, contiguous, eplb, place, replicate, worker_loads
from moeless.planning.planner import PlanRequest, make_plan
from moeless.planning.remoe import Workload, lpt, optimal_makespan, pack_makespan

ROUTING = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "routing"


def families() -> dict[str, list[Loads]]:
    groups: dict[str, list[Loads]] = {}
    for path in sorted(ROUTING.glob("*.json")):
        if "crosslayer" not in path.name:
            loads = load_loads(path)
            groups.setdefault(str(loads.meta.get("model", path.stem)), []).append(loads)
    return groups


def shown(lines: list[str]) -> list[str]:
    """``lines``, printed as they are: each table goes to the terminal when it is done."""
    print("\n".join(lines), flush=True)
    return lines


def balance_table() -> list[str]:
    lines = [
        "## 1. Balancedness",
        "",
        "Mean / max per-worker load, mean over the layers and datasets of each model; slot budget S "
        "rounded up to a multiple of W.",
        "",
        *md_header(("model", "W", "S", "static", "DeepSeek EPLB", "moeless", "moeless - EPLB")),
    ]
    for model, datasets in families().items():
        experts = datasets[0].num_experts
        for workers in (4, 8):
            budgets = sorted({math.ceil(experts * f / workers) * workers for f in (1, 1.125, 1.25, 1.5)})
            for slots in budgets:
                rows = {"static": [], "eplb": [], "moeless": []}
                for loads in datasets:
                    for load in loads.layers.values():
                        ones = np.ones(experts, dtype=np.int64)
                        rows["static"].append(
                            balancedness(worker_loads(load, ones, contiguous(experts, workers), workers))
                        )
                        counts, assignment = eplb(load, slots, workers)
                        rows["eplb"].append(balancedness(worker_loads(load, counts, assignment, workers)))
                        counts = replicate(load, slots)
                        placed = place(load, counts, workers, slots // workers)
                        rows["moeless"].append(balancedness(worker_loads(load, counts, placed, workers)))
                mean = {k: float(np.mean(v)) for k, v in rows.items()}
                figures = (f"{mean[k]:.4f}" for k in ("static", "eplb", "moeless"))
                lines.append(
                    md_row((model, workers, slots, *figures, f"{mean['moeless'] - mean['eplb']:+.4f}"))
                )
    return shown(lines)


def lpt_table() -> list[str]:
    rng = np.random.default_rng(0)
    sets = {
        "random uniform (6-16 items)": [
            rng.integers(1, 100, size=int(rng.integers(6, 17))).tolist() for _ in range(50)
        ],
        "random zipf (16 items)": [rng.zipf(1.6, size=16).clip(max=500).tolist() for _ in range(30)],
        "real routing (<=16 busiest)": [
            sorted((load / load.max() * 1000).astype(int).tolist(), reverse=True)[:16]
            for datasets in families().values()
            for loads in datasets
            for load in loads.layers.values()
        ],
    }
    lines = [
        "",
        "## 2. LPT and pack_makespan against the optimum (CP-SAT), 4 workers",
        "",
        "Gap of the makespan over the optimum; optimal: instances solved optimally.",
        "",
        *md_header(
            ("instances", "count", "LPT mean gap", "worst", "optimal", "pack mean gap", "worst", "optimal")
        ),
    ]
    for name, instances in sets.items():
        gaps: dict[str, list[float]] = {"lpt": [], "pack": []}
        for times in instances:
            times = [max(1, int(t)) for t in times]
            optimum = optimal_makespan(times, 4)
            for packer, found in (("lpt", lpt), ("pack", pack_makespan)):
                gaps[packer].append(found([float(t) for t in times], 4)[1] / optimum - 1)
        cells = [(f"{np.mean(g):.2%}", f"{max(g):.2%}", sum(x == 0 for x in g)) for g in gaps.values()]
        lines.append(md_row((name, len(instances), *cells[0], *cells[1])))
    lines.append("")
    for jobs, workers in ((16, 4), (256, 16)):
        times = []
        for _ in range(50):
            instance = rng.uniform(1, 100, jobs).tolist()
            started = time.perf_counter()
            pack_makespan(instance, workers)
            times.append(time.perf_counter() - started)
        lines.append(
            f"- pack_makespan, {jobs} jobs on {workers} workers: {statistics.median(times) * 1e3:.2f} ms "
            f"median, {max(times) * 1e3:.2f} ms worst of 50"
        )
    return shown(lines)


def timing_table() -> list[str]:
    rng = np.random.default_rng(0)
    loads = Loads(
        {layer: rng.zipf(1.5, 128).astype(float) for layer in range(48)},
        {"model": "allenai/OLMoE-1B-7B-0924"},
    )
    lines = [
        "",
        "## 3. Plan time, 48 layers x 128 experts (OLMoE-size experts), median of 5",
        "",
        *md_header(("policy", "options", "ms"), "llr"),
    ]
    for policy, options in (
        ("static", {"workers": 8}),
        ("moeless", {"workers": 8, "slots": 160}),
        ("moeless", {}),
        ("remoe", {}),
        ("remoe", {"workers": 8}),
    ):
        times = []
        for _ in range(5):
            started = time.perf_counter()
            make_plan(loads, PlanRequest(policy, workload=Workload(top_k=8), **options))
            times.append(time.perf_counter() - started)
        lines.append(md_row((policy, f"`{options}`", f"{statistics.median(times) * 1e3:.1f}")))
    return shown(lines)


def remoe_table() -> list[str]:
    loads = load_loads(ROUTING / "mistral_c4.json")
    lines = [
        "",
        "## 4. Remoe on Mixtral-8x7B's routing (c4), SLO 150 ms per layer, 64 tokens per step, 10 steps/s",
        "",
        *md_header(("memory GB", "resident experts", "MMP GB", "functions", "$ per 1k requests", "dual gap")),
    ]
    for memory in (2.0, 5.0, 10.0, 20.0, 60.0):
        plan = make_plan(
            loads,
            PlanRequest("remoe", memory_gb=memory, slo_ms=150, workload=Workload(top_k=2), model=CostModel()),
        )
        p = plan.params
        gap = (p["primal_usd_per_s"] - p["dual_usd_per_s"]) / p["primal_usd_per_s"]
        resident = sum(e.resident for e in plan.experts)
        usd, mmp = plan.estimate.cost_per_1k_requests, p["mmp_gb"]
        cells = (f"{memory:.1f}", resident, f"{mmp:.2f}", len(plan.functions), f"{usd:.4f}", f"{gap:.2%}")
        lines.append(md_row(cells))
    return shown(lines)


def main() -> None:
    if not ROUTING.is_dir():
        raise SystemExit(
            "../shared/data/routing is not here: this benchmark needs the real routing statistics"
        )
    lines = balance_table() + lpt_table() + timing_table() + remoe_table()
    write_result("planner", "placement balance, packing and plan time on real routing statistics", lines)


if __name__ == "__main__":
    main()
