"""What packaging a real checkpoint takes: disk, RAM and time per storage dtype for each preset.

Nobody can download Mixtral-8x7B here, so the costs that grow with the model are measured on
checkpoints with the presets' own expert shapes (their real hidden and intermediate sizes, one
MoE layer of 2 and of N experts, random weights) and scaled to the whole model:

* **time**: each shape and dtype is packaged twice (`moeless package --jobs 2`, a fresh process
  each), with 2 experts and with N (about 1.5 GB of fp32 experts, 4 to 32); the difference of the
  packaging times the manifests record, over N - 2, is one expert's wall time with two in flight
  (read, ONNX export, quantisation, verification against torch, sha256, atomic write). The whole
  model: the 2-expert run plus that time for each of its other experts. It assumes the
  checkpoint is on a local disk that reads faster than packaging consumes it (here about
  40-120 MB/s of fp32 experts) and this machine's cores (the header says which).
* **RAM**: the N-expert run's peak RSS, plus one backbone shard of packaging's default size (2 GB,
  or the whole backbone where that is smaller): packaging memory-maps the checkpoint and holds one
  backbone shard and ``--jobs`` experts at a time (tests/model/test_packaging_memory.py).
* **disk**: the package, from the files written per expert parameter in the measured runs
  (ONNX framing and int8 scales included) times the preset's routed parameters, plus its backbone
  copied in bf16; and the bf16 checkpoint it is made from, which packaging needs beside it.

The presets' parameter counts come from their published config.json (moeless/model/shapes.py).
Writes benchmarks/results/package_footprint.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common import REPO, write_result

from moeless.model.packaging import DEFAULT_SHARD_BYTES
from moeless.model.shapes import PRESETS, ModelShape

DTYPES = ("fp32", "fp16", "int8")
JOBS = 2
FEW_EXPERTS = 2
MANY_EXPERTS_BYTES = 1.5e9  # fp32 experts in the larger run: enough that their time dwarfs the noise
# The preset -> the tiny builder's architecture with the same expert math.
ARCH_OF = {
    "mixtral-8x7b": "mixtral",
    "olmoe-1b-7b": "olmoe",
    "gpt-oss-20b": "gpt_oss",
    "gpt-oss-120b": "gpt_oss",
    "qwen3-30b-a3b": "qwen3_moe",
    "qwen3-235b-a22b": "qwen3_moe",
    "deepseek-v3": "deepseek_v3",
}
GB = 1e9


@dataclass(frozen=True)
class Run:
    """One `moeless package` process."""

    seconds: float
    peak_rss_bytes: int
    expert_file_bytes: int


@dataclass(frozen=True)
class Measured:
    """One expert shape in one dtype: the runs with few and with many experts."""

    few: Run
    many: Run
    many_experts: int

    @property
    def seconds_per_expert(self) -> float:
        return max(self.many.seconds - self.few.seconds, 0.0) / (self.many_experts - FEW_EXPERTS)

    def file_bytes_per_param(self, expert_params: int) -> float:
        return self.many.expert_file_bytes / (self.many_experts * expert_params)


def package_once(model_dir: Path, out: Path, dtype: str) -> Run:
    """Package in a fresh process: the packaging time its manifest records (interpreter start-up
    left out), its peak RSS (from wait4: this child alone) and the expert files' bytes."""
    command = [str(REPO / ".venv" / "bin" / "moeless"), "package", str(model_dir), "-o", str(out)]
    proc = subprocess.Popen([*command, "--dtype", dtype, "--jobs", str(JOBS), "--quiet"])
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.exit(f"moeless package failed ({proc.returncode}) on {model_dir} --dtype {dtype}")
    seconds = json.loads((out / "manifest.json").read_text())["stats"]["seconds"]
    files = sum(p.stat().st_size for p in (out / "experts").glob("*.onnx"))
    return Run(seconds, usage.ru_maxrss * 1024, files)


def build_checkpoint(out: Path, arch: str, shape: ModelShape, experts: int) -> Path:
    """A random checkpoint with one MoE layer of ``shape``'s experts, built in a child process: the
    packaging runs are forked from this one, and a fork starts with (and its peak RSS counts) the
    parent's memory, which building a 4096-wide model in here would fill."""
    layers = 2 if arch == "deepseek_v3" else 1  # the tiny DeepSeek-V3's first layer is dense
    command = [str(REPO / ".venv" / "bin" / "moeless"), "model", "tiny", str(out), "--arch", arch]
    sizes = ["--layers", str(layers), "--experts", str(experts), "--hidden", str(shape.hidden)]
    sizes += ["--intermediate", str(shape.expert_intermediate), "--top-k", "2", "-q"]
    subprocess.run([*command, *sizes], check=True)
    return out


