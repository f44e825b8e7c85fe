"""A latency target, and the traffic it can be judged on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moeless.errors import SimulationError
from moeless.simulation.simulator import Request


@dataclass(frozen=True)
class Slo:
    """A latency target: p99 time per output token, and optionally p99 time to first token (ms)."""

    tpot_ms: float
    ttft_ms: float | None = None

    def met(self, summary: dict[str, Any]) -> bool:
        """Whether a run meets it: every request completed within both p99 bounds (a run with no
        TPOT measured, nothing completed or no second token, meets nothing)."""
        tpot, ttft = summary["tpot_ms_p99"], summary["ttft_ms_p99"]
        return (
            summary["completed"] == summary["requests"]
            and tpot is not None
            and tpot <= self.tpot_ms
            and (self.ttft_ms is None or (ttft is not None and ttft <= self.ttft_ms))
        )

    def describe(self) -> str:
        ttft = f", p99 TTFT <= {self.ttft_ms:g} ms" if self.ttft_ms is not None else ""
        return f"p99 TPOT <= {self.tpot_ms:g} ms{ttft}"


def check_judgeable(replay: list[Request], duration_s: float) -> None:
    """Refuse traffic on which no SLO can be judged: a p99 over no request, or a TPOT over no
    second token, would pass any target."""
    if not replay:
        raise SimulationError(
            f"no request arrives in the {duration_s:g} s window: it is too short for this traffic to "
            "judge an SLO on; give a longer --duration (or a higher rate)"
        )
    if all(r.output_tokens <= 1 for r in replay):
        raise SimulationError(
            f"no request in the {duration_s:g} s window decodes a second token, so no TPOT can be "
            "judged; give a longer --duration or traffic with longer outputs"
        )
