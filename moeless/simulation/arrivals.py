"""When requests arrive and how long they are: synthetic processes, or a recorded trace.

A recorded trace is a CSV of ``timestamp_s,input_tokens,output_tokens`` (the form of the Azure
2023 LLM inference traces in ``../shared/data/arrivals/``): each request keeps its own prompt and
output length. ``rescaled`` stretches or squeezes the timestamps to another mean rate, which keeps
the trace's burst shape (its per-minute variation scales with it); ``cut`` keeps the first seconds.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moeless.errors import SimulationError

COLUMNS = ("timestamp_s", "input_tokens", "output_tokens")


@dataclass(frozen=True)
class Arrivals:
    """Requests in arrival order: ``times_s[n]`` with ``input_tokens[n]`` and ``output_tokens[n]``.

    A synthetic process has no lengths of its own: ``input_tokens`` / ``output_tokens`` then hold
    the fixed lengths given to :func:`synthetic`.
    """

    times_s: np.ndarray  # [N] float, seconds since the first request, sorted
    input_tokens: np.ndarray  # [N] int >= 1
    output_tokens: np.ndarray  # [N] int >= 1
    source: str

    def __len__(self) -> int:
        return len(self.times_s)

    @property
    def mean_rate(self) -> float:
        """Requests per second over the span (0 for fewer than two requests)."""
        span = float(self.times_s[-1] - self.times_s[0]) if len(self) > 1 else 0.0
        return (len(self) - 1) / span if span > 0 else 0.0

    def rescaled(self, rate: float) -> Arrivals:
        """The same requests with timestamps scaled so the mean rate is ``rate`` requests/s."""
        if rate <= 0:
            raise SimulationError(f"--rate must be positive, got {rate}")
        current = self.mean_rate
        if current <= 0:
            raise SimulationError(f"{self.source}: too few requests to rescale to a rate")
        return Arrivals(
            self.times_s * (current / rate),
            self.input_tokens,
            self.output_tokens,
            f"{self.source}, timestamps scaled x{current / rate:.4g} to {rate:g}/s",
        )

    def cut(self, duration_s: float) -> Arrivals:
        """Only the requests that arrive in the first ``duration_s`` seconds."""
        keep = self.times_s < duration_s
        return Arrivals(
            self.times_s[keep],
            self.input_tokens[keep],
            self.output_tokens[keep],
            f"{self.source}, first {duration_s:g} s",
        )


def read_arrivals(path: Path) -> Arrivals:
    """Read a ``timestamp_s,input_tokens,output_tokens`` CSV; a malformed line is refused by number.

    Timestamps may be in any order (they are sorted) and are shifted to start at 0. A token count
    of 0 outputs is served as one token (a request always produces its first token).
    """
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SimulationError(f"arrivals {path}: {exc}") from None
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header) != COLUMNS:
        raise SimulationError(f"arrivals {path}: line 1 must be the header {','.join(COLUMNS)}, got {header}")
    times, inputs, outputs = [], [], []
    for number, row in enumerate(reader, start=2):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 3:
            raise SimulationError(f"arrivals {path}: line {number}: expected 3 fields, got {len(row)}")
        try:
            time_s, prompt, output = float(row[0]), int(row[1]), int(row[2])
        except ValueError:
            raise SimulationError(
                f"arrivals {path}: line {number}: expected a number and two integers, got {row}"
            ) from None
        if not np.isfinite(time_s) or time_s < 0 or prompt < 1 or output < 0:
            raise SimulationError(
                f"arrivals {path}: line {number}: need timestamp_s >= 0, input_tokens >= 1, "
                f"output_tokens >= 0, got {row}"
            )
        times.append(time_s)
        inputs.append(prompt)
        outputs.append(max(1, output))
    if not times:
        raise SimulationError(f"arrivals {path}: no requests")
    order = np.argsort(times, kind="stable")
    start = min(times)
    return Arrivals(
        np.asarray(times)[order] - start,
        np.asarray(inputs, dtype=np.int64)[order],
        np.asarray(outputs, dtype=np.int64)[order],
        str(path),
    )


def synthetic(
    process: str, duration_s: float, rng: np.random.Generator, input_tokens: int, output_tokens: int
) -> Arrivals:
    """Arrival times in [0, duration) of ``poisson:RATE``, ``bursty:RATE:PEAK:PERIOD`` (on/off: half
    of each period at PEAK x RATE, the other half at the rate that keeps the mean at RATE, floored
    at 0) or ``timestamps:FILE`` (recorded times in seconds, one per line), every request with the
    given lengths."""
    times = arrival_times(process, duration_s, rng)
    return Arrivals(
        times,
        np.full(len(times), max(1, input_tokens), dtype=np.int64),
        np.full(len(times), max(1, output_tokens), dtype=np.int64),
        process,
    )


def arrival_times(process: str, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """The times alone of :func:`synthetic`'s processes."""
    kind, _, spec = process.partition(":")
    if kind == "timestamps" and spec:
        try:
            times = np.sort(np.loadtxt(spec, ndmin=1, dtype=float))
        except (OSError, ValueError) as exc:
            raise SimulationError(f"arrival timestamps {spec!r}: {exc}") from None
        times = times - times.min() if len(times) else times
        return times[times < duration_s]
    try:
        values = [float(v) for v in spec.split(":") if v]
    except ValueError:
        values = []
    if kind == "poisson" and len(values) == 1 and values[0] >= 0:
        rate = values[0]
        count = rng.poisson(rate * duration_s)
        return np.sort(rng.uniform(0, duration_s, count))
    if kind == "bursty" and len(values) == 3 and min(values) > 0:
        rate, peak, period = values
        high, low = rate * peak, max(0.0, rate * (2 - peak))
        bursts: list[float] = []
        for start in np.arange(0, duration_s, period):
            for offset, level in ((0.0, high), (period / 2, low)):
                span = min(period / 2, max(0.0, duration_s - start - offset))
                count = rng.poisson(level * span)
                bursts.extend(start + offset + rng.uniform(0, span, count))
        return np.sort(np.asarray(bursts))
    raise SimulationError(
        f"arrival process {process!r}: use poisson:RATE, bursty:RATE:PEAK:PERIOD or timestamps:FILE"
    )
