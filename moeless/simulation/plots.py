"""The simulator's plots: latency CDF, cost breakdown, load balance over time, concurrency over time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moeless.simulation.simulator import PolicyResult


def _bins(duration_s: float, bin_s: float) -> np.ndarray:
    return np.arange(0.0, max(duration_s, bin_s) + bin_s, bin_s)


def load_cv_over_time(result: PolicyResult, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Per time bin: CV of tokens per replica, over every replica the policy used."""
    edges = _bins(result.duration_s, bin_s)
    replicas = sorted({replica for _, replica, _ in result.pieces})
    index = {replica: i for i, replica in enumerate(replicas)}
    tokens = np.zeros((len(edges) - 1, max(len(replicas), 1)))
    for time_s, replica, count in result.pieces:
        b = min(int(time_s // bin_s), len(edges) - 2)
        tokens[b, index[replica]] += count
    means = tokens.mean(axis=1)
    cv = np.divide(tokens.std(axis=1), means, out=np.zeros_like(means), where=means > 0)
    return edges[:-1], cv


def concurrency_over_time(result: PolicyResult, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Per time bin: mean number of busy instances (or workers)."""
    edges = _bins(result.duration_s, bin_s)
    busy = np.zeros(len(edges) - 1)
    for start, end in result.busy:
        first, last = int(start // bin_s), int(end // bin_s)
        for b in range(first, min(last, len(busy) - 1) + 1):
            overlap = min(end, edges[b + 1]) - max(start, edges[b])
            if overlap > 0:
                busy[b] += overlap / bin_s
    return edges[:-1], busy


def write_plots(results: list[PolicyResult], out_dir: Path, bin_s: float = 10.0) -> list[Path]:
    """latency_cdf.png, cost_breakdown.png, load_cv.png, concurrency.png in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for result in results:
        values = np.sort(np.asarray(result.request_latency_ms) / 1e3)
        if len(values):
            ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=result.policy)
    ax.set(
        xscale="log", xlabel="request latency (s)", ylabel="fraction of requests", title="Request latency CDF"
    )
    ax.legend()
    written.append(_save(fig, out / "latency_cdf.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    summaries = [r.summary() for r in results]
    components = sorted({k for s in summaries for k in s["usd_per_1k_by_component"]})
    bottom = np.zeros(len(summaries))
    for component in components:
        values = np.array([s["usd_per_1k_by_component"].get(component, 0.0) for s in summaries])
        ax.bar([s["policy"] for s in summaries], values, bottom=bottom, label=component)
        bottom += values
    ax.set(ylabel="USD per 1k requests", title="Cost by component")
    ax.legend()
    written.append(_save(fig, out / "cost_breakdown.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for result in results:
        times, cv = load_cv_over_time(result, bin_s)
        ax.plot(times, cv, label=result.policy)
    ax.set(xlabel="time (s)", ylabel="CV of tokens per replica", title=f"Load balance per {bin_s:.0f} s")
    ax.legend()
    written.append(_save(fig, out / "load_cv.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for result in results:
        times, busy = concurrency_over_time(result, bin_s)
        line = ax.plot(times, busy, label=f"{result.policy} busy")[0]
        if result.provisioned:
            ax.axhline(
                result.provisioned,
                color=line.get_color(),
                linestyle="--",
                label=f"{result.policy} provisioned",
            )
    ax.set(xlabel="time (s)", ylabel="instances", title="Provisioned vs used concurrency")
    ax.legend(fontsize="small")
    written.append(_save(fig, out / "concurrency.png"))
    return written


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
