"""Counters and latency histograms of the serving path, kept without a metrics library.

The backbone service renders them for Prometheus; tests and benchmarks read them directly.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

# seconds; an expert dispatch spans about 1 ms (warm, local) to seconds (cold, Mixtral-size)
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Histogram:
    """Cumulative-bucket histogram (Prometheus semantics: ``counts[i]`` observations <= ``buckets[i]``)."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        for i in range(bisect.bisect_left(self.buckets, value), len(self.buckets)):
            self.counts[i] += 1
        self.total += value
        self.count += 1


class ServingStats:
    """Thread-safe counters (requests, tokens, invokes, retries, fallbacks, cold starts, throttles)
    and histograms (per-layer dispatch latency, request latency)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, float] = {}
        self.dispatch: dict[int, Histogram] = {}
        self.request_latency = Histogram()

    def inc(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self.counters[name] = self.counters.get(name, 0) + amount

    def get(self, name: str) -> float:
        with self._lock:
            return self.counters.get(name, 0)

    def observe_dispatch(self, layer: int, seconds: float) -> None:
        with self._lock:
            self.dispatch.setdefault(layer, Histogram()).observe(seconds)

    def observe_request(self, seconds: float) -> None:
        with self._lock:
            self.request_latency.observe(seconds)

    def snapshot(self) -> dict[str, object]:
        """A consistent copy: counters, and per-layer dispatch (count, sum, cumulative bucket counts)."""
        with self._lock:
            return {
                "counters": dict(self.counters),
                "dispatch": {
                    layer: {
                        "count": h.count,
                        "sum": h.total,
                        "buckets": list(zip(h.buckets, h.counts, strict=True)),
                    }
                    for layer, h in sorted(self.dispatch.items())
                },
                "request_latency": {
                    "count": self.request_latency.count,
                    "sum": self.request_latency.total,
                    "buckets": list(
                        zip(self.request_latency.buckets, self.request_latency.counts, strict=True)
                    ),
                },
            }
