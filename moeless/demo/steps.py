"""The demo's steps between the parts (``moeless demo``): which prompts, profile once, plan every
policy (moeless's provisioned concurrency sized for a stated SLO), compare with the unsplit model,
predict one request, simulate, and write the report.

The command (``cli/cmd_demo.py``) runs them in order and serves the chosen plan between
planning and comparing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moeless.contracts.plan import Placement, Policy

if TYPE_CHECKING:
    from moeless.contracts.manifest import Manifest
    from moeless.contracts.plan import Plan

PLAN_POLICIES = tuple(Policy)
WORKERS = 4
SHARED_PROMPT_LIMIT = 120
PROMPT_CHARS = 300  # the demo model's context is short: long prompts are cut
SIMULATED_S = 300.0
ARRIVAL = "bursty:1:1.8:60"  # the README study's bursty rate: 1/s mean, 1.8x peaks in 60 s cycles
SLO_FLOOR_FACTOR = 3.0  # the demo's SLO: p99 TPOT at most this many times the Lambda floor,
SLO_TTFT_MS = 1000.0  # and p99 TTFT at most a second (a cold start on the path breaks it)
SPECULATE = 4  # drafted tokens each decoding sequence carries into a forward (its trained draft's)


def demo_prompts(path: Path) -> list[str]:
    """The project's own prompts, then (cut to the demo model's context) those of ``path`` if it exists."""
    from moeless.demo.prompts import DEMO_PROMPTS
    from moeless.prediction.trace import read_prompts

    extra = read_prompts(path, SHARED_PROMPT_LIMIT) if path.is_file() else []
    return list(DEMO_PROMPTS) + [p[:PROMPT_CHARS] for p in extra]


def profile_or_reuse(
    model_dir: Path,
    out: Path,
    prompts: list[str],
    max_tokens: int,
    say: Callable[[str], None] = lambda _message: None,
    progress: bool = True,
) -> Path:
    """The trace of ``prompts`` in ``out``: reused when it recorded the same prompts and length."""
    from moeless.prediction.trace import load_trace, profile

    if (out / "meta.json").is_file():
        trace = load_trace(out)
        recorded = [p.get("prompt") for p in trace.prompts]
        if recorded == prompts and trace.meta.get("max_new_tokens") == max_tokens:
            say(f"reusing the trace of {len(prompts)} prompts in {out}")
            return out
    profile(model_dir, prompts, out, max_new_tokens=max_tokens, progress=progress)
    return out


def plan_every_policy(trace_dir: Path, manifest: Manifest, out: Path) -> dict[str, Plan]:
    """Each policy's plan from the trace's loads, checked to fit and saved as ``out/POLICY.json``."""
    from moeless.planning.planner import PlanRequest, make_plan
    from moeless.prediction.trace import load_trace

    loads = load_trace(trace_dir).loads()
    plans: dict[str, Plan] = {}
    for name in PLAN_POLICIES:
        workers = WORKERS if name != Policy.REMOE else None
        plan = make_plan(loads, PlanRequest(name, workers=workers), manifest)
        plan.check_fits(manifest)
        plan.save(out / f"{name}.json")
        plans[name] = plan
    return plans


def same_as_unsplit(model_dir: Path, answers: list[tuple[str, str]], max_tokens: int) -> list[bool]:
    """Per (prompt, answer): is it the unsplit model's greedy text, token for token?"""
    from moeless.model.reference import greedy_texts

    expected = greedy_texts(model_dir, [prompt for prompt, _ in answers], max_tokens)
    return [text == want for (_, text), want in zip(answers, expected, strict=True)]


def predicted_vs_actual(trace_dir: Path) -> tuple[str, list[tuple[int, list[int], list[int]]]]:
    """Similar-Prompt Search fitted on every other profiled prompt, asked about the first one."""
    import numpy as np

    from moeless.prediction.predictors import Embedder, cover_set, fit_sps, request_shares
    from moeless.prediction.trace import load_trace

    trace = load_trace(trace_dir)
    requests = np.unique(trace.request)
    held_out, others = requests[0], requests[1:]
    sps = fit_sps(trace, others, Embedder())
    prompt = next(p["prompt"] for p in trace.prompts if p["request"] == held_out)
    predicted = sps.predict(prompt)
    rows = []
    for i, layer in enumerate(trace.layers):
        actual = request_shares(trace, np.array([held_out]), i)[int(held_out)]
        rows.append((layer, sorted(cover_set(predicted[i])), sorted(int(e) for e in np.flatnonzero(actual))))
    return prompt, rows


