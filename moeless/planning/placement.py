"""Replicating hot experts and placing replicas on workers so every worker carries the same load.

Conventions: ``load[e]`` is expert e's load (tokens); ``counts[e]`` its replica count; a replica
carries ``load[e] / counts[e]``; ``assignment[e]`` lists the worker of each of e's replicas.
Workers have equal slots (expert-parallel GPUs, or functions hosting several experts).

* :func:`scale_replicas` is MoEless's expert scaler: one more replica for the expert with the
  highest per-replica load, until the load is even enough or the slots are spent.
* :func:`place` is the placer: longest-processing-time-first onto the least-loaded worker with a
  free slot, then local search (moves and swaps out of the busiest worker) while the maximum drops.
* :func:`place_warm` keeps replicas on the workers they ran on in a previous plan when that costs
  little balance, and counts how many moved.
* :func:`eplb` is the reference we compare with: DeepSeek EPLB's global policy (greedy replication,
  then balanced packing), written from its published description.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from moeless.errors import PlanError

Assignment = list[list[int]]


def per_replica(load: np.ndarray, counts: np.ndarray) -> np.ndarray:
    return load / np.maximum(counts, 1)


def replicate(load: np.ndarray, slots: int) -> np.ndarray:
    """Greedy replication to exactly ``slots`` replicas (at least one per expert)."""
    experts = len(load)
    if slots < experts:
        raise PlanError(f"{slots} slots cannot hold one replica of each of the {experts} experts")
    counts = np.ones(experts, dtype=np.int64)
    heap = [(-float(load[e]), e) for e in range(experts)]
    heapq.heapify(heap)
    for _ in range(slots - experts):
        _, e = heapq.heappop(heap)
        counts[e] += 1
        heapq.heappush(heap, (-float(load[e]) / counts[e], e))
    return counts


def active_cv(load: np.ndarray, counts: np.ndarray, idle_fraction: float = 0.05) -> float:
    """CV of per-replica load over the replicas of *active* experts.

    Experts below ``idle_fraction`` of the mean expert load are left out: replicating hot experts
    cannot raise a near-idle expert's load, so counting them puts a floor under the plain CV that
    no number of replicas removes.
    """
    mean = float(load.mean())
    active = load >= idle_fraction * mean if mean > 0 else np.zeros(len(load), bool)
    if active.sum() < 2:
        return 0.0
    values = np.repeat(per_replica(load, counts)[active], counts[active])
    return float(values.std() / values.mean()) if values.mean() > 0 else 0.0


def scale_replicas(
    load: np.ndarray, max_slots: int, workers: int = 1, cv_threshold: float = 0.2, epsilon: float = 0.05
) -> np.ndarray:
    """MoEless's scaler: add replicas to the hottest expert (per replica) while it helps.

    Stops when the active-expert CV of per-replica load is under ``cv_threshold``, or when the
    hottest replica carries at most ``epsilon`` of a worker's fair share (``total / workers``):
    from there LPT placement is within ``epsilon`` of perfect balance, so more replicas cannot
    buy balance; or when ``max_slots`` are spent.
    """
    experts = len(load)
    if max_slots < experts:
        raise PlanError(f"{max_slots} slots cannot hold one replica of each of the {experts} experts")
    counts = np.ones(experts, dtype=np.int64)
    fair = float(load.sum()) / max(workers, 1)
    heap = [(-float(load[e]), e) for e in range(experts)]
    heapq.heapify(heap)
    while counts.sum() < max_slots and heap:
        hottest = -heap[0][0]
        if hottest <= epsilon * fair or active_cv(load, counts) <= cv_threshold:
            break
        _, e = heapq.heappop(heap)
        counts[e] += 1
        heapq.heappush(heap, (-float(load[e]) / counts[e], e))
    return counts


def worker_loads(load: np.ndarray, counts: np.ndarray, assignment: Assignment, workers: int) -> np.ndarray:
    totals = np.zeros(workers)
    share = per_replica(load, counts)
    for e, placed in enumerate(assignment):
        for w in placed:
            totals[w] += share[e]
    return totals


def balancedness(totals: np.ndarray) -> float:
    """Mean per-worker load / max per-worker load (1 is perfect; 1 when there is no load)."""
    peak = float(totals.max()) if len(totals) else 0.0
    return float(totals.mean()) / peak if peak > 0 else 1.0


def _lpt(load: np.ndarray, counts: np.ndarray, workers: int, capacity: int) -> Assignment:
    share = per_replica(load, counts)
    items = sorted(
        ((share[e], e) for e in range(len(load)) for _ in range(counts[e])), key=lambda t: (-t[0], t[1])
    )
    heap = [(0.0, w) for w in range(workers)]  # (load, worker) of workers with free slots
    used = [0] * workers
    assignment: Assignment = [[] for _ in range(len(load))]
    for size, e in items:
        total, w = heapq.heappop(heap)
        assignment[e].append(w)
        used[w] += 1
        if used[w] < capacity:
            heapq.heappush(heap, (total + size, w))
    return assignment


def _local_search(
    load: np.ndarray, counts: np.ndarray, assignment: Assignment, workers: int, capacity: int, rounds: int
) -> Assignment:
    """Move or swap single replicas out of the busiest worker while that lowers the maximum."""
    share = per_replica(load, counts)
    expert_of = np.array([e for e, placed in enumerate(assignment) for _ in placed])
    worker_of = np.array([w for placed in assignment for w in placed])
    size = share[expert_of]
    totals = np.bincount(worker_of, weights=size, minlength=workers)
    filled = np.bincount(worker_of, minlength=workers)
    for _ in range(rounds):
        top = int(totals.argmax())
        peak = totals[top]
        mine = np.flatnonzero(worker_of == top)
        others = np.flatnonzero(worker_of != top)
        best_gain, best = 1e-12 * max(peak, 1.0), None
        # moves to workers with a free slot
        free = np.flatnonzero(filled < capacity)
        free = free[free != top]
        if len(free) and len(mine):
            new_peak = np.maximum(peak - size[mine][:, None], totals[free][None, :] + size[mine][:, None])
            i, j = np.unravel_index(int(new_peak.argmin()), new_peak.shape)
            if peak - new_peak[i, j] > best_gain:
                best_gain, best = peak - new_peak[i, j], ("move", mine[i], free[j])
        # swaps with any replica elsewhere
        if len(mine) and len(others):
            delta = size[mine][:, None] - size[others][None, :]
            partner = totals[worker_of[others]][None, :]
            new_peak = np.maximum(peak - delta, partner + delta)
            i, j = np.unravel_index(int(new_peak.argmin()), new_peak.shape)
            if peak - new_peak[i, j] > best_gain:
                best_gain, best = peak - new_peak[i, j], ("swap", mine[i], others[j])
        if best is None:
            break
        kind, a, b = best
        if kind == "move":
            totals[top] -= size[a]
            totals[b] += size[a]
            filled[top] -= 1
            filled[b] += 1
            worker_of[a] = b
        else:
            wa, wb = worker_of[a], worker_of[b]
            totals[wa] += size[b] - size[a]
            totals[wb] += size[a] - size[b]
            worker_of[a], worker_of[b] = wb, wa
    result: Assignment = [[] for _ in range(len(load))]
    for e, w in zip(expert_of, worker_of, strict=True):
        result[int(e)].append(int(w))
    return result


def place(load: np.ndarray, counts: np.ndarray, workers: int, capacity: int | None = None) -> Assignment:
    """LPT with ``capacity`` slots per worker, refined by local search."""
    total = int(counts.sum())
    capacity = capacity or -(-total // workers)
    if capacity * workers < total:
        raise PlanError(f"{total} replicas do not fit {workers} workers x {capacity} slots")
    assignment = _lpt(load, counts, workers, capacity)
    return _local_search(load, counts, assignment, workers, capacity, rounds=4 * total)


@dataclass
class WarmPlacement:
    assignment: Assignment
    moved: int
    kept_previous: bool


def place_warm(
    load: np.ndarray,
    counts: np.ndarray,
    workers: int,
    capacity: int,
    previous: Assignment,
    tolerance: float = 0.02,
) -> WarmPlacement:
    """Prefer the previous plan's workers; accept that placement if it is within ``tolerance``
    of a fresh placement's balancedness, else take the fresh one. ``moved`` counts replicas whose
    worker is new (replicas that must start somewhere else)."""
    fresh = place(load, counts, workers, capacity)
    used = [0] * workers
    kept: Assignment = [[] for _ in range(len(load))]
    for e in range(len(load)):
        for w in (previous[e] if e < len(previous) else [])[: counts[e]]:
            if 0 <= w < workers and used[w] < capacity:
                kept[e].append(w)
                used[w] += 1
    # the remaining replicas go LPT-first onto the least loaded workers with room
    share = per_replica(load, counts)
    totals = np.zeros(workers)
    for e, placed in enumerate(kept):
        for w in placed:
            totals[w] += share[e]
    rest = sorted(
        ((share[e], e) for e in range(len(load)) for _ in range(counts[e] - len(kept[e]))), reverse=True
    )
    for size, e in rest:
        room = [w for w in range(workers) if used[w] < capacity]
        w = min(room, key=lambda w: totals[w])
        kept[e].append(w)
        used[w] += 1
        totals[w] += size
    fresh_b = balancedness(worker_loads(load, counts, fresh, workers))
    chosen, kept_previous = fresh, False
    if balancedness(worker_loads(load, counts, kept, workers)) >= fresh_b - tolerance:
        chosen, kept_previous = kept, True
    else:  # a few moves out of the busiest worker may be enough
        improved = _local_search(load, counts, kept, workers, capacity, rounds=len(rest) + workers)
        if balancedness(worker_loads(load, counts, improved, workers)) >= fresh_b - tolerance:
            chosen, kept_previous = improved, True
    return WarmPlacement(chosen, moved_replicas(previous, chosen), kept_previous)


def moved_replicas(previous: Assignment, current: Assignment) -> int:
    """Replicas placed on a worker that did not hold that expert before (multiset difference)."""
    moved = 0
    for e, placed in enumerate(current):
        before = list(previous[e]) if e < len(previous) else []
        for w in placed:
            if w in before:
                before.remove(w)
            else:
                moved += 1
    return moved


def eplb(load: np.ndarray, slots: int, workers: int) -> tuple[np.ndarray, Assignment]:
    """DeepSeek EPLB's global policy: greedy replication to ``slots``, then balanced packing
    (heaviest replica first onto the lightest worker that still has a free slot)."""
    counts = replicate(load, slots)
    return counts, _lpt(load, counts, workers, slots // workers)


def contiguous(experts: int, workers: int) -> Assignment:
    """Static expert parallelism: experts laid out in contiguous blocks, one replica each."""
    block = -(-experts // workers)
    return [[e // block] for e in range(experts)]
