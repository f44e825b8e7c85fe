"""Speculative decoding on the local stack: each drafter against no drafting, in the same run, and
what the simulator predicts for each.

Model: the trained tiny MoE of the benchmarks (``common.bench_model``: 4 layers x 8 experts, trained
on ../shared/data/text when present, else on Python's documentation), packaged, one function per
expert on the local Lambda host in this process; the drafters: prompt lookup, and a dense draft
(2 Llama blocks) trained on the same text with its tokenizer (``moeless.model.training.trained_draft``),
every guess carried, and carried only from a confidence up (``--draft-confidence``).
Prompts: the demo's 16 and, when ../shared/data/prompts exists, 200 of dev.jsonl (cut to 300
characters); greedy, ``max_tokens`` 32; Poisson arrivals (seeded), the same for every variant.

Per variant, from the real run (``sim_vs_real.real_run``): tokens per sequence per decode forward
(the engine's ``decode_tokens / decode_verifications``: 1 without drafts, whatever the batch),
invokes per generated token, TPOT p50 (per request: (finish - first token) / (tokens - 1)), the
local host's Lambda bill per 1k requests, and whether every completion equals no drafting's. Then
the simulation of the same run (``sim_vs_real.simulate``: the constants calibrated once before the
runs, the routing the prompts take, and the variant's acceptance as the run measured it,
``Acceptance.from_counters``). Goals (issue 40): with the trained draft at least 1.5 tokens per
forward, invokes per token at least 30% lower and TPOT p50 at least 25% lower than without
drafting; the simulator within 25% on latencies.

Writes benchmarks/results/speculate.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from common import REPO, SHARED, bench_model, md_table, write_result
from sim_vs_real import RealRun, calibrate, real_run, recorded_routing, signed, simulate

from moeless.contracts.environment import DEFAULT_DRAFT_CONFIDENCE
from moeless.contracts.manifest import load_manifest
from moeless.contracts.plan import one_function_per_expert
from moeless.demo.prompts import DEMO_PROMPTS
from moeless.model.packaging import package
from moeless.model.training import DraftSpec, trained_draft
from moeless.simulation.speculation import Acceptance

WORKDIR = REPO / ".moeless" / "bench" / "speculate"
PUBLIC_PROMPTS = 200
PROMPT_CHARS = 300
MAX_TOKENS = 32
DRAFTS = 4
RATE = 1.0  # requests per second, Poisson
# The draft's probability a guess needs in the last variant: where the tiny trained draft's guesses
# turn reliable (from 0.2 up about 96% equal the target's greedy token, below 0.1 about 41%).
CONFIDENCE = 0.2


@dataclass(frozen=True)
class Variant:
    name: str
    speculate: int = 0
    draft_model: Path | None = None
    draft_confidence: float = DEFAULT_DRAFT_CONFIDENCE


def prompts_to_send() -> list[str]:
    """The demo's prompts, then ``PUBLIC_PROMPTS`` of ../shared/data/prompts/dev.jsonl when present."""
    from moeless.prediction.trace import read_prompts

    public = SHARED / "prompts" / "dev.jsonl"
    extra = read_prompts(public, PUBLIC_PROMPTS) if public.is_file() else []
    return list(DEMO_PROMPTS) + [p[:PROMPT_CHARS] for p in extra]


