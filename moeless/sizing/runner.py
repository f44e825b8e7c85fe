"""Simulating the candidates: one process per core where there are several.

Every simulation of a sizing replays the same traffic over the same routing; only the deployment
variant and the plan differ. The workers receive the shared part once (their initializer), and each
job sends a plan and gets back only what the choice needs: the summary, and for a probe the
demand by level.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from moeless.contracts.plan import Plan
from moeless.simulation.policies import Deployment, simulate_policy
from moeless.simulation.routing import StepRouting
from moeless.simulation.simulator import GiveUp, PrewarmModel, Request
from moeless.sizing.family import Candidate, family
from moeless.sizing.settings import DEFAULT_SEARCH, SearchSpace
from moeless.sizing.stall import stall_tpot_ms
from moeless.sizing.structures import Structure


@dataclass(frozen=True)
class Traffic:
    """What every simulation of one sizing shares."""

    policy: str
    routing: StepRouting
    replay: list[Request]
    span_s: float
    search: SearchSpace = DEFAULT_SEARCH
    prewarm: dict[str, PrewarmModel] | None = None
    seed: int = 0


@dataclass(frozen=True)
class Job:
    """One simulation: ``kind`` is ``probe`` (of ``structure``: its family is sized from the
    demand it saw, in the worker), ``point`` or ``stall``."""

    kind: str
    variant: Deployment
    plan: Plan
    give_up: GiveUp | None = None  # a point's run stops once it certainly misses the SLO
    structure: Structure | None = None

    @classmethod
    def probe(cls, structure: Structure) -> Job:
        return cls("probe", structure.variant, structure.plan, structure=structure)


Outcome = tuple[dict[str, Any], list[Candidate]] | dict[str, Any] | float

_traffic: Traffic | None = None  # a worker's shared part, set by its initializer


def _share(traffic: Traffic) -> None:
    global _traffic
    _traffic = traffic


def run_job(job: Job, traffic: Traffic | None = None) -> Outcome:
    """Simulate one job on ``traffic`` (in a worker: the one it was given at start)."""
    shared = traffic or _traffic
    assert shared is not None, "a worker starts with the sizing's traffic"
    if job.kind == "stall":
        return stall_tpot_ms(job.plan, job.variant, shared.routing)
    result = simulate_policy(
        shared.policy,
        job.variant,
        shared.routing,
        shared.replay,
        shared.span_s,
        plan=job.plan,
        prewarm=shared.prewarm,
        seed=shared.seed,
        timeline=False,
        warm_up=False,  # after a quiet (docs/planner.md, step 2)
        give_up=job.give_up,
        record_demand=job.kind == "probe",  # a point's choice reads only its summary
    )
    summary = result.summary()
    if job.kind == "probe":
        assert job.structure is not None
        return summary, family(job.structure, result.demand, shared.span_s, shared.search)
    return summary


class Runner:
    """Runs jobs in order of submission, in ``processes`` worker processes (1: in this one)."""

    def __init__(self, traffic: Traffic, pool: Executor | None) -> None:
        self.traffic, self.pool = traffic, pool

    @property
    def width(self) -> int:
        """How many jobs run at once."""
        return getattr(self.pool, "_max_workers", 1) if self.pool is not None else 1

    def as_done(self, next_job: Callable[[], tuple[Any, Job] | None]) -> Iterator[tuple[Any, Outcome]]:
        """Runs the jobs ``next_job`` hands out (with a tag each; ``None``: none more), ``width``
        at a time, and yields each (tag, outcome) as it finishes; ``next_job`` is asked again
        whenever one finishes, so it decides with every outcome so far."""
        if self.pool is None:
            while (item := next_job()) is not None:
                yield item[0], run_job(item[1], self.traffic)
            return
        running: dict[Future[Outcome], Any] = {}
        while True:
            while len(running) < self.width and (item := next_job()) is not None:
                running[self.pool.submit(run_job, item[1])] = item[0]
            if not running:
                return
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                yield running.pop(future), future.result()

    def run(self, jobs: list[Job], bar: tqdm | None = None) -> list[Outcome]:
        """The jobs' outcomes, in order (``bar`` advanced as each finishes)."""
        done = (
            (run_job(job, self.traffic) for job in jobs)
            if self.pool is None or len(jobs) < 2
            else self.pool.map(run_job, jobs)
        )
        outcomes = []
        for outcome in done:
            outcomes.append(outcome)
            if bar is not None:
                bar.update()
        return outcomes


@contextmanager
def runner(traffic: Traffic, processes: int) -> Iterator[Runner]:
    """A runner over ``processes`` worker processes (0: one per core; 1: none, this process)."""
    count = processes or os.cpu_count() or 1
    if count < 2:
        yield Runner(traffic, None)
        return
    context = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    with ProcessPoolExecutor(count, mp_context=context, initializer=_share, initargs=(traffic,)) as pool:
        yield Runner(traffic, pool)