def measure_shape(arch: str, shape: ModelShape, scratch: Path) -> dict[str, Measured]:
    """Package one MoE layer of ``shape``'s expert size with few and with many experts, per dtype."""
    many = int(min(32, max(4, round(MANY_EXPERTS_BYTES / shape.expert_bytes("fp32")))))
    models = {}
    for experts in (FEW_EXPERTS, many):
        models[experts] = build_checkpoint(scratch / f"{arch}-{experts}", arch, shape, experts)
    measured = {}
    for dtype in DTYPES:
        few, lots = (package_once(models[n], scratch / f"{arch}-{n}-{dtype}", dtype) for n in models)
        measured[dtype] = Measured(few, lots, many)
        print(
            f"{arch} {shape.hidden}x{shape.expert_intermediate} {dtype}: "
            f"{few.seconds:.1f} s / {lots.seconds:.1f} s for {FEW_EXPERTS} / {many} experts, "
            f"peak {lots.peak_rss_bytes / GB:.2f} GB",
            flush=True,
        )
    return measured


def experts_of(shape: ModelShape) -> int:
    return shape.num_experts * len(shape.moe_layers)


def table(presets: list[str], measured: dict[str, dict[str, Measured]]) -> list[str]:
    rows = [
        "| preset | experts | bf16 checkpoint, GB | `--dtype` | package, GB | peak RAM, GB | time here |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for name in presets:
        shape, arch = PRESETS[name], ARCH_OF[name]
        checkpoint = shape.total_params * 2
        backbone = shape.dense_params * 2
        for dtype in DTYPES:
            m = measured[f"{arch}:{shape.hidden}x{shape.expert_intermediate}"][dtype]
            package = shape.routed_params * m.file_bytes_per_param(shape.expert_params) + backbone
            ram = m.many.peak_rss_bytes + min(DEFAULT_SHARD_BYTES, backbone)
            seconds = m.few.seconds + (experts_of(shape) - FEW_EXPERTS) * m.seconds_per_expert
            rows.append(
                f"| {name} | {experts_of(shape):,} | {checkpoint / GB:,.0f} | {dtype} | {package / GB:,.1f} "
                f"| {ram / GB:.1f} | {duration(seconds)} |"
            )
    return rows


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def measured_rows(measured: dict[str, dict[str, Measured]]) -> list[str]:
    rows = [
        "| expert shape | `--dtype` | few experts, s | many experts, s | s per expert "
        "| file bytes per param | peak RSS (many), GB |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for key, by_dtype in measured.items():
        arch, dims = key.split(":")
        hidden, inter = (int(v) for v in dims.split("x"))
        params = 3 * hidden * inter
        for dtype, m in by_dtype.items():
            rows.append(
                f"| {arch} {dims} | {dtype} | {m.few.seconds:.1f} ({FEW_EXPERTS}) "
                f"| {m.many.seconds:.1f} ({m.many_experts}) | {m.seconds_per_expert:.2f} "
                f"| {m.file_bytes_per_param(params):.3f} | {m.many.peak_rss_bytes / GB:.2f} |"
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--presets", default=",".join(ARCH_OF), help="comma-separated presets (default: all packageable ones)"
    )
    args = parser.parse_args()
    presets = [name.strip() for name in args.presets.split(",") if name.strip()]
    unknown = [name for name in presets if name not in ARCH_OF]
    if unknown:
        parser.error(f"unknown preset {unknown[0]!r}: choose from {', '.join(ARCH_OF)}")
    measured: dict[str, dict[str, Measured]] = {}
    with tempfile.TemporaryDirectory(prefix="moeless-bench-packaging-") as tmp:
        for name in presets:
            shape, arch = PRESETS[name], ARCH_OF[name]
            key = f"{arch}:{shape.hidden}x{shape.expert_intermediate}"
            if key not in measured:
                measured[key] = measure_shape(arch, shape, Path(tmp))
    body = [
        f"Packaging with `--jobs {JOBS}`, scaled from one MoE layer of each preset's real expert shape "
        "(the module docstring says how). The checkpoint must be bf16/fp16/fp32: gpt-oss's MXFP4 and "
        "DeepSeek-V3's fp8 experts are refused, dequantise them to bf16 first (sizes below are of that "
        "bf16 checkpoint).",
        "",
        *table(presets, measured),
        "",
        "## Measured",
        "",
        *measured_rows(measured),
    ]
    print("\n".join(body))
    write_result("package_footprint", "disk, RAM and time to package each preset", body)


if __name__ == "__main__":
    main()
