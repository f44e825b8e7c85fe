"""``moeless package``: split an MoE checkpoint into a backbone and verified per-expert ONNX files.

Steps:
  1. Open the checkpoint lazily and identify the architecture (refusing what we cannot split).
  2. Build the model on the meta device to learn which layers hold routed experts and the
     in-memory name of every backbone tensor.
  3. Write the backbone: every non-expert tensor (in shards of bounded size), config and
     tokenizer files.
  4. Export each (layer, expert) to ONNX, verify it against torch, write it atomically; in
     parallel with ``jobs`` threads. Peak memory is the backbone shard being written plus
     ``jobs`` experts.
  5. Write ``manifest.json`` last: until then the folder is not a package ``verify`` accepts.

Resuming: a journal (``.journal.jsonl``) records each finished file with a fingerprint of
what it was made from. A re-run reuses a file when its fingerprint and sha256 still match.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from moeless.contracts.manifest import MANIFEST_NAME, ExpertEntry, FileEntry, Manifest
from moeless.errors import CheckpointError, PackagingError
from moeless.fileio import sha256_file, write_bytes_atomic, write_json_atomic, write_with_atomic
from moeless.model.archs import ArchSpec, expert_activation_params, routing_params, spec_for_config
from moeless.model.checkpoint import INDEX_NAME, LazyCheckpoint
from moeless.model.expert_weights import ExpertSource, expert_tensor_names, find_expert_sources, read_expert
from moeless.model.export import (
    DTYPES,
    FP32_MAX_ABS_ERROR,
    ExpertSpec,
    build_expert_model,
    verify_expert_model,
)
from moeless.model.layout import (
    MoeLayout,
    backbone_state_keys,
    build_meta_model,
    checkpoint_to_module_names,
    moe_layout,
    tied_keys,
)
from moeless.version import __version__

FORMAT_VERSION = "1"  # bump when the ONNX graph or backbone format changes: invalidates resumes
JOURNAL_NAME = ".journal.jsonl"
BACKBONE_DIR = "backbone"
EXPERTS_DIR = "experts"
DEFAULT_SHARD_BYTES = 2 * 1024**3
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx")


@dataclass
class PackageReport:
    """What a packaging run did, for the CLI summary."""

    manifest: Manifest
    experts_exported: int
    experts_reused: int
    seconds: float
    expert_bytes_written: int

    @property
    def throughput_mb_s(self) -> float:
        return self.expert_bytes_written / 1e6 / max(self.seconds, 1e-9)


def expert_file_name(layer: int, expert: int) -> str:
    """Relative path of one expert's ONNX file, e.g. ``experts/L003_E017.onnx``."""
    return f"{EXPERTS_DIR}/L{layer:03d}_E{expert:03d}.onnx"


