"""Keep a plan's warm environments alive: the warm-up pass at start and the periodic pings.

A sized plan (``moeless plan --slo-tpot-ms``) can keep a function's environments warm two ways:
provisioned concurrency (Lambda keeps them initialised, billed per GB-s) and ``keep_warm``
on-demand environments that this module keeps from idling out by invoking them every ``ping_s``
seconds, far under the idle timeout. A round pings each such function ``provisioned + keep_warm``
times at once (the provisioned environments take the first invokes, so the rest reach on-demand
ones), which is what the simulator bills (``moeless/simulation/simulator.py``). Lambda does not
promise to keep an idle environment, so pings make cold starts rare, not impossible: provisioned
concurrency is the guarantee (docs/planner.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

from moeless.contracts.environment import KEEP_WARM_PING_S
from moeless.contracts.plan import Plan


class KeepWarm:
    """Args:
    plan: the deployed plan (its functions' ``keep_warm`` and ``provisioned_concurrency``, and
        ``params["warm_up"]``).
    warm: ``warm(function, layer, expert)`` sends one warm-up invoke (blocking), e.g.
        :meth:`~moeless.serving.dispatch.LambdaDispatcher.warm`.
    ping_s: seconds between rounds (the plan's ``params["keep_warm_ping_s"]`` when it has one).
    max_concurrency: invokes in flight at once, across functions.
    """

    def __init__(
        self,
        plan: Plan,
        warm: Callable[[str, int, int], None],
        ping_s: float | None = None,
        max_concurrency: int = 32,
    ) -> None:
        self.plan = plan
        self.warm = warm
        self.ping_s = float(ping_s or plan.params.get("keep_warm_ping_s") or KEEP_WARM_PING_S)
        self.kept: dict[str, tuple[tuple[int, int], int]] = {}
        self.follow(plan)
        self.pings = 0
        self._pool = ThreadPoolExecutor(max(1, max_concurrency), thread_name_prefix="keep-warm")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, plan: Plan) -> None:
        """Keep warm what ``plan`` keeps warm from the next round on (a re-plan changed it)."""
        self.kept = {
            f.name: (f.experts[0], f.provisioned_concurrency + f.keep_warm)
            for f in plan.functions
            if f.keep_warm and f.experts
        }

    @property
    def needed(self) -> bool:
        """Whether the plan asks for a warm-up pass or keeps any environment warm."""
        return bool(self.kept) or bool(self.plan.params.get("warm_up"))

    def warm_up(self) -> int:
        """One warm-up invoke of every function (at once, bounded by the pool); returns how many."""
        jobs = [(f.name, *f.experts[0]) for f in self.plan.functions if f.experts]
        wait([self._pool.submit(self.warm, name, layer, expert) for name, layer, expert in jobs])
        return len(jobs)

    def ping_round(self) -> int:
        """Ping every kept function's environments, all of a function's at once; returns the pings."""
        futures = [
            self._pool.submit(self.warm, name, layer, expert)
            for name, ((layer, expert), count) in self.kept.items()
            for _ in range(count)
        ]
        wait(futures)
        self.pings += len(futures)
        return len(futures)

    def start(self) -> KeepWarm:
        """Run the warm-up pass (when the plan asks for one) and then a round every ``ping_s``, in
        a background thread."""

        def loop() -> None:
            if self.plan.params.get("warm_up"):
                self.warm_up()
            while not self._stop.wait(self.ping_s):
                self.ping_round()

        self._thread = threading.Thread(target=loop, name="keep-warm", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
