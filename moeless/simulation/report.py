"""A study's outputs: ``results.csv`` (one row per policy, the columns scripts read) and
``report.md`` (the same figures, the setting, and every constant with its source)."""

from __future__ import annotations

import csv
from pathlib import Path

from moeless.simulation.simulator import PolicyResult

# the output contract of results.csv (docs/simulator.md); cost components follow as usd_per_1k_<part>
COLUMNS = (
    "policy",
    "requests",
    "completed",
    "layers_simulated",
    "usd_per_1k_requests",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "request_ms_p50",
    "request_ms_p99",
    "moe_layer_ms_p50",
    "moe_layer_ms_p99",
    "cold_starts",
    "invokes",
    "throttles",
    "fallbacks",
    "steps",
    "replans",
    "prewarms",
    "one_off_usd",
    "fleet",
    "backbone",
    "tokens_per_forward",
    "usd_per_1k_decode_steps",
)
COMPONENTS = ("requests", "duration", "provisioned", "gpu")


def ms(value: float | None, digits: int = 1) -> str:
    """A latency percentile as printed: ``none`` where nothing was measured (never 0)."""
    return "none" if value is None else f"{value:.{digits}f}"


# the components' columns: Lambda's request and duration charges, provisioned concurrency, GPUs
COMPONENT_COLUMNS = {
    "requests": "usd_per_1k_lambda_requests",
    "duration": "usd_per_1k_lambda_duration",
    "provisioned": "usd_per_1k_provisioned",
    "gpu": "usd_per_1k_gpu",
}


def write_report(results: list[PolicyResult], out_dir: Path, header: list[str], sources: list[str]) -> None:
    """``report.md`` and ``results.csv`` in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r.summary() for r in results]
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, [*COLUMNS, *COMPONENT_COLUMNS.values()])
        writer.writeheader()
        for row in rows:
            parts = row["usd_per_1k_by_component"]
            writer.writerow(
                {key: row[key] for key in COLUMNS}
                | {column: parts.get(c, 0.0) for c, column in COMPONENT_COLUMNS.items()}
            )
    lines = [
        "# Simulation report",
        "",
        *header,
        "",
        "| policy | $ per 1k requests | TTFT p50 / p99 ms | TPOT p50 / p99 ms | tokens per forward | "
        "request p99 ms | MoE layer p50 / p99 ms | cold starts | invokes | on | "
        + " | ".join(f"$ {c}" for c in COMPONENTS)
        + " |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|" + "---:|" * len(COMPONENTS),
    ]
    for row in rows:
        parts = " | ".join(f"{row['usd_per_1k_by_component'].get(c, 0.0):.4f}" for c in COMPONENTS)
        done = "" if row["completed"] == row["requests"] else f" ({row['completed']}/{row['requests']} done)"
        lines.append(
            f"| {row['policy']}{done} | {row['usd_per_1k_requests']:.4f} | "
            f"{ms(row['ttft_ms_p50'], 0)} / {ms(row['ttft_ms_p99'], 0)} | {ms(row['tpot_ms_p50'])} / "
            f"{ms(row['tpot_ms_p99'])} | {ms(row['tokens_per_forward'], 3)} | "
            f"{ms(row['request_ms_p99'], 0)} | {ms(row['moe_layer_ms_p50'], 2)} / "
            f"{ms(row['moe_layer_ms_p99'], 2)} | {row['cold_starts']} | {row['invokes']} | "
            f"{row['fleet'] or row['backbone']} | {parts} |"
        )
    lines += ["", "## Constants and their sources", "", *(f"- {s}" for s in sources)]
    (out / "report.md").write_text("\n".join(lines) + "\n")
