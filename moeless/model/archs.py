"""What moeless knows about each MoE architecture.

Glossary
    routed expert   one FFN of a layer's expert pool, chosen per token by the router; these
                    become ONNX files and serverless functions.
    shared expert   an FFN every token passes through (Qwen2-MoE, DeepSeek-V3); it stays
                    in the backbone with attention, norms, embeddings and routers.
    expert kind     the math of one routed expert:
                    ``swiglu``   y = down(act(gate(x)) * up(x))                (Mixtral, Qwen, OLMoE...)
                    ``gpt_oss``  gate/up interleaved, with biases, clamped, and
                                 y = down((up + 1) * gate * sigmoid(alpha * gate)) + b

The registry maps a config's ``model_type`` to an :class:`ArchSpec`. Which layers hold
routed experts is read from transformers' own model built on the meta device, so rules
like DeepSeek-V3's dense first layers or Qwen's ``mlp_only_layers`` are never re-implemented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moeless.errors import UnsupportedArchitectureError


@dataclass(frozen=True)
class ArchSpec:
    """How to read one architecture's routed experts and describe its routing."""

    model_type: str
    display_name: str
    expert_kind: str  # "swiglu" | "gpt_oss"
    num_experts_attr: str
    routing: str  # human/machine-readable routing rule recorded in the manifest


ARCHS: dict[str, ArchSpec] = {
    spec.model_type: spec
    for spec in (
        ArchSpec("mixtral", "Mixtral", "swiglu", "num_local_experts", "softmax_topk_renorm"),
        ArchSpec("qwen2_moe", "Qwen2-MoE", "swiglu", "num_experts", "softmax_topk"),
        ArchSpec("qwen3_moe", "Qwen3-MoE", "swiglu", "num_experts", "softmax_topk"),
        ArchSpec("olmoe", "OLMoE", "swiglu", "num_experts", "softmax_topk"),
        ArchSpec("deepseek_v3", "DeepSeek-V3", "swiglu", "n_routed_experts", "sigmoid_grouped_topk"),
        ArchSpec("gpt_oss", "GPT-OSS", "gpt_oss", "num_local_experts", "topk_softmax"),
        ArchSpec("phimoe", "PhiMoE", "swiglu", "num_local_experts", "sparsemixer"),
    )
}

# Architectures we recognise as MoE but refuse, with the reason shown to the user.
REFUSED: dict[str, str] = {
    "llama4": "Llama 4 scales each expert's input by its router score before the expert runs "
    "and interleaves dense and MoE layers with a shared expert in a way moeless does not split yet",
    "llama4_text": "Llama 4 scales each expert's input by its router score before the expert runs "
    "and interleaves dense and MoE layers with a shared expert in a way moeless does not split yet",
}

_MOE_HINT_ATTRS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")

SUPPORTED_ACTIVATIONS = ("silu",)


def spec_for_config(config: Any) -> ArchSpec:
    """Return the :class:`ArchSpec` for a transformers config, or raise a clear error.

    Raises:
        UnsupportedArchitectureError: the model is not an MoE, or an MoE moeless cannot split.
    """
    model_type = getattr(config, "model_type", None) or "unknown"
    if model_type in ARCHS:
        spec = ARCHS[model_type]
        if spec.expert_kind == "swiglu":
            act = getattr(config, "hidden_act", "silu")
            if act not in SUPPORTED_ACTIVATIONS:
                raise UnsupportedArchitectureError(
                    f"{spec.display_name} with hidden_act={act!r} is not supported "
                    f"(supported: {', '.join(SUPPORTED_ACTIVATIONS)})"
                )
        return spec
    supported = ", ".join(sorted(ARCHS))
    if model_type in REFUSED:
        raise UnsupportedArchitectureError(
            f"architecture {model_type!r} is not supported: {REFUSED[model_type]}. Supported: {supported}"
        )
    if any(getattr(config, attr, None) for attr in _MOE_HINT_ATTRS):
        raise UnsupportedArchitectureError(
            f"MoE architecture {model_type!r} is not supported. Supported: {supported}"
        )
    raise UnsupportedArchitectureError(
        f"{model_type!r} is not a Mixture-of-Experts model (its config has no routed experts); "
        f"moeless splits MoE checkpoints only. Supported: {supported}"
    )


def routing_params(config: Any, spec: ArchSpec) -> dict[str, Any]:
    """The router's parameters worth recording beside its rule (top-k renormalisation, groups...)."""
    params: dict[str, Any] = {}
    for attr in ("norm_topk_prob", "n_group", "topk_group", "routed_scaling_factor", "router_jitter_noise"):
        value = getattr(config, attr, None)
        if value is not None:
            params[attr] = value
    if spec.model_type == "mixtral":
        params["norm_topk_prob"] = True
    if spec.model_type in ("qwen2_moe", "qwen3_moe", "olmoe") and params.get("norm_topk_prob"):
        params["rule"] = "softmax_topk_renorm"
    return params


def expert_activation_params(config: Any, spec: ArchSpec) -> dict[str, Any]:
    """Constants of the expert's activation (SwiGLU act name; GPT-OSS alpha and clamp limit)."""
    if spec.expert_kind == "gpt_oss":
        return {"alpha": float(config.swiglu_alpha), "limit": float(config.swiglu_limit)}
    return {"act": getattr(config, "hidden_act", "silu")}
