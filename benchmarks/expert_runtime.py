"""How fast one routed expert runs: torch eager vs onnxruntime fp32 / fp16 / int8, and packaging MB/s.

Usage:
    .venv/bin/python benchmarks/expert_runtime.py            # Mixtral-size and 1024x2816 experts
    .venv/bin/python benchmarks/expert_runtime.py --quick    # small sizes, a smoke run

For each expert size and token batch it prints the median latency of each backend and its
ratio to torch eager measured in the same run (ratio < 1: faster than torch). Every backend
gets the same threads (all cores). Then it packages a tiny Mixtral with 1024x2816 experts and
reports the expert bytes written per second. Writes benchmarks/results/expert_runtime.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import md_header, md_row, write_result

from moeless.experts.session import session_options
from moeless.model.expert_weights import ExpertWeights
from moeless.model.export import ExpertSpec, build_expert_model, reference_forward

FULL_SIZES = ((4096, 14336), (1024, 2816))
QUICK_SIZES = ((256, 512),)
FULL_BATCHES = (1, 8, 64, 512)
QUICK_BATCHES = (1, 8)


def median_ms(fn, min_runs: int = 5, min_seconds: float = 1.0, max_runs: int = 50) -> float:
    """Median wall time of ``fn()`` in ms after one warm-up call."""
    fn()
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() - started < min_seconds):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench_expert(hidden: int, inter: int, batches: tuple[int, ...], threads: int) -> list[str]:
    """Markdown rows, one per token batch: the median ms of torch eager and each onnxruntime dtype,
    each with its ratio to torch."""
    import onnxruntime as ort

    torch.manual_seed(0)
    spec = ExpertSpec("swiglu", hidden, inter, {"act": "silu"})
    weights = ExpertWeights(
        gate_up=torch.randn(2 * inter, hidden) * 0.02, down=torch.randn(hidden, inter) * 0.02
    )
    sessions = {}
    for dtype in ("fp32", "fp16", "int8"):
        model = build_expert_model(weights, spec, dtype, "bench")
        sessions[dtype] = ort.InferenceSession(
            model, session_options(threads), providers=["CPUExecutionProvider"]
        )
        del model
    label = f"{hidden} x {inter} ({weights.num_bytes_fp32 / 1e6:.0f} MB)"
    rows = []
    rng = np.random.default_rng(0)
    for tokens in batches:
        x = rng.standard_normal((tokens, hidden), dtype=np.float32)
        xt = torch.from_numpy(x)
        with torch.inference_mode():
            base = median_ms(lambda xt=xt: reference_forward(weights, spec, xt))
        cells = []
        for session in sessions.values():
            ms = median_ms(lambda s=session, x=x: s.run(["output"], {"hidden": x}))
            cells.append(f"{ms:.2f} ms ({ms / base:.2f}x)")
        rows.append(md_row((label if not rows else "", tokens, f"{base:.2f} ms", *cells)))
        print(rows[-1], flush=True)
    return rows


def bench_packaging(hidden: int, inter: int, experts: int, jobs_list: tuple[int, ...]) -> list[str]:
    from moeless.model.packaging import package
    from moeless.model.tiny import TinySpec, build_tiny_model

    rows = [
        f"Packaging a 2-layer x {experts}-expert Mixtral, experts {hidden} x {inter} (fp32); "
        "each expert: read, export, verify against torch, sha256, atomic write:",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="moeless-bench-") as tmp:
        model_dir = build_tiny_model(
            Path(tmp) / "model", TinySpec(layers=2, experts=experts, hidden=hidden, intermediate=inter)
        )
        for jobs in jobs_list:
            report = package(model_dir, Path(tmp) / f"art-{jobs}", jobs=jobs, progress=False)
            rows.append(
                f"- `--jobs {jobs}`: {report.expert_bytes_written / 1e6:.0f} MB of experts "
                f"in {report.seconds:.1f} s = {report.throughput_mb_s:.0f} MB/s"
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    parser.add_argument("--part", choices=("all", "experts", "packaging"), default="all")
    args = parser.parse_args()
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    sizes, batches = (QUICK_SIZES, QUICK_BATCHES) if args.quick else (FULL_SIZES, FULL_BATCHES)
    lines = []
    if args.part in ("all", "experts"):
        lines += [
            f"torch {torch.__version__}, {threads} threads for every backend. Median latency of one routed "
            "expert per call; in brackets the ratio to torch eager measured in the same run (below 1: "
            "faster).",
            "",
            *md_header(("expert (fp32 size)", "tokens", "torch eager", "ort fp32", "ort fp16", "ort int8")),
        ]
        print("\n".join(lines))
        for hidden, inter in sizes:
            lines += bench_expert(hidden, inter, batches, threads)
    if args.part in ("all", "packaging"):
        packed = bench_packaging(128, 256, 4, (1,)) if args.quick else bench_packaging(1024, 2816, 8, (1, 2))
        print("\n".join(packed))
        lines += ["", *packed] if lines else packed
    write_result(
        "expert_runtime", "one routed expert, torch eager against onnxruntime; packaging MB/s", lines
    )


if __name__ == "__main__":
    main()
