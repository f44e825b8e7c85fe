"""Routing traces: what a model's routers chose for every token of real prompts.

``moeless profile`` runs the model in-process (a checkpoint folder, or a package with its experts
in onnxruntime) over prompts, greedy-decoding ``max_new_tokens`` after each, and records for every
token and every MoE layer the router's top-k experts and gate weights, for prefill and decode.

A trace is a folder::

    meta.json      model, architecture, moe_layers, num_experts, top_k, hidden_size, counts
    prompts.jsonl  {"request", "prompt", "prompt_tokens", "generated_tokens"} per request
    routing.npz    request[N] int32, position[N] int32, phase[N] int8 (0 prefill, 1 decode),
                   experts[L, N, k] int16, weights[L, N, k] float16,
                   hidden_rows[M] int32, hidden[L, M, H] float16  (router inputs of sampled tokens)

N tokens over all requests, L MoE layers in ``moe_layers`` order. ``moeless trace loads`` reduces
it to the loads JSON of docs/design.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moeless.contracts.loads import Loads
from moeless.errors import MoelessError
from moeless.fileio import atomic_path, write_json_atomic
from moeless.model.layout import experts_modules
from moeless.model.reference import eos_token_ids

SCHEMA_VERSION = 1


class TraceError(MoelessError):
    """A trace or prompt file is missing or malformed."""


def jsonl_rows(path: Path, what: str = "") -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line of a JSONL file; :class:`TraceError` names
    the file (``what`` says what it holds) or the line that is not JSON."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise TraceError(f"cannot read {what}{path}: {exc.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except ValueError:
            raise TraceError(f"{path}:{number} is not JSON") from None


def read_prompts(path: Path, limit: int | None = None) -> list[str]:
    """Prompts from a JSONL file with a ``prompt`` field per line."""
    prompts = []
    for number, row in jsonl_rows(path, "prompts "):
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise TraceError(f'{path}:{number} has no "prompt" string')
        prompts.append(row["prompt"])
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise TraceError(f"{path} holds no prompts")
    return prompts


def router_weights(model: Any) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:
    """layer -> (gate weight [E, H], bias [E] or None): each MoE layer's linear router."""
    routers = {}
    for layer, module in experts_modules(model).items():
        parent = model.get_submodule(_parent_path(model, module))
        gate = getattr(parent, "gate", None) or getattr(parent, "router", None)
        weight = getattr(gate, "weight", None)
        if weight is None:
            continue
        bias = getattr(gate, "bias", None)
        if bias is None:
            bias = getattr(gate, "e_score_correction_bias", None)
        routers[layer] = (
            weight.detach().float().cpu().numpy(),
            None if bias is None else bias.detach().float().cpu().numpy(),
        )
    return routers


def _parent_path(model: Any, module: Any) -> str:
    for name, candidate in model.named_modules():
        if candidate is module:
            return name.rpartition(".")[0]
    raise KeyError("module not in model")


class _Recorder:
    """Forward pre-hooks on every experts module: (hidden, top_k_index, top_k_weights) per call."""

    def __init__(self, model: Any) -> None:
        self.modules = experts_modules(model)
        self.layers = sorted(self.modules)
        self.calls: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {
            layer: [] for layer in self.layers
        }
        self._handles = [
            module.register_forward_pre_hook(self._hook(layer)) for layer, module in self.modules.items()
        ]

    def _hook(self, layer: int):
        def hook(module: Any, args: tuple) -> None:
            hidden, index, weights = args[0], args[1], args[2]
            self.calls[layer].append(
                (
                    hidden.detach().float().cpu().numpy().reshape(-1, hidden.shape[-1]),
                    index.detach().cpu().numpy().astype(np.int16),
                    weights.detach().float().cpu().numpy().astype(np.float16),
                )
            )

        return hook

    def drain(self) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        taken = {
            layer: (
                np.concatenate([c[0] for c in calls]),
                np.concatenate([c[1] for c in calls]),
                np.concatenate([c[2] for c in calls]),
            )
            for layer, calls in self.calls.items()
        }
        for calls in self.calls.values():
            calls.clear()
        return taken

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def load_model(source: Path) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, description) from a checkpoint folder or a package."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = Path(source)
    if (source / "manifest.json").is_file():
        from moeless.contracts.manifest import load_manifest
        from moeless.model.split import load_split_model

        manifest = load_manifest(source)
        model = load_split_model(source, manifest=manifest)
        tokenizer = AutoTokenizer.from_pretrained(source / "backbone", local_files_only=True)
        return (
            model,
            tokenizer,
            {
                "architecture": manifest.architecture,
                "num_experts": manifest.num_experts,
                "top_k": manifest.top_k,
            },
        )
    if not (source / "config.json").is_file():
        raise TraceError(f"{source} is neither a package (manifest.json) nor a checkpoint (config.json)")
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    config = model.config
    experts = (
        getattr(config, "num_local_experts", None)
        or getattr(config, "num_experts", None)
        or getattr(config, "n_routed_experts", None)
    )
    if experts is None:
        raise TraceError(f"{source} is not a Mixture-of-Experts model: its config names no experts")
    return (
        model,
        tokenizer,
        {
            "architecture": config.model_type,
            "num_experts": int(experts),
            "top_k": int(config.num_experts_per_tok or 0),
        },
    )


