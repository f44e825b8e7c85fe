"""``moeless demo``: the main job on the embedded default, end to end.

Today: build a tiny Mixtral, package it, verify the artifacts, then answer the demo prompts
with the split model (experts run from their ONNX files) and check every token against the
unsplit model. Re-runs reuse the model and the packaged experts.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from cli.options import echo_step, quiet_option


@click.command()
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".moeless/demo"),
    show_default=True,
    help="Where the demo keeps its model and artifacts (reused on re-runs).",
)
@click.option("--max-new-tokens", type=click.IntRange(1, 256), default=16, show_default=True)
@quiet_option
def demo(workdir: Path, max_new_tokens: int, quiet: bool) -> None:
    """Build a tiny MoE, package it, verify it, and answer prompts through the split model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cli.cmd_package import package_summary
    from moeless.demo_prompts import DEMO_PROMPTS
    from moeless.packaging import package
    from moeless.split_model import load_split_model
    from moeless.tiny import TinySpec, build_tiny_model
    from moeless.verify import verify_artifacts

    start = time.perf_counter()
    model_dir, artifacts = workdir / "model", workdir / "artifacts"
    echo_step("[1/4] tiny Mixtral model", quiet)
    if not (model_dir / "config.json").is_file():
        build_tiny_model(
            model_dir, TinySpec(arch="mixtral", layers=4, experts=8, hidden=128, intermediate=256)
        )
    echo_step("[2/4] package: backbone + one verified ONNX file per expert", quiet)
    report = package(model_dir, artifacts, progress=not quiet)
    click.echo(package_summary(report, artifacts))
    echo_step("[3/4] verify checksums", quiet)
    problems = verify_artifacts(artifacts)
    if problems:
        raise click.ClickException(f"verification failed: {', '.join(map(str, problems))}")
    click.echo(f"verified: {len(report.manifest.all_files())} files match the manifest")
    echo_step("[4/4] answer prompts through the split model, compared with the unsplit model", quiet)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    split = load_split_model(artifacts)
    matches = 0
    for prompt in DEMO_PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            want = reference.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
            got = split.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        same = torch.equal(want, got)
        matches += same
        text = tokenizer.decode(got[0, ids.shape[1] :], skip_special_tokens=True).replace("\n", " ")
        click.echo(f"  {'same' if same else 'DIFFERENT'}  {prompt!r} -> {text!r}")
    click.echo(
        f"split model = unsplit model on {matches}/{len(DEMO_PROMPTS)} prompts "
        f"({max_new_tokens} greedy tokens each); demo took {time.perf_counter() - start:.1f} s"
    )
    if matches != len(DEMO_PROMPTS):
        raise click.ClickException("the split model's tokens differ from the unsplit model's")
