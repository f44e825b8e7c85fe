"""What AWS would bill for the invocations the local host served.

Rules (see :mod:`moeless.aws_prices`): every request is charged; duration is rounded up to 1 ms
and charged per GB-s of configured memory; an on-demand cold start adds its init time to the billed
duration (container images); an invoke served by a provisioned instance is charged at the lower
provisioned-duration rate; provisioned concurrency itself is charged per GB-s configured, each
configuration period rounded up to 5 minutes, except the period of a configuration that FAILED
(its environments' init failed or overran its limit): that is charged nothing.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from moeless.aws_prices import PRICES, LambdaPrices, billed_ms, gb_seconds


@dataclass
class FunctionBill:
    """Running totals for one function."""

    memory_mb: int
    requests: int = 0
    errors: int = 0
    throttles: int = 0
    duration_ms: float = 0.0
    billed_ms: int = 0
    billed_ms_provisioned: int = 0
    cold_starts: int = 0
    init_ms: float = 0.0
    provisioned_inits: int = 0
    provisioned_seconds: float = 0.0
    provisioned_billed_seconds: float = 0.0
    # qualifier -> (provisioned concurrency, clock when set)
    open_periods: dict[str, tuple[int, float]] = field(default_factory=dict)


class BillingMeter:
    """Thread-safe meter; ``snapshot()`` gives the bill so far as plain JSON-able data.

    Args:
        prices: the price list to charge with.
        clock: seconds, monotonic (injectable for tests).
    """

    def __init__(self, prices: LambdaPrices = PRICES, clock: Callable[[], float] = time.monotonic) -> None:
        self.prices = prices
        self.clock = clock
        self._lock = threading.Lock()
        self._bills: dict[str, FunctionBill] = {}

    def register(self, function: str, memory_mb: int) -> None:
        with self._lock:
            self._bills.setdefault(function, FunctionBill(memory_mb))

    def invoke(
        self,
        function: str,
        duration_ms: float,
        init_ms: float = 0.0,
        provisioned: bool = False,
        error: bool = False,
    ) -> int:
        """Record one served invoke; returns its billed milliseconds.

        ``init_ms`` is the init time of the on-demand cold start this invoke waited for (0 when warm).
        """
        with self._lock:
            bill = self._bills[function]
            bill.requests += 1
            bill.errors += int(error)
            bill.duration_ms += duration_ms
            charged = billed_ms(duration_ms + init_ms, self.prices.duration_step_ms)
            if provisioned:
                bill.billed_ms_provisioned += charged
            else:
                bill.billed_ms += charged
            if init_ms > 0:
                bill.cold_starts += 1
                bill.init_ms += init_ms
            return charged

    def throttle(self, function: str) -> None:
        with self._lock:
            self._bills[function].throttles += 1

    def provisioned_init(self, function: str) -> None:
        """A provisioned instance finished init (off the request path; paid by the provisioned rate)."""
        with self._lock:
            self._bills[function].provisioned_inits += 1

    def set_provisioned(self, function: str, qualifier: str, concurrency: int) -> None:
        """Close the qualifier's current provisioned period (if any) and open one at ``concurrency``."""
        with self._lock:
            bill = self._bills[function]
            self._close_period(bill, qualifier, self.clock())
            if concurrency > 0:
                bill.open_periods[qualifier] = (concurrency, self.clock())

    def discard_provisioned(self, function: str, qualifier: str) -> None:
        """Drop the qualifier's open provisioned period unbilled: its configuration FAILED."""
        with self._lock:
            self._bills[function].open_periods.pop(qualifier, None)

    def _close_period(self, bill: FunctionBill, qualifier: str, now: float) -> None:
        if qualifier not in bill.open_periods:
            return
        concurrency, since = bill.open_periods.pop(qualifier)
        seconds = now - since
        step = self.prices.provisioned_step_s
        bill.provisioned_seconds += concurrency * seconds
        bill.provisioned_billed_seconds += concurrency * max(1, math.ceil(seconds / step)) * step

    def snapshot(self) -> dict[str, Any]:
        """The bill so far: per function and in total, with the prices used.

        Open provisioned periods are charged as if they closed now.
        """
        now = self.clock()
        with self._lock:
            functions = {
                name: self._summarise(self._closed_copy(bill, now)) for name, bill in self._bills.items()
            }
        totals: dict[str, Any] = {"cost_usd_by_component": {}}
        for row in functions.values():
            for key, value in row.items():
                if key == "cost_usd_by_component":
                    for part, usd in value.items():
                        totals[key][part] = totals[key].get(part, 0.0) + usd
                elif key != "memory_mb":
                    totals[key] = totals.get(key, 0) + value
        return {
            "functions": dict(sorted(functions.items())),
            "totals": totals,
            "prices": self.prices.as_dict(),
        }

    def _closed_copy(self, bill: FunctionBill, now: float) -> FunctionBill:
        copy = FunctionBill(**{k: v for k, v in asdict(bill).items() if k != "open_periods"})
        copy.open_periods = dict(bill.open_periods)
        for qualifier in list(copy.open_periods):
            self._close_period(copy, qualifier, now)
        return copy

    def _summarise(self, bill: FunctionBill) -> dict[str, Any]:
        memory = bill.memory_mb
        on_demand_gbs = gb_seconds(bill.billed_ms, memory)
        provisioned_duration_gbs = gb_seconds(bill.billed_ms_provisioned, memory)
        provisioned_gbs = bill.provisioned_billed_seconds * memory / 1024
        p = self.prices
        cost = {
            "requests": bill.requests * p.per_request,
            "duration": on_demand_gbs * p.per_gb_second,
            "provisioned_duration": provisioned_duration_gbs * p.provisioned_duration_per_gb_second,
            "provisioned_concurrency": provisioned_gbs * p.provisioned_per_gb_second,
        }
        return {
            "memory_mb": memory,
            "requests": bill.requests,
            "errors": bill.errors,
            "throttles": bill.throttles,
            "duration_ms": round(bill.duration_ms, 3),
            "billed_ms": bill.billed_ms,
            "billed_ms_provisioned": bill.billed_ms_provisioned,
            "gb_seconds": on_demand_gbs,
            "provisioned_duration_gb_seconds": provisioned_duration_gbs,
            "cold_starts": bill.cold_starts,
            "init_ms": round(bill.init_ms, 3),
            "provisioned_inits": bill.provisioned_inits,
            "provisioned_concurrency_seconds": round(bill.provisioned_seconds, 3),
            "provisioned_gb_seconds": provisioned_gbs,
            "cost_usd": sum(cost.values()),
            "cost_usd_by_component": cost,
        }