def tpot_ms(run: RealRun) -> list[float]:
    return [
        (r.finish_s - r.first_token_s) * 1e3 / (r.completion_tokens - 1)
        for r in run.requests
        if r.completion_tokens > 1 and not r.error
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=RATE, help=f"requests per second [{RATE}]")
    parser.add_argument("--drafts", type=int, default=DRAFTS, help=f"drafts per sequence [{DRAFTS}]")
    parser.add_argument(
        "--confidence",
        type=float,
        default=CONFIDENCE,
        help=f"the last variant's --draft-confidence [{CONFIDENCE}]",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # as sim_vs_real: one backbone thread on a machine shared with the host
    texts = sorted((SHARED / "text").glob("*.txt")) if (SHARED / "text").is_dir() else None
    model_dir = bench_model()
    draft_dir = trained_draft(model_dir, DraftSpec(), texts)
    artifacts = WORKDIR / "artifacts"
    package(model_dir, artifacts, progress=False)
    manifest = load_manifest(artifacts)
    plan = one_function_per_expert(manifest)
    prompts = prompts_to_send()
    rng = np.random.default_rng(args.seed)
    times = np.cumsum(rng.exponential(1 / args.rate, len(prompts)))
    duration = float(times[-1])
    print(f"{len(prompts)} prompts at {args.rate:g}/s (Poisson, {duration:.0f} s), max_tokens {MAX_TOKENS}")
    routing = recorded_routing(model_dir, prompts, WORKDIR / "trace", MAX_TOKENS)
    fit, invokes = calibrate(artifacts, manifest, prompts, plan, plan, "calibration")
    variants = [
        Variant("no drafting"),
        Variant(f"prompt lookup, k={args.drafts}", args.drafts),
        Variant(f"trained draft, k={args.drafts}", args.drafts, draft_dir),
        Variant(
            f"trained draft, k={args.drafts}, confidence {args.confidence:g}",
            args.drafts,
            draft_dir,
            args.confidence,
        ),
    ]
    rows, texts_of, base = [], {}, None
    for variant in variants:
        wall = time.perf_counter()
        run = real_run(
            artifacts, plan, times, prompts, max_tokens=MAX_TOKENS,
            speculate=variant.speculate, draft_model=variant.draft_model,
            draft_confidence=variant.draft_confidence,
        )  # fmt: skip
        counters = run.counters
        acceptance = (
            Acceptance.from_counters(counters, f"measured in this run ({variant.name})")
            if variant.speculate
            else None
        )
        sim = simulate(
            manifest, plan, routing, run, fit, invokes, duration, 0.0, variant.speculate, acceptance
        )
        tokens = sum(r.completion_tokens for r in run.requests)
        failed = sum(1 for r in run.requests if r.error)
        real = {
            "tokens per forward": counters.get("decode_tokens", 0)
            / max(counters.get("decode_verifications", 0), 1),
            "invokes per token": run.invokes / max(tokens, 1),
            "TPOT p50 ms": statistics.median(tpot_ms(run)),
            "Lambda $ per 1k requests": run.lambda_usd / len(prompts) * 1e3,
        }
        simulated = {
            "tokens per forward": sim.decoded_tokens / max(sim.verifications, 1),
            "invokes per token": sim.invokes / max(tokens, 1),
            "TPOT p50 ms": float(np.percentile(sim.tpot_ms, 50)) if sim.tpot_ms else float("nan"),
            "Lambda $ per 1k requests": (sim.usd["requests"] + sim.usd["duration"]) / len(prompts) * 1e3,
        }
        texts_of[variant.name] = [r.text for r in run.requests]
        base = base or real
        rows.append((variant, real, simulated, failed, acceptance))
        drafting = {k: int(v) for k, v in counters.items() if "draft" in k or "decode" in k}
        print(
            f"{variant.name}: {time.perf_counter() - wall:.0f} s, {failed} failed; real {real}; simulated "
            f"{simulated}; counters {drafting}",
            flush=True,
        )
    table = []
    for variant, real, simulated, _failed, _acceptance in rows:
        for metric in real:
            table.append(
                (
                    variant.name, metric, f"{real[metric]:.3g}", f"{real[metric] / base[metric]:.2f}x",
                    f"{simulated[metric]:.3g}", signed(simulated[metric], real[metric]),
                )
            )  # fmt: skip
    same = all(texts_of[v.name] == texts_of[variants[0].name] for v in variants)
    lines = [
        f"The trained tiny MoE ({model_dir.name}), one function per expert on the local Lambda host; "
        f"{len(prompts)} prompts (the demo's and up to {PUBLIC_PROMPTS} of ../shared/data/prompts), Poisson "
        f"at {args.rate:g}/s, greedy, max_tokens {MAX_TOKENS}; drafts per sequence {args.drafts}. "
        "x base: against no drafting in the same run. Simulated: the same run in the simulator, its "
        "constants calibrated here before the runs, the acceptance the run measured.",
        "",
        *md_table(("variant", "metric", "real", "x base", "simulated", "sim vs real"), table),
        "",
        f"Every completion's text equal to no drafting's in every variant: {'yes' if same else 'no'}.",
        "",
        "Acceptance per draft position (measured): "
        + "; ".join(f"{v.name}: {a.describe()}" for v, _, _, _, a in rows if a is not None),
    ]
    write_result("speculate", "speculative decoding on the local stack, against no drafting", lines)


if __name__ == "__main__":
    main()
