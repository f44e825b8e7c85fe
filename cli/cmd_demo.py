"""``moeless demo``: the main job on the embedded default, end to end, with a report.

Train (or reuse) a small MoE on Python's documentation, package it (each expert an ONNX file
checked against torch), profile the demo prompts (and ../shared/data's real prompts when that
folder is there), plan with every policy, serve the chosen plan on a local Lambda host behind the
REST endpoint, answer prompts through it (checked token for token against the unsplit model), and
report: the answers, one request's predicted vs actual experts, the plan, the host's bill, and the
simulated cost and latency of each policy against serverful expert parallelism, with plots.
Re-runs reuse the model, package and trace. Every process it starts is stopped on exit, Ctrl-C
included.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

from cli.options import echo_step, quiet_option
from cli.running import REPO_ROOT, expert_task_root, running_service

SHARED_PROMPTS = REPO_ROOT.parent / "shared" / "data" / "prompts" / "dev.jsonl"
PLAN_POLICIES = ("static", "moeless", "remoe")
WORKERS = 4
SHARED_PROMPT_LIMIT = 120
PROMPT_CHARS = 300  # the demo model's context is short: long prompts are cut
SIMULATED_S = 300.0
ARRIVAL = "bursty:1:1.8:60"  # the README study's bursty rate: 1/s mean, 1.8x peaks in 60 s cycles
STEPS = 7


@click.command()
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".moeless/demo"),
    show_default=True,
    help="Where the demo keeps its model, package, trace, plans and report (reused on re-runs).",
)
@click.option(
    "--policy",
    type=click.Choice(PLAN_POLICIES),
    default="moeless",
    show_default=True,
    help="The plan that is served (every policy is planned and simulated).",
)
@click.option("--max-tokens", type=click.IntRange(1, 64), default=16, show_default=True)
@click.option(
    "--train-steps",
    type=click.IntRange(10),
    default=600,
    show_default=True,
    help="Training steps of the demo model (fewer: faster, but a worse model).",
)
@click.option(
    "--prompts",
    "prompts_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=SHARED_PROMPTS,
    help="JSONL prompts to profile besides the demo's own "
    "[default: ../shared/data/prompts/dev.jsonl, when it exists].",
)
@quiet_option
def demo(
    workdir: Path, policy: str, max_tokens: int, train_steps: int, prompts_path: Path, quiet: bool
) -> None:
    """Train, package, profile, plan, serve locally and answer prompts; then report."""
    from moeless.manifest import load_manifest
    from moeless.packaging import package
    from moeless.training import TrainSpec, trained_model

    start = time.perf_counter()

    def step(number: int, message: str) -> None:
        echo_step(f"[{number}/{STEPS}] {message}  ({time.perf_counter() - start:.0f} s)", quiet)

    step(1, "the demo model: a small Mixtral trained on Python's documentation (cached after the first run)")
    model_dir = trained_model(workdir / "models", TrainSpec(steps=train_steps), progress=not quiet)
    step(2, "package: backbone + one ONNX file per expert, each checked against torch")
    artifacts = workdir / model_dir.name
    package(model_dir, artifacts, progress=not quiet)
    manifest = load_manifest(artifacts)
    step(3, "profile: record which experts each prompt's tokens are routed to")
    trace_dir = _profile(model_dir, workdir / "trace", _prompts(prompts_path), max_tokens, quiet)
    step(4, f"plan with each policy ({', '.join(PLAN_POLICIES)}) from the profiled loads")
    plans = _plans(trace_dir, manifest, workdir / "plans")
    step(5, f"serve the {policy} plan locally and answer prompts through the REST endpoint")
    answers, bill = _serve_and_ask(
        artifacts, workdir / "plans" / f"{policy}.json", trace_dir, max_tokens, quiet
    )
    step(6, "check the answers token for token against the unsplit model; predict one request's experts")
    same = _compare_with_unsplit(model_dir, answers, max_tokens)
    prediction = _predicted_vs_actual(trace_dir)
    step(7, f"simulate every policy on {SIMULATED_S:.0f} s of bursty traffic replayed from the trace")
    rows, plots = _simulate(trace_dir, workdir / "report")
    report = _report(answers, same, prediction, plans, policy, bill, rows, plots)
    (workdir / "report").mkdir(parents=True, exist_ok=True)
    (workdir / "report" / "demo.md").write_text(report + "\n")
    click.echo(report)
    click.echo(f"\ndemo took {time.perf_counter() - start:.0f} s; report: {workdir / 'report' / 'demo.md'}")
    if not all(same):
        raise click.ClickException("the split system's tokens differ from the unsplit model's")


def _prompts(path: Path) -> list[str]:
    from moeless.demo_prompts import DEMO_PROMPTS
    from moeless.trace import read_prompts

    extra = read_prompts(path, SHARED_PROMPT_LIMIT) if path.is_file() else []
    return list(DEMO_PROMPTS) + [p[:PROMPT_CHARS] for p in extra]


def _profile(model_dir: Path, out: Path, prompts: list[str], max_tokens: int, quiet: bool) -> Path:
    from moeless.trace import load_trace, profile

    if (out / "meta.json").is_file():
        trace = load_trace(out)
        recorded = [p.get("prompt") for p in trace.prompts]
        if recorded == prompts and trace.meta.get("max_new_tokens") == max_tokens:
            echo_step(f"      reusing the trace of {len(prompts)} prompts in {out}", quiet)
            return out
    profile(model_dir, prompts, out, max_new_tokens=max_tokens, progress=not quiet)
    return out


def _plans(trace_dir: Path, manifest, out: Path) -> dict:
    from moeless.planner import PlanRequest, make_plan
    from moeless.trace import load_trace

    loads = load_trace(trace_dir).loads()
    plans = {}
    for name in PLAN_POLICIES:
        workers = WORKERS if name != "remoe" else None
        plan = make_plan(loads, PlanRequest(name, workers=workers), manifest)
        plan.check_fits(manifest)
        plan.save(out / f"{name}.json")
        plans[name] = plan
    return plans


def _serve_and_ask(artifacts: Path, plan_path: Path, trace_dir: Path, max_tokens: int, quiet: bool):
    import urllib.request

    from moeless.demo_prompts import DEMO_PROMPTS
    from moeless.lambda_host.experts import start_expert_host
    from moeless.plan import load_plan
    from moeless.serving import BackboneConfig

    plan = load_plan(plan_path)
    config = BackboneConfig(artifacts, plan_path, predictor_trace=trace_dir, max_batch=8)

    def ask(url: str, model: str, prompt: str) -> dict:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        request = urllib.request.Request(
            f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())

    def say(message: str) -> None:
        echo_step(f"      {message}", quiet)

    def start_host():
        return start_expert_host(artifacts, plan, expert_task_root(None), on_progress=say)

    with running_service(config, 0, start_host, say) as (server, backbone, host):
        say(f"REST endpoint {server.url}/v1, {len(plan.functions)} functions on {host.endpoint_url}")
        with ThreadPoolExecutor(len(DEMO_PROMPTS)) as pool:  # concurrent: they share decode steps
            replies = list(pool.map(lambda p: ask(server.url, backbone.model_name, p), DEMO_PROMPTS))
        answers = [(p, r["choices"][0]["text"]) for p, r in zip(DEMO_PROMPTS, replies, strict=True)]
    return answers, host.meter.snapshot()


def _compare_with_unsplit(model_dir: Path, answers: list[tuple[str, str]], max_tokens: int) -> list[bool]:
    from moeless.reference import greedy_texts

    expected = greedy_texts(model_dir, [prompt for prompt, _ in answers], max_tokens)
    return [text == want for (_, text), want in zip(answers, expected, strict=True)]


def _predicted_vs_actual(trace_dir: Path) -> tuple[str, list[tuple[int, list[int], list[int]]]]:
    """Similar-Prompt Search fitted on every other profiled prompt, asked about the first one."""
    import numpy as np

    from moeless.predictors import Embedder, cover_set, fit_sps, request_shares
    from moeless.trace import load_trace

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


def _simulate(trace_dir: Path, out: Path):
    import numpy as np

    from moeless.sim_study import run_study
    from moeless.simulator import arrivals, requests_from_trace
    from moeless.trace import load_trace

    trace = load_trace(trace_dir)
    times = arrivals(ARRIVAL, SIMULATED_S, np.random.default_rng(0))
    replay = requests_from_trace(trace, times)
    describe = [f"- requests: {len(replay)} ({ARRIVAL} for {SIMULATED_S:.0f} s), replayed from {trace_dir}"]
    policies = ["static", "moeless", "remoe"]
    results, plots = run_study(
        trace.loads(),
        int(trace.meta["top_k"]),
        replay,
        policies,
        SIMULATED_S,
        out,
        describe,
        WORKERS,
        progress=False,
    )
    return [r.summary() for r in results], plots


def _report(answers, same, prediction, plans, policy, bill, rows, plots) -> str:
    from moeless.lambda_host.meter import format_bill

    lines = ["", "## Answers (greedy, through the REST endpoint)"]
    for (prompt, text), ok in zip(answers, same, strict=True):
        lines.append(f"  {'same as unsplit' if ok else 'DIFFERENT'}  {prompt!r} -> {text!r}")
    lines.append(f"split system = unsplit model on {sum(same)}/{len(same)} prompts")
    prompt, layers = prediction
    lines += ["", f"## Predicted vs actual experts of one request (SPS, held out): {prompt!r}"]
    for layer, predicted, actual in layers:
        hit = len(set(predicted) & set(actual)) / max(len(actual), 1)
        lines.append(
            f"  layer {layer}: predicted {predicted}  actual {actual}  ({hit:.0%} of actual predicted)"
        )
    lines += ["", f"## Plans (served: {policy})"]
    for name, plan in plans.items():
        warm = sum(f.provisioned_concurrency for f in plan.functions)
        cost = plan.estimate.get("cost_per_1k_requests")
        lines.append(
            f"  {name:<8} {len(plan.functions):>3} functions, {warm:>3} provisioned instances"
            + (f", estimated ${cost:.4f} per 1k requests" if isinstance(cost, float) else "")
            + ("  (every expert fits in the backbone's memory)" if not plan.functions else "")
        )
    lines.append(f"  {policy}: expert x replicas (provisioned concurrency of its first function)")
    functions = {f.name: f for f in plans[policy].functions}
    by_layer: dict[int, list[str]] = {}
    for placement in plans[policy].experts:
        pc = functions[placement.function].provisioned_concurrency if placement.function in functions else 0
        where = "" if placement.placement == "function" else " on backbone"
        by_layer.setdefault(placement.layer, []).append(
            f"e{placement.expert}x{placement.replicas}/pc{pc}{where}"
        )
    lines += [f"  layer {layer}: {' '.join(items)}" for layer, items in sorted(by_layer.items())]
    lines += ["", "## The local Lambda host's bill", format_bill(bill, max_rows=5)]
    lines += ["", "## Simulated cost and latency (vs serverful expert parallelism, `static`)"]
    base = next(r for r in rows if r["policy"] == "static")
    lines.append(
        f"  {'policy':<8} {'$ per 1k req':>12} {'vs static':>9} {'p50 ms':>8} {'p99 ms':>8} {'cold':>5}"
    )
    for r in rows:
        ratio = r["usd_per_1k_requests"] / base["usd_per_1k_requests"] if base["usd_per_1k_requests"] else 0.0
        lines.append(
            f"  {r['policy']:<8} {r['usd_per_1k_requests']:>12.4f} {ratio:>8.2f}x "
            f"{r['request_ms_p50']:>8.0f} {r['request_ms_p99']:>8.0f} {r['cold_starts']:>5}"
        )
    lines.append("  plots: " + ", ".join(str(p) for p in plots))
    lines.append("  (constants, their sources and the experts' assumed size: report.md beside the plots)")
    return "\n".join(lines)
