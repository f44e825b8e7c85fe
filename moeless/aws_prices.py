"""AWS Lambda prices and billing rules, with their source, in one place.

The local Lambda host's meter, the planner and the simulator all charge with these figures, so a
number printed anywhere in moeless traces back to the lines below. Re-check before quoting: AWS
changes prices; the date says when these were read.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

MB_PER_GB = 1024
# 1,769 MB of memory buys one full vCPU; Lambda scales CPU with memory up to 6 vCPUs at 10,240 MB.
MB_PER_VCPU = 1769
MAX_VCPUS = 6


@dataclass(frozen=True)
class LambdaPrices:
    """x86 prices in us-east-1 (USD)."""

    per_request: float = 0.20 / 1_000_000
    per_gb_second: float = 0.0000166667
    provisioned_per_gb_second: float = 0.0000041667
    provisioned_duration_per_gb_second: float = 0.0000097222
    # Duration is billed in 1 ms steps; provisioned concurrency from the time it is enabled until it
    # is disabled, rounded up to 5 minutes; for container images the init phase of an on-demand
    # cold start is billed as duration.
    duration_step_ms: int = 1
    provisioned_step_s: int = 300
    source: str = (
        "aws.amazon.com/lambda/pricing (us-east-1, x86), read 2026-11; "
        "init billing for container images: AWS Lambda docs, 'Lambda execution environment lifecycle'"
    )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


PRICES = LambdaPrices()


def billed_ms(duration_ms: float, step_ms: int = PRICES.duration_step_ms) -> int:
    """Duration as Lambda bills it: rounded up to the next ``step_ms``."""
    return math.ceil(duration_ms / step_ms) * step_ms


def gb_seconds(milliseconds: float, memory_mb: int) -> float:
    """GB-seconds of ``milliseconds`` at ``memory_mb`` (Lambda's GB is 1,024 MB)."""
    return milliseconds / 1e3 * memory_mb / MB_PER_GB


def vcpus_for_memory(memory_mb: int) -> int:
    """Whole vCPUs a function of ``memory_mb`` gets (at least 1, at most 6)."""
    return max(1, min(MAX_VCPUS, memory_mb // MB_PER_VCPU))