def _traffic(trace_dir: Path) -> tuple[Any, Any, list[Any]]:
    """The deployment of the traced model's whole shape (its config.json), the trace's routing, and
    :data:`SIMULATED_S` s of :data:`ARRIVAL` requests replaying it."""
    import numpy as np

    from moeless.model.shapes import resolve_model
    from moeless.prediction.trace import load_trace
    from moeless.simulation.arrivals import arrival_times
    from moeless.simulation.policies import Deployment, requests_replaying
    from moeless.simulation.routing import RecordedRouting

    trace = load_trace(trace_dir)
    shape = resolve_model(str(Path(trace.meta["model"]) / "config.json"))
    routing = RecordedRouting.from_trace(trace, list(shape.moe_layers), shape.num_layers)
    replay = requests_replaying(arrival_times(ARRIVAL, SIMULATED_S, np.random.default_rng(0)), routing)
    return Deployment.choose(shape), routing, replay


def size_for_demo_slo(trace_dir: Path, manifest: Manifest, out: Path) -> tuple[Plan, str]:
    """moeless's plan sized by the replica optimiser for the demo's stated SLO (p99 TPOT at most
    :data:`SLO_FLOOR_FACTOR` x the Lambda floor, p99 TTFT at most :data:`SLO_TTFT_MS`) on the
    demo's simulated traffic; saved as ``out/moeless.json``. Returns it and the line the report
    states it with."""
    from moeless.simulation.report import ms
    from moeless.sizing import DEFAULT_SEARCH, Slo, SloUnreachable, lambda_floor_ms, size_for_slo
    from moeless.sizing.choice import choose
    from moeless.sizing.structures import default_memory_options

    deployment, routing, replay = _traffic(trace_dir)
    floor = lambda_floor_ms(deployment, default_memory_options(deployment)[0])
    slo = Slo(SLO_FLOOR_FACTOR * floor, SLO_TTFT_MS)
    try:
        sizing = size_for_slo("moeless", deployment, routing, replay, SIMULATED_S, slo, DEFAULT_SEARCH)
    except SloUnreachable as exc:
        best = exc.sizing.best_latency()
        plan, reached = best.plan, f"unreachable: {exc}; serving the fastest plan found"
    else:
        assert sizing.chosen is not None
        plan, best = sizing.chosen.plan, sizing.chosen
        reached = "met"
        if not plan.functions:  # the demo serves through functions: their cheapest plan, said so
            with_functions = [p for p in sizing.points if p.plan.functions]
            serverless = choose(with_functions, slo, sizing.every_level_premium)
            if serverless is not None:
                reached = (
                    f"met; the optimiser's cheapest is tier {best.structure.tier} on "
                    f"{best.structure.variant.backbone.label()} (${best.usd_per_1k:.4f} per 1k requests, "
                    f"no functions); the demo serves the cheapest plan with function experts, "
                    f"{serverless.usd_per_1k / best.usd_per_1k:.2f}x that"
                )
                plan, best = serverless.plan, serverless
    plan.save(out / "moeless.json")
    summary = best.summary
    line = (
        f"moeless sized for {slo.describe()} ({SLO_FLOOR_FACTOR:g}x the Lambda floor of {floor:.1f} ms) "
        f"on {len(replay)} simulated requests ({ARRIVAL}): {reached}; tier {best.structure.tier} on "
        f"{best.structure.variant.backbone.label()}, {best.provisioned} provisioned "
        f"environments, {best.keep_warm} kept warm by pings"
        f"{' (every level a step can use)' if best.every_level else ''}, replicas x{best.replica_scale}, "
        f"{best.memory_mb} MB; simulated p99 TPOT {ms(summary['tpot_ms_p99'])} ms, "
        f"${summary['usd_per_1k_requests']:.4f} per 1k requests"
        + (
            f"; {best.stall_tpot_ms:.1f} ms per token decoding beside a prefill (the stall bound)"
            if best.stall_tpot_ms is not None
            else ""
        )
    )
    return plan, line


def simulate_policies(
    trace_dir: Path, out: Path, plans: dict[str, Plan] | None = None
) -> tuple[list[dict[str, Any]], list[Path]]:
    """Every policy on :data:`SIMULATED_S` s of :data:`ARRIVAL` traffic replayed from the trace,
    on the traced model's whole shape (its config.json), the policies in ``plans`` replaying that
    plan (the one served): each policy's summary row and the plots written to ``out``."""
    from moeless.simulation.study import run_study

    deployment, routing, replay = _traffic(trace_dir)
    describe = [f"- requests: {len(replay)} ({ARRIVAL} for {SIMULATED_S:.0f} s), replayed from {trace_dir}"]
    results, plots = run_study(
        deployment,
        routing,
        replay,
        ["static", "hybrid", "moeless", "remoe"],
        SIMULATED_S,
        out,
        describe,
        progress=False,
        plans=plans,
    )
    return [r.summary() for r in results], plots


