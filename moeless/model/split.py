"""The model rebuilt from artifacts: transformers' own backbone with the routed experts
replaced by :class:`DispatchedExperts`, which hands token rows to an :class:`ExpertExecutor`.

Everything except the experts stays transformers' code: attention, norms, routers (with
each architecture's own routing rule), shared experts. The replacement keeps the experts
module's contract, ``forward(hidden [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]``.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np

from moeless.contracts.manifest import Manifest, load_manifest
from moeless.errors import ArtifactError
from moeless.experts.runtime import ExpertExecutor, OnnxExpertPool, check_backbone_files
from moeless.model.layout import build_meta_model, moe_layout


def _dispatched_experts_class() -> type:
    from torch import nn

    class DispatchedExperts(nn.Module):
        """Drop-in for a layer's fused experts module that runs experts through an executor."""

        def __init__(self, layer: int, num_experts: int, executor: ExpertExecutor) -> None:
            super().__init__()
            self.layer = layer
            self.num_experts = num_experts
            self.executor = executor

        def forward(self, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
            import torch

            # Experts run on CPU (in functions or onnxruntime): route and combine on CPU, then
            # hand the result back on the backbone's device (a no-op on a CPU backbone). The
            # grouping is done in numpy: on a decode step's few rows, each torch call's own
            # overhead would cost more than the work.
            device, dtype = hidden_states.device, hidden_states.dtype
            hidden_states, top_k_index, top_k_weights = (
                t.detach().cpu() for t in (hidden_states, top_k_index, top_k_weights)
            )
            chosen = top_k_index.numpy()  # [T, k]
            k = chosen.shape[1]
            # 1. Group token rows by expert: (token, slot) pairs sorted by expert, stably; rows the
            # executor calls fillers (padding whose output nobody reads) go to no expert.
            fillers = getattr(self.executor, "filler_rows", lambda: None)()
            needed = np.ones(len(chosen), dtype=bool)
            if fillers is not None:
                needed[fillers] = False
            flat = chosen.ravel()
            valid = np.flatnonzero((flat >= 0) & (flat < self.num_experts) & np.repeat(needed, k))
            pairs = valid[np.argsort(flat[valid], kind="stable")]
            tokens = pairs // k
            ids, starts = np.unique(flat[pairs], return_index=True)
            bounds = [*starts.tolist(), len(pairs)]
            groups = [tokens[bounds[i] : bounds[i + 1]] for i in range(len(ids))]
            rows = hidden_states.to(torch.float32).numpy()
            inputs = {int(e): rows[g] for e, g in zip(ids.tolist(), groups, strict=True)}
            # 2. Run every needed expert of this layer (a step coalescer also learns whose rows they
            # are, and a token-level pre-warmer what each token chose).
            observe = getattr(self.executor, "observe_routing", None)
            if observe is not None:
                observe(self.layer, chosen[needed], top_k_weights.float().numpy()[needed])
            record = getattr(self.executor, "record_tokens", None)
            if record is not None:
                record(self.layer, dict(zip(ids.tolist(), groups, strict=True)))
            outputs = self.executor.run(self.layer, inputs)
            # 3. Combine with the routing weights, adding each token's experts in expert order,
            # rounding after each add, as transformers' loop over experts does. In float32 one
            # index_add over the expert-sorted rows does exactly that; in a narrower dtype
            # index_add accumulates one call's additions wider, so there it goes expert by expert.
            final = torch.zeros_like(hidden_states)
            if len(pairs):
                out = torch.from_numpy(np.concatenate([np.asarray(outputs[int(e)]) for e in ids])).to(dtype)
                weighted = out * top_k_weights.reshape(-1)[torch.from_numpy(pairs)].to(dtype)[:, None]
                at = torch.from_numpy(tokens)
                if dtype == torch.float32:
                    final.index_add_(0, at, weighted)
                else:
                    for start, end in itertools.pairwise(bounds):
                        final.index_add_(0, at[start:end], weighted[start:end])
            return final.to(device)

    return DispatchedExperts


def load_split_model(
    artifacts_dir: Path,
    executor: ExpertExecutor | None = None,
    manifest: Manifest | None = None,
    dtype: Any = None,
    device: str = "cpu",
) -> Any:
    """Load the backbone from artifacts into its transformers class, experts via ``executor``.

    Args:
        artifacts_dir: output of ``moeless package``.
        executor: runs the routed experts; default: in-process onnxruntime over the artifacts.
        dtype: backbone dtype (default float32).
        device: ``cpu`` or ``cuda``.

    Raises:
        ArtifactError: a backbone file is missing or fails its checksum, or tensors are missing.
    """
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    artifacts_dir = Path(artifacts_dir)
    manifest = manifest or load_manifest(artifacts_dir)
    check_backbone_files(artifacts_dir, manifest)
    executor = executor or OnnxExpertPool(artifacts_dir, manifest)
    config = AutoConfig.from_pretrained(artifacts_dir / "backbone", local_files_only=True)
    model = build_meta_model(config)
    layout = moe_layout(model, manifest.num_experts)
    dispatched = _dispatched_experts_class()
    for layer, path in layout.experts_modules.items():
        parent_path, _, attr = path.rpartition(".")
        setattr(model.get_submodule(parent_path), attr, dispatched(layer, manifest.num_experts, executor))
    state: dict[str, Any] = {}
    for entry in manifest.backbone_files():
        if entry.file.endswith(".safetensors"):
            state.update(load_file(artifacts_dir / entry.file))
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.unexpected_keys:
        raise ArtifactError(f"backbone has tensors the model does not: {result.unexpected_keys[:3]}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    still_meta = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    if still_meta:
        raise ArtifactError(f"backbone lacks {len(still_meta)} tensors (first: {still_meta[0]!r})")
    return model.to(device=device, dtype=dtype or torch.float32).eval()
