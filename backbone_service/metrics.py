"""``GET /metrics``: the serving stats in Prometheus' text format (prometheus_client)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from moeless.serving.backbone import Backbone

# counter name in ServingStats -> (metric, help)
EXPERT_COUNTERS = {
    "invokes": ("moeless_expert_invokes", "Expert function invocations sent"),
    "retries": ("moeless_expert_retries", "Expert invocations retried on another replica"),
    "fallbacks": ("moeless_expert_fallbacks", "Expert calls served in-process after every invoke failed"),
    "cold_starts": ("moeless_expert_cold_starts", "Invocations that reported a cold start (init_ms > 0)"),
    "throttles": ("moeless_expert_throttles", "Invocations refused with 429 TooManyRequestsException"),
    "invoke_errors": (
        "moeless_expert_invoke_errors",
        "Invocations that failed (function error, timeout, bad reply)",
    ),
}


def _histogram(metric: HistogramMetricFamily, labels: list[str], snapshot: dict[str, Any]) -> None:
    buckets = [(str(bound), count) for bound, count in snapshot["buckets"]] + [("+Inf", snapshot["count"])]
    metric.add_metric(labels, buckets, snapshot["sum"])


class _ServingCollector:
    def __init__(self, backbone: Backbone) -> None:
        self.backbone = backbone

    def collect(self) -> Iterator[Metric]:
        snapshot = self.backbone.stats.snapshot()
        counters: dict[str, float] = snapshot["counters"]  # type: ignore[assignment]
        requests = CounterMetricFamily(
            "moeless_requests", "Completion requests by outcome", labels=["outcome"]
        )
        for outcome in ("completed", "failed", "rejected", "invalid", "cancelled"):
            requests.add_metric([outcome], counters.get(f"requests_{outcome}", 0))
        yield requests
        tokens = CounterMetricFamily("moeless_tokens", "Tokens processed", labels=["kind"])
        for kind in ("prompt", "completion"):
            tokens.add_metric([kind], counters.get(f"{kind}_tokens", 0))
        yield tokens
        for key, (name, help_text) in EXPERT_COUNTERS.items():
            yield CounterMetricFamily(name, help_text, value=counters.get(key, 0))
        yield from _speculation(counters)
        dispatch = HistogramMetricFamily(
            "moeless_layer_dispatch_seconds",
            "Time to run one MoE layer's experts (all sequences of a step)",
            labels=["layer"],
        )
        layers: dict[Any, Any] = snapshot["dispatch"]  # type: ignore[assignment]
        for layer, hist in layers.items():
            _histogram(dispatch, [str(layer)], hist)
        yield dispatch
        latency = HistogramMetricFamily("moeless_request_seconds", "Completion request latency")
        _histogram(latency, [], snapshot["request_latency"])  # type: ignore[arg-type]
        yield latency
        replanner = self.backbone.replanner
        yield CounterMetricFamily(
            "moeless_replan_changes",
            "Provisioned-concurrency changes applied by re-planning",
            value=len(replanner.applied) if replanner else 0,
        )
        active, waiting = self.backbone.engine.load()
        load = GaugeMetricFamily("moeless_sequences", "Sequences in the engine", labels=["state"])
        load.add_metric(["active"], active)
        load.add_metric(["waiting"], waiting)
        yield load


def _speculation(counters: dict[str, float]) -> Iterator[Metric]:
    """Decode forwards, the sequences they advanced and the tokens they generated (tokens over
    sequences: tokens per sequence per forward, above 1 with speculation), and the drafter's
    acceptance per draft position."""
    yield CounterMetricFamily(
        "moeless_decode_forwards", "Batched decode forwards (each verifies its sequences' drafts)",
        value=counters.get("decode_forwards", 0),
    )  # fmt: skip
    yield CounterMetricFamily(
        "moeless_decode_verifications",
        "Sequences the decode forwards advanced, one per sequence per forward",
        value=counters.get("decode_verifications", 0),
    )
    yield CounterMetricFamily(
        "moeless_decode_tokens",
        "Tokens the decode forwards generated",
        value=counters.get("decode_tokens", 0),
    )
    drafts = CounterMetricFamily("moeless_draft_tokens", "Drafted tokens by outcome", labels=["outcome"])
    for outcome in ("proposed", "accepted"):
        drafts.add_metric([outcome], counters.get(f"draft_tokens_{outcome}", 0))
    yield drafts
    positions = CounterMetricFamily(
        "moeless_draft_position",
        "Per draft position: verifications with room for a draft there after one at the position "
        "before (room), those carrying one (carried), drafts verified with every earlier one accepted "
        "(tried), and kept (accepted)",
        labels=["position", "outcome"],
    )
    for key, value in sorted(counters.items()):
        if key.startswith(("draft_room_", "draft_carried_", "draft_tried_", "draft_accepted_")):
            outcome, position = key.removeprefix("draft_").split("_")
            positions.add_metric([position, outcome], value)
    yield positions


def metrics_text(backbone: Backbone) -> tuple[bytes, str]:
    registry = CollectorRegistry()
    registry.register(_ServingCollector(backbone))
    return generate_latest(registry), CONTENT_TYPE_LATEST