def speculation_line(counters: dict[str, float]) -> str:
    """What speculation did while serving: tokens per sequence per decode forward (1 without it) and
    how many of the draft's tokens the model kept (empty when nothing was drafted)."""
    forwards, tokens = counters.get("decode_verifications", 0), counters.get("decode_tokens", 0)
    proposed, accepted = counters.get("draft_tokens_proposed", 0), counters.get("draft_tokens_accepted", 0)
    if not forwards or not proposed:
        return ""
    return (
        f"speculation (up to {SPECULATE} drafts per sequence from the dense draft): "
        f"{tokens / forwards:.2f} tokens per sequence per decode forward, {accepted / proposed:.0%} of "
        f"{proposed:.0f} drafted tokens kept"
    )


def demo_report(
    answers: list[tuple[str, str]],
    same: list[bool],
    prediction: tuple[str, list[tuple[int, list[int], list[int]]]],
    plans: dict[str, Plan],
    policy: str,
    bill: dict[str, Any],
    rows: list[dict[str, Any]],
    plots: list[Path],
    sized: str = "",
    speculation: str = "",
) -> str:
    """The demo's report as Markdown-ish text: answers, prediction, plans, bill, simulation."""
    from moeless.lambda_host.meter import format_bill

    lines = ["", "## Answers (greedy, through the REST endpoint)"]
    for (prompt, text), ok in zip(answers, same, strict=True):
        lines.append(f"  {'same as unsplit' if ok else 'DIFFERENT'}  {prompt!r} -> {text!r}")
    lines.append(f"split system = unsplit model on {sum(same)}/{len(same)} prompts")
    if speculation:
        lines.append(speculation)
    prompt, layers = prediction
    lines += ["", f"## Predicted vs actual experts of one request (SPS, held out): {prompt!r}"]
    for layer, predicted, actual in layers:
        hit = len(set(predicted) & set(actual)) / max(len(actual), 1)
        lines.append(
            f"  layer {layer}: predicted {predicted}  actual {actual}  ({hit:.0%} of actual predicted)"
        )
    lines += ["", f"## Plans (served: {policy})"]
    if sized:
        lines.append(f"  {sized}")
    for name, plan in plans.items():
        warm = sum(f.provisioned_concurrency for f in plan.functions)
        kept = sum(f.keep_warm for f in plan.functions)
        cost = plan.estimate.cost_per_1k_requests if plan.estimate else None
        lines.append(
            f"  {name:<8} {len(plan.functions):>3} functions, {warm:>3} provisioned instances"
            + (f", {kept} kept warm" if kept else "")
            + (f", estimated ${cost:.4f} per 1k requests" if isinstance(cost, float) else "")
            + ("  (every expert fits in the backbone's memory)" if not plan.functions else "")
        )
    lines.append(f"  {policy}: expert x replicas (provisioned concurrency of its first function)")
    functions = {f.name: f for f in plans[policy].functions}
    by_layer: dict[int, list[str]] = {}
    for placement in plans[policy].experts:
        pc = functions[placement.function].provisioned_concurrency if placement.function in functions else 0
        where = "" if placement.placement == Placement.FUNCTION else f" on {placement.placement}"
        by_layer.setdefault(placement.layer, []).append(
            f"e{placement.expert}x{placement.replicas}/pc{pc}{where}"
        )
    lines += [f"  layer {layer}: {' '.join(items)}" for layer, items in sorted(by_layer.items())]
    lines += ["", "## The local Lambda host's bill", format_bill(bill, max_rows=5)]
    base = next(r for r in rows if r["policy"] == Policy.STATIC)
    from moeless.simulation.report import ms

    lines += [
        "",
        f"## Simulated cost and latency, whole model (vs the serverful fleet `static`: {base['fleet']})",
    ]
    lines.append(
        f"  {'policy':<8} {'$ per 1k req':>12} {'vs static':>9} {'TTFT p99':>9} {'TPOT p99':>9} "
        f"{'p99 ms':>8} {'cold':>5}  on"
    )
    for r in rows:
        ratio = r["usd_per_1k_requests"] / base["usd_per_1k_requests"] if base["usd_per_1k_requests"] else 0.0
        lines.append(
            f"  {r['policy']:<8} {r['usd_per_1k_requests']:>12.4f} {ratio:>8.2f}x "
            f"{ms(r['ttft_ms_p99'], 0):>9} "
            f"{ms(r['tpot_ms_p99']):>9} {ms(r['request_ms_p99'], 0):>8} {r['cold_starts']:>5}  "
            f"{r['fleet'] or r['backbone']}"
        )
    lines.append("  plots: " + ", ".join(str(p) for p in plots))
    lines.append("  (constants, their sources and the experts' assumed size: report.md beside the plots)")
    return "\n".join(lines)