class Journal:
    """Append-only record of finished files: ``{"key", "fingerprint", "record"}`` per line.

    A torn last line (crash mid-append) is ignored; the file it described is redone.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                    self.entries[entry["key"]] = entry
                except (ValueError, KeyError, TypeError):
                    continue

    def reusable(self, key: str, fingerprint: str, root: Path) -> dict[str, Any] | None:
        """The recorded result for ``key`` if made from the same inputs and every file is intact."""
        entry = self.entries.get(key)
        if not entry or entry.get("fingerprint") != fingerprint:
            return None
        files = entry["record"].get("files") or [entry["record"]]
        for item in files:
            path = root / item["file"]
            if (
                not path.is_file()
                or path.stat().st_size != item["bytes"]
                or sha256_file(path) != item["sha256"]
            ):
                return None
        return entry["record"]

    def add(self, key: str, fingerprint: str, record: dict[str, Any]) -> None:
        line = json.dumps({"key": key, "fingerprint": fingerprint, "record": record}) + "\n"
        with open(self.path, "a") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        self.entries[key] = {"key": key, "fingerprint": fingerprint, "record": record}


def _load_config(model_dir: Path) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raise CheckpointError(f"cannot read {model_dir}/config.json as a transformers config: {exc}") from exc


def _num_experts(config: Any, spec: ArchSpec) -> int:
    return int(getattr(config, spec.num_experts_attr))


def _top_k(config: Any) -> int:
    return int(config.num_experts_per_tok)


def _check_sources(sources: dict[tuple[int, int], ExpertSource], layout: MoeLayout) -> None:
    missing = [
        (layer, expert)
        for layer in layout.moe_layers
        for expert in range(layout.num_experts)
        if (layer, expert) not in sources
    ]
    if missing:
        layer, expert = missing[0]
        raise CheckpointError(
            f"the checkpoint lacks {len(missing)} routed experts the config declares "
            f"(first: layer {layer} expert {expert}); is a shard or the index incomplete?"
        )


# -- backbone ---------------------------------------------------------------------------------------


def _backbone_plan(checkpoint: LazyCheckpoint, meta_model: Any, layout: MoeLayout, expert_names: set[str]):
    """Map each backbone checkpoint key to its module name; check nothing the model needs is missing."""
    to_module = checkpoint_to_module_names(meta_model)
    wanted = backbone_state_keys(meta_model, layout)
    mapping: dict[str, str] = {}
    skipped: list[str] = []
    for key in checkpoint.names():
        if key in expert_names:
            continue
        module_key = to_module(key)
        if module_key in wanted:
            mapping[key] = module_key
        else:
            skipped.append(key)  # e.g. DeepSeek-V3's multi-token-prediction layer, which transformers ignores
    absent = sorted(wanted - set(mapping.values()) - tied_keys(meta_model))
    if absent:
        raise CheckpointError(
            f"the checkpoint lacks {len(absent)} backbone tensors the model needs (first: {absent[0]!r})"
        )
    return mapping, skipped


def _copy_to(src: Path, tmp: Path) -> None:
    shutil.copyfile(src, tmp)


def _copy_side_files(model_dir: Path, out_dir: Path) -> list[FileEntry]:
    """Copy config, generation config and tokenizer files (every top-level non-weight file)."""
    entries = []
    for src in sorted(model_dir.iterdir()):
        if not src.is_file() or src.name.endswith(_WEIGHT_SUFFIXES) or src.name == INDEX_NAME:
            continue
        if src.name.startswith("."):
            continue
        rel = f"{BACKBONE_DIR}/{src.name}"
        write_with_atomic(out_dir / rel, partial(_copy_to, src))
        entries.append(FileEntry(rel, (out_dir / rel).stat().st_size, sha256_file(out_dir / rel)))
    return entries


def _write_backbone_shards(
    checkpoint: LazyCheckpoint, mapping: dict[str, str], out_dir: Path, max_shard_bytes: int
) -> tuple[list[FileEntry], int, str]:
    """Write backbone tensors under their module names, one bounded shard at a time."""
    from safetensors.torch import save_file

    entries: list[FileEntry] = []
    num_params, dtypes = 0, set()
    shard: dict[str, Any] = {}
    shard_bytes = 0

    def flush() -> None:
        nonlocal shard, shard_bytes
        rel = f"{BACKBONE_DIR}/backbone-{len(entries) + 1:05d}.safetensors"
        write_with_atomic(out_dir / rel, lambda tmp: save_file(shard, tmp, metadata={"format": "pt"}))
        entries.append(FileEntry(rel, (out_dir / rel).stat().st_size, sha256_file(out_dir / rel)))
        shard, shard_bytes = {}, 0

    for key in sorted(mapping):
        tensor = checkpoint.read(key).contiguous()
        size = tensor.numel() * tensor.element_size()
        if shard and shard_bytes + size > max_shard_bytes:
            flush()
        shard[mapping[key]] = tensor
        shard_bytes += size
        num_params += tensor.numel()
        dtypes.add(str(tensor.dtype).removeprefix("torch."))
    if shard:
        flush()
    return entries, num_params, "+".join(sorted(dtypes))


def _package_backbone(
    checkpoint: LazyCheckpoint,
    mapping: dict[str, str],
    out_dir: Path,
    journal: Journal,
    max_shard_bytes: int,
) -> dict[str, Any]:
    fingerprint = checkpoint.fingerprint(sorted(mapping)) + f"|{FORMAT_VERSION}|{max_shard_bytes}"
    side = _copy_side_files(checkpoint.model_dir, out_dir)
    record = journal.reusable("backbone", fingerprint, out_dir)
    if record is None:
        shards, num_params, dtype = _write_backbone_shards(checkpoint, mapping, out_dir, max_shard_bytes)
        record = {"files": [asdict(e) for e in shards], "num_params": num_params, "dtype": dtype}
        journal.add("backbone", fingerprint, record)
    return {
        "dtype": record["dtype"],
        "num_params": record["num_params"],
        "files": [asdict(e) for e in side] + record["files"],
    }


# -- experts ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportSettings:
    """What every expert export of one run shares."""

    checkpoint: LazyCheckpoint
    spec: ExpertSpec
    dtype: str
    out_dir: Path
    threads: int  # onnxruntime threads per verification session
    fp32_atol: float

    def fingerprint(self, source: ExpertSource) -> str:
        """Changes when anything the expert's file is made from changes."""
        spec = json.dumps(asdict(self.spec), sort_keys=True)
        inputs = self.checkpoint.fingerprint(source.tensor_names)
        return f"{inputs}|{source.expert}|{self.dtype}|{FORMAT_VERSION}|{spec}"


