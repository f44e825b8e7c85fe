"""Expert-load predictors side by side on the trained tiny MoE's routing of held-out real prompts.

Usage:
    .venv/bin/python benchmarks/predictors.py             # 800 prompts of ../shared/data/prompts/dev.jsonl
    .venv/bin/python benchmarks/predictors.py --prompts 200

Trains (once, cached under .moeless/models) the default `moeless model train` model on the real
texts of ../shared/data/text (Python's documentation without it), profiles it over the prompts
(16 new tokens each, half the tokens' router inputs kept), and runs `moeless predict eval` for
every method and distance d = 1, 2, 3. Without ../shared it uses the project's demo prompts (too
few for a meaningful split; it says so). Writes benchmarks/results/predictors.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import bench_model, md_header, md_row, write_result

from moeless.demo.prompts import DEMO_PROMPTS
from moeless.prediction.evaluation import evaluate
from moeless.prediction.predictors import METHODS, Embedder
from moeless.prediction.trace import load_trace, profile, read_prompts

REPO = Path(__file__).resolve().parent.parent
SHARED_PROMPTS = REPO.parent / "shared" / "data" / "prompts" / "dev.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=800)
    args = parser.parse_args()
    model = bench_model()
    if SHARED_PROMPTS.is_file():
        prompts, source = (
            read_prompts(SHARED_PROMPTS, args.prompts),
            f"{SHARED_PROMPTS.name} (first {args.prompts})",
        )
    else:
        prompts, source = (
            list(DEMO_PROMPTS),
            "the demo prompts (no ../shared: too few for a meaningful split)",
        )
    trace_dir = REPO / ".moeless" / "bench" / f"trace-{model.name}-{len(prompts)}"
    if not (trace_dir / "meta.json").is_file():
        profile(model, prompts, trace_dir, max_new_tokens=16, hidden_sample_rate=0.5)
    trace = load_trace(trace_dir)
    embedder = Embedder()
    lines = [
        f"Model {model.name}, prompts: {source}, {len(trace.request)} tokens; token-level methods scored "
        "on sampled tokens, load-level ones on every token of a request; means over target layers.",
        "",
        *md_header(
            ("d", "method", "hit rate", "set recall", "load accuracy", "ms per layer p50", "p99"), "rlrrrrr"
        ),
    ]
    print("\n".join(lines))
    results = {}
    for distance in (1, 2, 3):
        for method in METHODS:
            m = evaluate(trace, method, distance, embedder=embedder)["mean"]
            results[(method, distance)] = m
            cells = [f"{m[k]:.3f}" for k in ("hit_rate", "set_recall", "load_accuracy")]
            cells += [f"{m[k]:.4f}" for k in ("latency_ms_p50", "latency_ms_p99")]
            lines.append(md_row((distance, method, *cells)))
            print(lines[-1], flush=True)
    goals = ["", "Goals:", ""]
    for distance in (1, 2, 3):
        layer, gate = results[("layer", distance)]["hit_rate"], results[("gate", distance)]["hit_rate"]
        goals.append(
            f"- d={distance}: layer-aware vs unmodified gate, hit rate {layer:.3f} vs {gate:.3f}: "
            f"{layer / gate - 1:+.1%} (goal >= +15%)"
        )
    sps, freq = results[("sps", 1)]["load_accuracy"], results[("freq", 1)]["load_accuracy"]
    goals.append(
        f"- SPS vs frequency prior, load accuracy {sps:.4f} vs {freq:.4f}: {sps - freq:+.4f} (goal > 0)"
    )
    worst = max(results[("layer", d)]["latency_ms_p99"] for d in (1, 2, 3))
    goals.append(f"- layer-aware prediction p99 {worst:.4f} ms per layer (goal < 0.2 ms)")
    print("\n".join(goals))
    write_result("predictors", "expert-load predictors on the trained tiny MoE", lines + goals)


if __name__ == "__main__":
    main()