def profile(
    source: Path,
    prompts: list[str],
    out_dir: Path,
    max_new_tokens: int = 32,
    hidden_sample_rate: float = 0.0,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Run ``source`` over ``prompts`` and write a trace to ``out_dir``."""
    import torch
    from tqdm import tqdm

    model, tokenizer, info = load_model(source)
    recorder = _Recorder(model)
    if not recorder.layers:
        raise TraceError(f"{source} has no routed-expert layers to trace")
    eos_ids = eos_token_ids(model)
    rng = np.random.default_rng(seed)
    columns: dict[str, list[np.ndarray]] = {"request": [], "position": [], "phase": []}
    experts: dict[int, list[np.ndarray]] = {layer: [] for layer in recorder.layers}
    weights: dict[int, list[np.ndarray]] = {layer: [] for layer in recorder.layers}
    hidden: dict[int, list[np.ndarray]] = {layer: [] for layer in recorder.layers}
    hidden_rows: list[np.ndarray] = []
    rows = 0
    records = []
    try:
        for request, prompt in enumerate(
            tqdm(prompts, desc="profiling", unit="prompt", disable=not progress)
        ):
            ids = tokenizer(prompt)["input_ids"][: model.config.max_position_embeddings - max_new_tokens]
            cache, step_ids = None, ids
            generated: list[int] = []
            with torch.inference_mode():
                for step in range(max_new_tokens + 1):
                    out = model(
                        input_ids=torch.tensor([step_ids]),
                        past_key_values=cache,
                        use_cache=True,
                        logits_to_keep=1,
                    )
                    cache = out.past_key_values
                    taken = recorder.drain()
                    count = len(step_ids)
                    positions = np.arange(count) + (0 if step == 0 else len(ids) + len(generated) - 1)
                    columns["request"].append(np.full(count, request, np.int32))
                    columns["position"].append(positions.astype(np.int32))
                    columns["phase"].append(np.full(count, 0 if step == 0 else 1, np.int8))
                    sampled = np.flatnonzero(rng.random(count) < hidden_sample_rate)
                    for layer, (h, index, w) in taken.items():
                        experts[layer].append(index)
                        weights[layer].append(w)
                        if len(sampled):
                            hidden[layer].append(h[sampled].astype(np.float16))
                    if len(sampled):
                        hidden_rows.append((rows + sampled).astype(np.int32))
                    rows += count
                    if step == max_new_tokens:
                        break
                    token = int(torch.argmax(out.logits[0, -1]))
                    if token in eos_ids:
                        break
                    generated.append(token)
                    step_ids = [token]
            records.append(
                {
                    "request": request,
                    "prompt": prompt,
                    "prompt_tokens": len(ids),
                    "generated_tokens": len(generated),
                }
            )
    finally:
        recorder.close()
    layers = recorder.layers
    hidden_size = int(model.config.hidden_size)
    arrays = {
        "request": np.concatenate(columns["request"]),
        "position": np.concatenate(columns["position"]),
        "phase": np.concatenate(columns["phase"]),
        "experts": np.stack([np.concatenate(experts[layer]) for layer in layers]),
        "weights": np.stack([np.concatenate(weights[layer]) for layer in layers]),
        "hidden_rows": np.concatenate(hidden_rows) if hidden_rows else np.zeros(0, np.int32),
        "hidden": (
            np.stack([np.concatenate(hidden[layer]) for layer in layers])
            if hidden_rows
            else np.zeros((len(layers), 0, hidden_size), np.float16)
        ),
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir / "routing.npz") as tmp, open(tmp, "wb") as f:
        np.savez_compressed(f, allow_pickle=False, **arrays)
    with atomic_path(out_dir / "prompts.jsonl") as tmp:
        Path(tmp).write_text("".join(json.dumps(r) + "\n" for r in records))
    write_json_atomic(
        out_dir / "meta.json",
        {
            "schema_version": SCHEMA_VERSION,
            "model": str(Path(source).resolve()),
            **info,
            "moe_layers": layers,
            "hidden_size": hidden_size,
            "requests": len(records),
            "tokens": rows,
            "max_new_tokens": max_new_tokens,
            "hidden_sample_rate": hidden_sample_rate,
            "hidden_samples": len(arrays["hidden_rows"]),
        },
    )
    return out_dir


@dataclass
class Trace:
    """A loaded trace (see the module docstring for the arrays)."""

    meta: dict[str, Any]
    prompts: list[dict[str, Any]]
    request: np.ndarray
    position: np.ndarray
    phase: np.ndarray
    experts: np.ndarray
    weights: np.ndarray
    hidden_rows: np.ndarray
    hidden: np.ndarray

    @property
    def layers(self) -> list[int]:
        return list(self.meta["moe_layers"])

    @property
    def num_experts(self) -> int:
        return int(self.meta["num_experts"])

    def loads(self, phase: str = "all", requests: np.ndarray | None = None) -> Loads:
        """Tokens routed to each expert per layer (each token counts once per chosen expert)."""
        mask = np.ones(len(self.request), bool)
        if phase != "all":
            mask &= self.phase == (0 if phase == "prefill" else 1)
        if requests is not None:
            mask &= np.isin(self.request, requests)
        layers = {
            layer: np.bincount(
                self.experts[i][mask].ravel().astype(np.int64), minlength=self.num_experts
            ).astype(float)
            for i, layer in enumerate(self.layers)
        }
        meta = {
            key: self.meta[key]
            for key in ("model", "architecture", "num_experts", "top_k")
            if key in self.meta
        }
        return Loads(layers, meta | {"phase": phase, "num_tokens": int(mask.sum())})


def load_trace(path: Path) -> Trace:
    path = Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
        prompts = [json.loads(line) for line in (path / "prompts.jsonl").read_text().splitlines() if line]
        with np.load(path / "routing.npz") as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError, KeyError) as exc:
        raise TraceError(f"{path} is not a readable trace: {exc}") from None
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise TraceError(f"{path}: trace schema_version {meta.get('schema_version')!r} is not supported")
    return Trace(meta | {"trace_dir": str(path)}, prompts, **arrays)