def format_bill(snapshot: dict[str, Any], max_rows: int = 20) -> str:
    """A human-readable bill: the busiest functions, then totals with the cost split by component."""
    rows = [
        (name, row)
        for name, row in snapshot["functions"].items()
        if row["requests"] or row["provisioned_gb_seconds"]
    ]
    rows.sort(key=lambda item: -item[1]["cost_usd"])
    columns = (
        f"{'MB':>6} {'requests':>9} {'cold':>5} {'thrott':>6} {'billed ms':>10} {'prov GB-s':>10} {'USD':>12}"
    )
    lines = ["bill (what AWS Lambda would charge):", f"{'function':<24} {columns}"]
    for name, row in rows[:max_rows]:
        billed = row["billed_ms"] + row["billed_ms_provisioned"]
        counts = f"{row['requests']:>9} {row['cold_starts']:>5} {row['throttles']:>6}"
        lines.append(
            f"{name:<24} {row['memory_mb']:>6} {counts} "
            f"{billed:>10} {row['provisioned_gb_seconds']:>10.1f} {row['cost_usd']:>12.8f}"
        )
    if len(rows) > max_rows:
        lines.append(f"... and {len(rows) - max_rows} more")
    total = snapshot["totals"]
    if not rows:
        lines.append("(no invocations)")
    parts = ", ".join(f"{k} {v:.8f}" for k, v in total.get("cost_usd_by_component", {}).items())
    lines.append(
        f"total: {int(total.get('requests', 0))} requests, {int(total.get('cold_starts', 0))} cold starts, "
        f"{int(total.get('throttles', 0))} throttles, USD {total.get('cost_usd', 0.0):.8f} ({parts})"
    )
    lines.append(f"prices: {snapshot['prices']['source']}")
    return "\n".join(lines)
