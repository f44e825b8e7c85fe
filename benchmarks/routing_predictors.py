"""Expert-load predictors on a real model's routing: gpt-oss-20b's decode tokens, all 24 layers.

Usage:
    .venv/bin/python benchmarks/routing_predictors.py                    # 70/30 split by request
    .venv/bin/python benchmarks/routing_predictors.py --test-fraction 0.5

Runs `moeless predict eval-routing` on ../shared/data/routing/gptoss20b_decode.npz for the
prompt-level methods (freq, sps, kernel) and the token-level ones (table, crosslayer) at
d = 1, 2, 3, then prints the goals of issue 16: kernel >= freq + 0.10 load accuracy and never
below SPS; crosslayer >= 1.10 x the table's hit rate at every d, under 0.05 ms per layer (p50).
Takes about 3 minutes here (the cross-layer networks: 23 pairs per distance).
Writes benchmarks/results/routing_predictors.md.
"""

from __future__ import annotations

import argparse

from common import GPTOSS_ROUTING, load_gptoss_routing, md_header, md_row, write_result

from moeless.prediction.predictors import Embedder
from moeless.prediction.routing_eval import evaluate_routing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--test-fraction", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    trace = load_gptoss_routing()
    embedder = Embedder()
    lines = [
        f"{GPTOSS_ROUTING.name}: {len(trace.prompts)} requests, {len(trace.request)} tokens, "
        f"test fraction {args.test_fraction}, split seed {args.seed}. Prompt-level methods (freq, sps, "
        "kernel) are scored at any distance; load-level rows are means over all layers, token-level ones "
        "over the target layers d and up.",
        "",
        *md_header(
            ("d", "method", "hit rate", "set recall", "load accuracy", "ms per layer p50", "p99"), "rlrrrrr"
        ),
    ]
    print("\n".join(lines))
    results = {}
    runs = [(m, 1) for m in ("freq", "sps", "kernel")] + [
        (m, d) for d in (1, 2, 3) for m in ("table", "crosslayer")
    ]
    for method, distance in runs:
        result = evaluate_routing(trace, method, distance, args.seed, None, args.test_fraction, embedder)
        results[(method, distance)] = m = result["mean"]
        shown = "any" if method in ("freq", "sps", "kernel") else distance
        cells = [f"{m[k]:.3f}" for k in ("hit_rate", "set_recall", "load_accuracy")]
        cells += [f"{m[k]:.4f}" for k in ("latency_ms_p50", "latency_ms_p99")]
        lines.append(md_row((shown, method, *cells)))
        print(lines[-1], flush=True)
    freq, sps, kernel = (results[(m, 1)]["load_accuracy"] for m in ("freq", "sps", "kernel"))
    goals = [
        "",
        "Goals:",
        "",
        f"- kernel vs prior, load accuracy {kernel:.3f} vs {freq:.3f}: {kernel - freq:+.3f} (goal >= +0.10)",
        f"- kernel vs SPS, load accuracy {kernel:.3f} vs {sps:.3f}: {kernel - sps:+.3f} (goal >= 0)",
    ]
    for d in (1, 2, 3):
        cross, table = results[("crosslayer", d)], results[("table", d)]
        goals.append(
            f"- d={d}: crosslayer vs table, hit rate {cross['hit_rate']:.3f} vs {table['hit_rate']:.3f}: "
            f"{cross['hit_rate'] / table['hit_rate'] - 1:+.1%} (goal >= +10%), "
            f"{cross['latency_ms_p50']:.4f} ms per layer p50 (goal < 0.05)"
        )
    print("\n".join(goals))
    write_result("routing_predictors", "expert-load predictors on gpt-oss-20b's routing", lines + goals)


if __name__ == "__main__":
    main()
