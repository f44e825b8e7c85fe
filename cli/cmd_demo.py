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
from cli.running import expert_task_root
from moeless.checkout import SHARED_DATA
from moeless.demo.steps import PLAN_POLICIES, SIMULATED_S, SLO_FLOOR_FACTOR, SLO_TTFT_MS, SPECULATE

SHARED_PROMPTS = SHARED_DATA / "prompts" / "dev.jsonl"
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
    type=click.Choice([str(p) for p in PLAN_POLICIES]),
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
    from moeless.contracts.manifest import load_manifest
    from moeless.demo.steps import (
        demo_prompts,
        demo_report,
        plan_every_policy,
        predicted_vs_actual,
        profile_or_reuse,
        same_as_unsplit,
        simulate_policies,
        size_for_demo_slo,
        speculation_line,
    )
    from moeless.model.packaging import package
    from moeless.model.training import DraftSpec, TrainSpec, trained_draft, trained_model

    start = time.perf_counter()

    def step(number: int, message: str) -> None:
        echo_step(f"[{number}/{STEPS}] {message}  ({time.perf_counter() - start:.0f} s)", quiet)

    def say(message: str) -> None:
        echo_step(f"      {message}", quiet)

    step(1, "the demo model: a small Mixtral trained on Python's documentation (cached after the first run)")
    model_dir = trained_model(workdir / "models", TrainSpec(steps=train_steps), progress=not quiet)
    say("and a small dense draft with its tokenizer, for speculative decoding (cached too)")
    draft_dir = trained_draft(model_dir, DraftSpec(steps=train_steps), progress=not quiet)
    step(2, "package: backbone + one ONNX file per expert, each checked against torch")
    artifacts = workdir / model_dir.name
    package(model_dir, artifacts, progress=not quiet)
    manifest = load_manifest(artifacts)
    step(3, "profile: record which experts each prompt's tokens are routed to")
    trace_dir = profile_or_reuse(
        model_dir, workdir / "trace", demo_prompts(prompts_path), max_tokens, say, progress=not quiet
    )
    step(4, f"plan with each policy ({', '.join(PLAN_POLICIES)}) from the profiled loads")
    plans = plan_every_policy(trace_dir, manifest, workdir / "plans")
    say(
        f"size moeless's concurrency for p99 TPOT <= {SLO_FLOOR_FACTOR:g}x the Lambda floor and p99 TTFT "
        f"<= {SLO_TTFT_MS:g} ms (simulated)"
    )
    plans["moeless"], sized = size_for_demo_slo(trace_dir, manifest, workdir / "plans")
    step(5, f"serve the {policy} plan locally and answer prompts through the REST endpoint")
    answers, bill, counters = _serve_and_ask(
        artifacts, workdir / "plans" / f"{policy}.json", trace_dir, draft_dir, max_tokens, quiet
    )
    step(6, "check the answers token for token against the unsplit model; predict one request's experts")
    same = same_as_unsplit(model_dir, answers, max_tokens)
    prediction = predicted_vs_actual(trace_dir)
    step(7, f"simulate every policy on {SIMULATED_S:.0f} s of bursty traffic replayed from the trace")
    rows, plots = simulate_policies(trace_dir, workdir / "report", {"moeless": plans["moeless"]})
    report = demo_report(
        answers, same, prediction, plans, policy, bill, rows, plots, sized, speculation_line(counters)
    )
    (workdir / "report").mkdir(parents=True, exist_ok=True)
    (workdir / "report" / "demo.md").write_text(report + "\n")
    click.echo(report)
    click.echo(f"\ndemo took {time.perf_counter() - start:.0f} s; report: {workdir / 'report' / 'demo.md'}")
    if not all(same):
        raise click.ClickException("the split system's tokens differ from the unsplit model's")


def _serve_and_ask(
    artifacts: Path, plan_path: Path, trace_dir: Path, draft_dir: Path, max_tokens: int, quiet: bool
):
    import urllib.request

    from backbone_service.local import running_service
    from moeless.contracts.plan import load_plan
    from moeless.demo.prompts import DEMO_PROMPTS
    from moeless.lambda_host.experts import start_expert_host
    from moeless.serving.backbone import BackboneConfig

    plan = load_plan(plan_path)
    config = BackboneConfig(
        artifacts,
        plan_path,
        predictor_trace=trace_dir,
        max_batch=8,
        speculate=SPECULATE,
        draft_model=draft_dir,
    )

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
        assert host is not None
        say(f"REST endpoint {server.url}/v1, {len(plan.functions)} functions on {host.endpoint_url}")
        with ThreadPoolExecutor(len(DEMO_PROMPTS)) as pool:  # concurrent: they share decode steps
            replies = list(pool.map(lambda p: ask(server.url, backbone.model_name, p), DEMO_PROMPTS))
        answers = [(p, r["choices"][0]["text"]) for p, r in zip(DEMO_PROMPTS, replies, strict=True)]
        counters = backbone.stats.snapshot()["counters"]
    return answers, host.meter.snapshot(), counters