def _export_expert(settings: ExportSettings, source: ExpertSource) -> ExpertEntry:
    """Read, export, verify and atomically write one expert."""
    weights = read_expert(settings.checkpoint, source)
    name = f"L{source.layer:03d}_E{source.expert:03d}"
    model_bytes = build_expert_model(weights, settings.spec, settings.dtype, name)
    result = verify_expert_model(
        model_bytes,
        weights,
        settings.spec,
        settings.dtype,
        seed=source.layer * 100_003 + source.expert,
        threads=settings.threads,
        fp32_atol=settings.fp32_atol,
    )
    rel = expert_file_name(source.layer, source.expert)
    write_bytes_atomic(settings.out_dir / rel, model_bytes)
    return ExpertEntry(
        layer=source.layer,
        expert=source.expert,
        file=rel,
        bytes=len(model_bytes),
        sha256=hashlib.sha256(model_bytes).hexdigest(),
        max_abs_error=result.max_abs_error,
        rel_rms_error=result.rel_rms_error,
    )


def _package_experts(
    settings: ExportSettings, sources: list[ExpertSource], journal: Journal, jobs: int, progress: bool
) -> tuple[list[ExpertEntry], int, int]:
    """Export every expert not already done; return entries (sorted), bytes written, reused count."""
    from tqdm import tqdm

    entries: dict[tuple[int, int], ExpertEntry] = {}
    todo: list[ExpertSource] = []
    for source in sources:
        key = f"expert:{source.layer}:{source.expert}"
        record = journal.reusable(key, settings.fingerprint(source), settings.out_dir)
        if record is not None:
            entries[(source.layer, source.expert)] = ExpertEntry(**record)
        else:
            todo.append(source)
    reused = len(entries)
    written = 0
    bar = tqdm(total=len(todo), desc="experts", unit="expert", disable=not progress, dynamic_ncols=True)
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="moeless-export") as pool:
        futures = {pool.submit(_export_expert, settings, source): source for source in todo}
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                # Journal every success before re-raising a failure, so a re-run resumes from them.
                for future in sorted(done, key=lambda f: f.exception() is not None):
                    entry = future.result()
                    source = futures[future]
                    journal.add(
                        f"expert:{source.layer}:{source.expert}", settings.fingerprint(source), asdict(entry)
                    )
                    entries[(entry.layer, entry.expert)] = entry
                    written += entry.bytes
                    bar.update(1)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        finally:
            bar.close()
    return [entries[key] for key in sorted(entries)], written, reused


