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
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import numpy as np

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


def balance_table() -> None:
    print("1. balancedness (mean/max worker load), mean over layers and datasets")
    print(f"{'model':<30} {'W':>2} {'S':>4} | {'static':>7} {'EPLB':>7} {'moeless':>8} | {'vs EPLB':>8}")
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
                print(
                    f"{model:<30} {workers:>2} {slots:>4} | {mean['static']:7.4f} {mean['eplb']:7.4f} "
                    f"{mean['moeless']:8.4f} | {mean['moeless'] - mean['eplb']:+8.4f}"
                )


def lpt_table() -> None:
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
    print("\n2. LPT and pack_makespan vs the optimum (CP-SAT), 4 workers")
    print(
        f"{'instances':<30} {'count':>5} | {'LPT mean':>8} {'worst':>7} {'optimal':>7} | "
        f"{'pack mean':>9} {'worst':>7} {'optimal':>7}"
    )
    for name, instances in sets.items():
        gaps: dict[str, list[float]] = {"lpt": [], "pack": []}
        for times in instances:
            times = [max(1, int(t)) for t in times]
            optimum = optimal_makespan(times, 4)
            for packer, found in (("lpt", lpt), ("pack", pack_makespan)):
                gaps[packer].append(found([float(t) for t in times], 4)[1] / optimum - 1)
        columns = " | ".join(
            f"{np.mean(g):8.2%} {max(g):7.2%} {sum(x == 0 for x in g):7d}" for g in gaps.values()
        )
        print(f"{name:<30} {len(instances):>5} | {columns}")
    for jobs, workers in ((16, 4), (256, 16)):
        times = []
        for _ in range(50):
            instance = rng.uniform(1, 100, jobs).tolist()
            started = time.perf_counter()
            pack_makespan(instance, workers)
            times.append(time.perf_counter() - started)
        print(
            f"pack_makespan, {jobs} jobs on {workers} workers: {statistics.median(times) * 1e3:.2f} ms "
            f"median, {max(times) * 1e3:.2f} ms worst of 50"
        )


def timing_table() -> None:
    rng = np.random.default_rng(0)
    loads = Loads(
        {layer: rng.zipf(1.5, 128).astype(float) for layer in range(48)},
        {"model": "allenai/OLMoE-1B-7B-0924"},
    )
    print("\n3. plan time, 48 layers x 128 experts (OLMoE-size experts), median of 5")
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
        print(f"{policy:<8} {options!s:<32} {statistics.median(times) * 1e3:8.1f} ms")


def remoe_table() -> None:
    loads = load_loads(ROUTING / "mistral_c4.json")
    print("\n4. remoe on Mixtral-8x7B routing (c4), SLO 150 ms per layer, 64 tokens per step, 10 steps/s")
    print(
        f"{'memory GB':>9} | {'resident':>8} {'MMP GB':>7} {'functions':>9} | {'$/1k req':>9} {'dual gap':>8}"
    )
    for memory in (2.0, 5.0, 10.0, 20.0, 60.0):
        plan = make_plan(
            loads,
            PlanRequest("remoe", memory_gb=memory, slo_ms=150, workload=Workload(top_k=2), model=CostModel()),
        )
        p = plan.params
        gap = (p["primal_usd_per_s"] - p["dual_usd_per_s"]) / p["primal_usd_per_s"]
        resident = sum(e.resident for e in plan.experts)
        print(
            f"{memory:9.1f} | {resident:8d} {p['mmp_gb']:7.2f} {len(plan.functions):9d} | "
            f"{plan.estimate.cost_per_1k_requests:9.4f} {gap:8.2%}"
        )


def main() -> None:
    if not ROUTING.is_dir():
        raise SystemExit(
            "../shared/data/routing is not here: this benchmark needs the real routing statistics"
        )
    balance_table()
    lpt_table()
    timing_table()
    remoe_table()


if __name__ == "__main__":
    main()
