"""The warm-up pass and the pings that keep a plan's on-demand environments alive."""

from __future__ import annotations

import threading
import time
from collections import Counter

from moeless.contracts.plan import ExpertPlacement, FunctionSpec, Plan
from moeless.serving.keep_warm import KeepWarm


def plan(warm_up: bool) -> Plan:
    experts = [ExpertPlacement(0, e, function=f"f{e}") for e in range(3)]
    functions = [
        FunctionSpec("f0", [(0, 0)], provisioned_concurrency=1, keep_warm=2),
        FunctionSpec("f1", [(0, 1)], keep_warm=1),
        FunctionSpec("f2", [(0, 2)]),
    ]
    return Plan("moeless", experts, functions, params={"warm_up": warm_up, "keep_warm_ping_s": 0.05})


class Recorder:
    """A warm-up invoke that takes a while, recording how many of each function overlap."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.most_at_once: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, function: str, layer: int, expert: int) -> None:
        with self.lock:
            self.calls[function] += 1
            self.in_flight[function] += 1
            self.most_at_once[function] = max(self.most_at_once[function], self.in_flight[function])
        time.sleep(0.02)
        with self.lock:
            self.in_flight[function] -= 1


def test_a_round_pings_each_kept_function_once_per_environment_all_at_once():
    recorder = Recorder()
    keeper = KeepWarm(plan(False), recorder, max_concurrency=8)
    try:
        assert keeper.ping_round() == 3 + 1  # f0: 1 provisioned + 2 kept; f1: 1; f2: none
        assert recorder.calls == Counter({"f0": 3, "f1": 1})
        assert recorder.most_at_once["f0"] == 3  # at once, so they reach distinct environments
    finally:
        keeper.close()


def test_the_warm_up_pass_invokes_every_function_then_the_pings_repeat():
    recorder = Recorder()
    keeper = KeepWarm(plan(True), recorder).start()
    try:
        deadline = time.monotonic() + 5
        while keeper.pings < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        keeper.close()
    assert keeper.pings >= 8 and recorder.calls["f2"] == 1  # f2 only in the warm-up pass
    assert recorder.calls["f0"] >= 1 + 3 * 2


def test_a_plan_that_keeps_nothing_warm_needs_no_keeper():
    bare = Plan("moeless", [ExpertPlacement(0, 0, function="f0")], [FunctionSpec("f0", [(0, 0)])])
    keeper = KeepWarm(bare, Recorder())
    assert not keeper.needed
    keeper.close()