# -- entry point ------------------------------------------------------------------------------------


def package(
    model_dir: Path,
    out_dir: Path,
    dtype: str = "fp32",
    jobs: int = 1,
    progress: bool = True,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    fp32_atol: float = FP32_MAX_ABS_ERROR,
    log: Callable[[str], None] = lambda _msg: None,
) -> PackageReport:
    """Split ``model_dir`` into ``out_dir`` (see the module docstring for the steps).

    Raises:
        CheckpointError / UnsupportedArchitectureError: bad or unsupported input.
        PackagingError: an expert failed verification or a write failed (e.g. disk full).
    """
    if dtype not in DTYPES:
        raise PackagingError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if jobs < 1:
        raise PackagingError("--jobs must be at least 1")
    start = time.perf_counter()
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    # 1. Checkpoint and architecture.
    checkpoint = LazyCheckpoint(model_dir)
    config = _load_config(model_dir)
    arch = spec_for_config(config)
    # 2. Structure from the meta model.
    meta_model = build_meta_model(config)
    layout = moe_layout(meta_model, _num_experts(config, arch))
    if not layout.moe_layers:
        raise CheckpointError(f"{arch.display_name} model in {model_dir} has no routed-expert layers")
    sources = {
        key: src
        for key, src in find_expert_sources(checkpoint, layout.num_experts).items()
        if key[0] in layout.experts_modules
    }
    _check_sources(sources, layout)
    mapping, skipped = _backbone_plan(checkpoint, meta_model, layout, expert_tensor_names(sources))
    del meta_model
    log(
        f"{arch.display_name}: {len(layout.moe_layers)} MoE layers x {layout.num_experts} experts "
        f"(hidden {layout.hidden_size}, intermediate {layout.intermediate_size}), top-{_top_k(config)}"
    )
    # 3. Output folder: drop any old manifest first, so a failed run never looks complete.
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
    journal = Journal(out_dir / JOURNAL_NAME)
    backbone = _package_backbone(checkpoint, mapping, out_dir, journal, max_shard_bytes)
    # 4. Experts.
    expert_spec = ExpertSpec(
        arch.expert_kind, layout.hidden_size, layout.intermediate_size, expert_activation_params(config, arch)
    )
    settings = ExportSettings(
        checkpoint=checkpoint,
        spec=expert_spec,
        dtype=dtype,
        out_dir=out_dir,
        threads=max(1, (os.cpu_count() or 1) // jobs),
        fp32_atol=fp32_atol,
    )
    entries, written, reused = _package_experts(settings, list(sources.values()), journal, jobs, progress)
    # 5. Manifest, last.
    seconds = time.perf_counter() - start
    manifest = Manifest(
        moeless_version=__version__,
        architecture=arch.model_type,
        display_name=arch.display_name,
        num_layers=int(config.num_hidden_layers),
        moe_layers=layout.moe_layers,
        num_experts=layout.num_experts,
        top_k=_top_k(config),
        routing={"rule": arch.routing, "params": routing_params(config, arch)},
        hidden_size=layout.hidden_size,
        intermediate_size=layout.intermediate_size,
        expert_kind=arch.expert_kind,
        activation=expert_spec.activation,
        dtype=dtype,
        backbone=backbone | {"skipped_tensors": len(skipped)},
        experts=entries,
        stats={
            "seconds": round(seconds, 3),
            "exported": len(entries) - reused,
            "reused": reused,
            "fp32_atol": fp32_atol,
        },
    )
    write_json_atomic(out_dir / MANIFEST_NAME, manifest.to_dict())
    return PackageReport(manifest, len(entries) - reused, reused, seconds, written)
