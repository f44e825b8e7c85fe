"""``moeless package``: split a checkpoint into backbone + verified per-expert ONNX files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from cli.options import echo_step, quiet_option

if TYPE_CHECKING:
    from moeless.model.packaging import PackageReport


def package_summary(report: PackageReport, artifacts: Path) -> str:
    """A few lines a user reads after packaging."""
    m = report.manifest
    expert_bytes = sum(e.bytes for e in m.experts)
    backbone_bytes = sum(f["bytes"] for f in m.backbone["files"])
    worst_abs = max(e.max_abs_error for e in m.experts)
    worst_rel = max(e.rel_rms_error for e in m.experts)
    return "\n".join(
        [
            f"packaged {m.display_name} into {artifacts}",
            f"  experts   {len(m.experts)} ONNX files ({len(m.moe_layers)} layers x {m.num_experts}), "
            f"{m.dtype}, {expert_bytes / 1e6:.1f} MB; exported {report.experts_exported}, "
            f"reused {report.experts_reused}",
            f"  backbone  {m.backbone['num_params'] / 1e6:.2f} M params ({m.backbone['dtype']}), "
            f"{backbone_bytes / 1e6:.1f} MB in {len(m.backbone['files'])} files",
            f"  routing   {m.routing['rule']}, top-{m.top_k}",
            f"  vs torch  max abs error {worst_abs:.2e}, max relative RMS error {worst_rel:.2e}",
            f"  time      {report.seconds:.1f} s"
            + (f", {report.throughput_mb_s:.1f} MB/s of experts" if report.experts_exported else ""),
        ]
    )


@click.command()
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    "output",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Artifacts folder to write (created; an interrupted run here resumes).",
)
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "fp16", "int8"]),
    default="fp32",
    show_default=True,
    help="Storage of expert weights: fp32 (verified to 1e-4), fp16 (half size), int8 (dynamic quant).",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Experts exported in parallel.",
)
@click.option(
    "--fp32-atol",
    type=click.FloatRange(min=0, min_open=True),
    default=1e-4,
    show_default=True,
    help="Largest max-abs error against torch an fp32 expert may have (on unit-scale inputs).",
)
@quiet_option
def package(model_dir: Path, output: Path, dtype: str, jobs: int, fp32_atol: float, quiet: bool) -> None:
    """Split the MoE checkpoint in MODEL_DIR into a backbone and one verified ONNX file per expert."""
    from moeless.model.packaging import package as run_package

    report = run_package(
        model_dir,
        output,
        dtype=dtype,
        jobs=jobs,
        progress=not quiet,
        fp32_atol=fp32_atol,
        log=lambda msg: echo_step(msg, quiet),
    )
    click.echo(package_summary(report, output))
