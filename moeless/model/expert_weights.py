"""Find and read one routed expert's weights from a checkpoint, in transformers' own layout.

On disk, experts come in two layouts:

* per-expert tensors (Mixtral and PhiMoE ``block_sparse_moe.experts.{e}.w1|w2|w3``; Qwen,
  OLMoE and DeepSeek ``mlp.experts.{e}.gate_proj|up_proj|down_proj``), which is what
  ``save_pretrained`` writes for them, and
* fused ``[E, ...]`` tensors (``mlp.experts.gate_up_proj`` / ``down_proj`` and, for GPT-OSS,
  their biases), which is how transformers keeps every MoE in memory.

Both are turned into :class:`ExpertWeights` in the in-memory layout of transformers' expert
modules, so the reference computation below is literally theirs.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from moeless.errors import CheckpointError, UnsupportedArchitectureError

if TYPE_CHECKING:
    import torch

    from moeless.model.checkpoint import LazyCheckpoint

_PER_EXPERT = re.compile(
    r"^(?:.+\.)?layers\.(?P<layer>\d+)\.(?:block_sparse_moe|mlp)\.experts\.(?P<expert>\d+)\."
    r"(?P<proj>w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$"
)
_FUSED = re.compile(
    r"^(?:.+\.)?layers\.(?P<layer>\d+)\.(?:block_sparse_moe|mlp)\.experts\."
    r"(?P<param>gate_up_proj|down_proj|gate_up_proj_bias|down_proj_bias)$"
)
_QUANTISED = re.compile(r"\.experts\.\w+_(?:blocks|scales)$")
_ROLE = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down", "down_proj": "down"}


@dataclass
class ExpertSource:
    """The tensors that make up one routed expert: role -> (tensor name, row of a fused tensor or None)."""

    layer: int
    expert: int
    parts: dict[str, tuple[str, int | None]] = field(default_factory=dict)

    @property
    def tensor_names(self) -> list[str]:
        return sorted({name for name, _ in self.parts.values()})


@dataclass
class ExpertWeights:
    """One expert in transformers' in-memory layout, float32.

    swiglu:  ``gate_up [2I, H]`` (gate rows then up rows), ``down [H, I]``; y = down(act(gate x) * up x)
    gpt_oss: ``gate_up [H, 2I]`` (gate/up interleaved columns), ``gate_up_bias [2I]``,
             ``down [I, H]``, ``down_bias [H]``
    """

    gate_up: torch.Tensor
    down: torch.Tensor
    gate_up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None

    @property
    def num_bytes_fp32(self) -> int:
        tensors = [t for t in (self.gate_up, self.down, self.gate_up_bias, self.down_bias) if t is not None]
        return sum(t.numel() * 4 for t in tensors)


def find_expert_sources(checkpoint: LazyCheckpoint, num_experts: int) -> dict[tuple[int, int], ExpertSource]:
    """Map every (layer, expert) to the checkpoint tensors holding it.

    Raises:
        UnsupportedArchitectureError: experts are stored quantised (e.g. GPT-OSS MXFP4) or the
            checkpoint holds fp8 weights (e.g. DeepSeek-V3's block-scaled fp8).
        CheckpointError: an expert is missing one of its projections.
    """
    quantised = [k for k in checkpoint.tensors if _QUANTISED.search(k)]
    if quantised:
        raise UnsupportedArchitectureError(
            f"experts are stored quantised ({quantised[0]!r}, e.g. GPT-OSS MXFP4); "
            "moeless packages unquantised (bf16/fp16/fp32) checkpoints: dequantise first"
        )
    # Block-scaled fp8 (DeepSeek-V3/R1 as published) reads as plain floats without its
    # `weight_scale_inv` tensors: every weight would be off by its block's scale, silently.
    fp8 = [k for k, info in checkpoint.tensors.items() if info.dtype.startswith("F8")]
    if fp8:
        raise UnsupportedArchitectureError(
            f"weights are stored in fp8 ({fp8[0]!r}, e.g. DeepSeek-V3 as published); moeless packages "
            "bf16/fp16/fp32 checkpoints: dequantise first (DeepSeek's inference/fp8_cast_bf16.py)"
        )
    sources: dict[tuple[int, int], ExpertSource] = {}
    fused: dict[int, dict[str, str]] = defaultdict(dict)
    for name in checkpoint.tensors:
        if match := _PER_EXPERT.match(name):
            layer, expert = int(match["layer"]), int(match["expert"])
            source = sources.setdefault((layer, expert), ExpertSource(layer, expert))
            source.parts[_ROLE[match["proj"]]] = (name, None)
        elif match := _FUSED.match(name):
            fused[int(match["layer"])][match["param"]] = name
    for layer, params in fused.items():
        for expert in range(num_experts):
            source = sources.setdefault((layer, expert), ExpertSource(layer, expert))
            for param, name in params.items():
                source.parts[param] = (name, expert)
    for source in sources.values():
        roles = set(source.parts)
        if not ({"gate", "up", "down"} <= roles or {"gate_up_proj", "down_proj"} <= roles):
            raise CheckpointError(
                f"layer {source.layer} expert {source.expert} is incomplete in the checkpoint "
                f"(found only {sorted(roles)})"
            )
    return dict(sorted(sources.items()))


def read_expert(checkpoint: LazyCheckpoint, source: ExpertSource) -> ExpertWeights:
    """Read one expert's tensors (only its rows of fused tensors) and convert to float32."""
    import torch

    def get(role: str) -> torch.Tensor:
        name, row = source.parts[role]
        tensor = checkpoint.read(name) if row is None else checkpoint.read_row(name, row)
        return tensor.to(torch.float32)

    if "gate" in source.parts:
        gate_up = torch.cat([get("gate"), get("up")], dim=0)
        return ExpertWeights(gate_up=gate_up, down=get("down"))
    return ExpertWeights(
        gate_up=get("gate_up_proj"),
        down=get("down_proj"),
        gate_up_bias=get("gate_up_proj_bias") if "gate_up_proj_bias" in source.parts else None,
        down_bias=get("down_proj_bias") if "down_proj_bias" in source.parts else None,
    )


def expert_tensor_names(sources: dict[tuple[int, int], ExpertSource]) -> set[str]:
    """Every checkpoint tensor that belongs to a routed expert (the backbone is the rest)."""
    return {name for source in sources.values() for name in source.tensor_names}
