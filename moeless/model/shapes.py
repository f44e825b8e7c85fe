"""Whole-model shapes: the sizes the simulator and the planner need of an MoE model, read from its
Hugging Face ``config.json`` (no hub access) or taken from a preset with the real figures.

Glossary
    routed expert   one FFN of a layer's expert pool; ``expert_params`` counts one, with its biases
                    (gpt-oss) and ``matrices_per_expert`` matrices of H x I (SwiGLU 3, Switch's ReLU FFN 2).
    dense part      every other parameter: embeddings, the (untied) lm head, attention, norms, routers,
                    dense MLP blocks and shared experts. It is what the serverless backbone holds.
    active          what one token runs through: the dense part plus ``top_k`` routed experts per MoE
                    layer. ``active_params`` counts the input embedding table, as Mistral, AI2, Qwen and
                    DeepSeek do for their published figures; OpenAI's gpt-oss model card counts the
                    unembedding but not the embedding (a lookup, no FLOPs), which is
                    ``active_compute_params`` — what a decode step reads besides the KV cache.

How each figure is computed (per transformer block, H hidden, ``heads`` query heads of ``head_dim``):

* attention, GQA/MHA: q and o are H x heads*head_dim, k and v H x kv_heads*head_dim, with biases where
  the config says so (``attention_bias``; Qwen2-MoE's q/k/v always), QK-norm weights (OLMoE, Qwen3),
  gpt-oss's per-head sinks. MLA (DeepSeek-V2/V3): q_a (H x q_lora_rank) + its norm + q_b (q_lora_rank x
  heads*(qk_nope+qk_rope)), kv_a (H x (kv_lora_rank+qk_rope)) + its norm, kv_b (kv_lora_rank x
  heads*(qk_nope+v_head)), o (heads*v_head x H).
* KV cache per token at 16-bit: 2 (K and V) * kv_heads * head_dim * 2 bytes per layer; MLA caches the
  latent and the rope key, (kv_lora_rank + qk_rope_head_dim) * 2 bytes per layer. gpt-oss's
  sliding-window layers hold at most ``sliding_window`` tokens: ``kv_bytes_per_token`` is the upper bound
  (every layer full), :meth:`ModelShape.kv_bytes` models the window.
* attention FLOPs per new token per context token: 2 * heads * (qk_dim + v_dim) per layer (QK^T and
  AV, a multiply-add = 2 FLOPs): 4 * heads * head_dim for GQA/MHA. MLA is counted in the absorbed form
  that decode kernels run on the latent cache (FlashMLA, vLLM, SGLang): qk_dim = kv_lora_rank +
  qk_rope_head_dim, v_dim = kv_lora_rank.
* routers: H x num_experts per MoE layer (+ a bias: gpt-oss; + the score-correction bias: DeepSeek-V3);
  norms: 2 x H per block and a final H.

Switch Transformers (google/switch-base-128) is an encoder-decoder T5: its blocks are counted as a whole
(encoder then decoder, 24), its sparse FFNs are every other block of each stack (12 in all), its experts
are ReLU FFNs of 2 matrices, routing is top-1, and the KV figures are the decoder's self-attention (the
cross-attention's keys grow with the encoder's input, not counted).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moeless.errors import ModelShapeError

__all__ = [
    "ALIASES",
    "DTYPE_BYTES",
    "PRESETS",
    "ModelShape",
    "resolve_model",
    "shape_for_loads",
    "shape_from_hf_config",
]

# Bytes per parameter. mxfp4: 4-bit values plus one 8-bit scale per 32 = 4.25 bits (OCP MX spec);
# fp8's block scales (DeepSeek-V3: one fp32 per 128 x 128) add 0.02% and are left out.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "mxfp4": 0.53125,
}

_TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
_EXPERT_COUNT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_top_k")


@dataclass(frozen=True)
class ModelShape:
    """The sizes the simulator and planner need of a whole MoE model."""

    name: str  # preset key or the config's model name
    num_layers: int  # transformer blocks
    moe_layers: tuple[int, ...]  # indices of the blocks with routed experts
    num_experts: int  # routed experts per MoE layer
    top_k: int
    hidden: int
    expert_intermediate: int  # one routed expert's intermediate size
    shared_experts: int  # always-on shared experts per MoE layer (they run on the backbone)
    shared_intermediate: int  # one shared expert's intermediate size (0 if none)
    dense_params: float  # every parameter that is not a routed expert
    kv_bytes_per_token: float  # KV cache per token of context, all layers, 16-bit, no window
    attention_flops_per_token_per_context: float  # see the module docstring
    native_dtype: str  # dtype of the published routed experts' weights
    source: str  # where the numbers come from
    matrices_per_expert: int = 3  # SwiGLU gate/up/down; Switch's ReLU FFN: 2
    expert_bias_params: int = 0  # biases of one routed expert (gpt-oss: 2I gate/up + H down)
    embedding_params: float = 0.0  # the input token-embedding table (part of dense_params)
    sliding_window: int = 0  # tokens a sliding-window layer attends to (0: none)
    sliding_window_layers: int = 0  # how many blocks attend over the window only

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert: ``matrices_per_expert`` x H x I plus its biases."""
        return self.matrices_per_expert * self.hidden * self.expert_intermediate + self.expert_bias_params

    @property
    def routed_params(self) -> float:
        return float(self.expert_params * self.num_experts * len(self.moe_layers))

    @property
    def total_params(self) -> float:
        return self.dense_params + self.routed_params

    @property
    def active_params(self) -> float:
        """Parameters one token runs through, the input embedding table included."""
        return self.dense_params + self.top_k * len(self.moe_layers) * self.expert_params

    @property
    def active_compute_params(self) -> float:
        """``active_params`` without the input embedding table (a lookup of one row per token)."""
        return self.active_params - self.embedding_params

    def expert_bytes(self, dtype: str) -> float:
        """One routed expert's weights in ``dtype``."""
        return self.expert_params * dtype_bytes(dtype)

    def dense_bytes(self, dtype: str) -> float:
        return self.dense_params * dtype_bytes(dtype)

    def kv_bytes(self, context_tokens: float) -> float:
        """KV cache of one sequence of ``context_tokens`` at 16-bit, sliding-window layers capped."""
        if not self.sliding_window_layers:
            return self.kv_bytes_per_token * context_tokens
        per_layer = self.kv_bytes_per_token / self.num_layers
        full = self.num_layers - self.sliding_window_layers
        windowed = self.sliding_window_layers * min(context_tokens, self.sliding_window)
        return per_layer * (full * context_tokens + windowed)

    def attention_flops(self, context_tokens: float) -> float:
        """Attention FLOPs of one new token over ``context_tokens``, sliding-window layers capped."""
        if not self.sliding_window_layers:
            return self.attention_flops_per_token_per_context * context_tokens
        per_layer = self.attention_flops_per_token_per_context / self.num_layers
        full = self.num_layers - self.sliding_window_layers
        windowed = self.sliding_window_layers * min(context_tokens, self.sliding_window)
        return per_layer * (full * context_tokens + windowed)


def dtype_bytes(dtype: str) -> float:
    """Bytes per parameter of ``dtype`` (a key of :data:`DTYPE_BYTES`)."""
    if dtype not in DTYPE_BYTES:
        raise ModelShapeError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def _need(config: dict[str, Any], key: str, what: str) -> Any:
    value = config.get(key)
    if value is None:
        raise ModelShapeError(f"{what}: config.json lacks {key!r}")
    return value


def _first(config: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((config[k] for k in keys if config.get(k) is not None), None)


def _native_dtype(config: dict[str, Any]) -> str:
    method = (config.get("quantization_config") or {}).get("quant_method")
    if method in ("mxfp4", "fp8"):
        return str(method)
    # transformers loads float32 when a config records no dtype
    return _TORCH_DTYPES.get(str(config.get("torch_dtype") or config.get("dtype") or "float32"), "fp32")


def shape_from_hf_config(config: dict[str, Any], name: str = "") -> ModelShape:
    """A Hugging Face config.json (no hub access) -> shape.

    Handles the key families of Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3, gpt-oss and Switch
    Transformers (see the module docstring for what is counted and how).

    Raises:
        ModelShapeError: the config is not an MoE, or lacks a key the shape needs (named).
    """
    model_type = str(config.get("model_type", ""))
    name = name or str(config.get("_name_or_path") or model_type or "config.json")
    if model_type == "switch_transformers":
        return _switch_shape(config, name)
    num_experts = _first(config, _EXPERT_COUNT_KEYS)
    if not num_experts:
        raise ModelShapeError(
            f"{name} is not a Mixture-of-Experts config: none of {', '.join(_EXPERT_COUNT_KEYS)} is set"
        )
    num_experts = int(num_experts)
    top_k = _first(config, _TOP_K_KEYS)
    if top_k is None:
        raise ModelShapeError(f"{name}: config.json lacks the experts per token ({' or '.join(_TOP_K_KEYS)})")
    hidden = int(_need(config, "hidden_size", name))
    num_layers = int(_need(config, "num_hidden_layers", name))
    vocab = int(_need(config, "vocab_size", name))
    expert_i = int(config.get("moe_intermediate_size") or _need(config, "intermediate_size", name))

    # 1. which blocks route: DeepSeek's first dense blocks, Qwen's sparse step and MLP-only blocks
    if "first_k_dense_replace" in config or "moe_layer_freq" in config:
        first_dense = int(config.get("first_k_dense_replace") or 0)
        freq = int(config.get("moe_layer_freq") or 1)
        moe_layers = tuple(i for i in range(num_layers) if i >= first_dense and i % freq == 0)
    elif "decoder_sparse_step" in config or "mlp_only_layers" in config:
        step = int(config.get("decoder_sparse_step") or 1)
        mlp_only = set(config.get("mlp_only_layers") or [])
        moe_layers = tuple(i for i in range(num_layers) if i not in mlp_only and (i + 1) % step == 0)
    else:
        moe_layers = tuple(range(num_layers))
    dense_blocks = num_layers - len(moe_layers)

    # 2. attention: params, KV bytes and FLOPs per context token, per block
    attention, kv_per_layer, flops_per_layer = _attention(config, hidden, model_type, name)

    # 3. shared experts (on the backbone) and one routed expert's biases
    if config.get("n_shared_experts"):
        shared, shared_i = int(config["n_shared_experts"]), expert_i
    elif config.get("shared_expert_intermediate_size"):
        shared, shared_i = 1, int(config["shared_expert_intermediate_size"])
    else:
        shared, shared_i = 0, 0
    shared_gate = hidden if model_type == "qwen2_moe" and shared else 0
    expert_bias = 2 * expert_i + hidden if model_type == "gpt_oss" else 0
    router_bias = num_experts if model_type in ("gpt_oss", "deepseek_v3") else 0

    # 4. the dense part
    embedding = vocab * hidden
    lm_head = 0 if config.get("tie_word_embeddings", False) else vocab * hidden
    dense_mlp = (
        dense_blocks * 3 * hidden * int(_need(config, "intermediate_size", f"{name}'s dense blocks"))
        if dense_blocks
        else 0
    )
    per_moe_layer = hidden * num_experts + router_bias + shared * 3 * hidden * shared_i + shared_gate
    norms = num_layers * 2 * hidden + hidden
    dense = embedding + lm_head + num_layers * attention + dense_mlp + len(moe_layers) * per_moe_layer + norms

    layer_types = config.get("layer_types")
    if layer_types is None and model_type == "gpt_oss":  # transformers' default: even blocks slide
        layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    sliding_layers = sum(t == "sliding_attention" for t in layer_types or [])
    return ModelShape(
        name=name,
        num_layers=num_layers,
        moe_layers=moe_layers,
        num_experts=num_experts,
        top_k=int(top_k),
        hidden=hidden,
        expert_intermediate=expert_i,
        shared_experts=shared,
        shared_intermediate=shared_i,
        dense_params=float(dense),
        kv_bytes_per_token=float(num_layers * kv_per_layer),
        attention_flops_per_token_per_context=float(num_layers * flops_per_layer),
        native_dtype=_native_dtype(config),
        source=f"config.json ({name})",
        expert_bias_params=expert_bias,
        embedding_params=float(embedding),
        sliding_window=int(config.get("sliding_window") or 0) if sliding_layers else 0,
        sliding_window_layers=sliding_layers,
    )


def _attention(config: dict[str, Any], hidden: int, model_type: str, name: str) -> tuple[int, int, int]:
    """One block's attention: (params, KV-cache bytes per token at 16-bit, FLOPs per context token)."""
    heads = int(_need(config, "num_attention_heads", name))
    if config.get("kv_lora_rank"):  # MLA
        kv_rank = int(config["kv_lora_rank"])
        rope = int(_need(config, "qk_rope_head_dim", name))
        nope = int(_need(config, "qk_nope_head_dim", name))
        v_head = int(_need(config, "v_head_dim", name))
        q_rank = config.get("q_lora_rank")
        q = (
            hidden * q_rank + q_rank + q_rank * heads * (nope + rope)
            if q_rank
            else hidden * heads * (nope + rope)
        )
        kv = hidden * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v_head)
        params = q + kv + heads * v_head * hidden
        return params, (kv_rank + rope) * 2, 2 * heads * ((kv_rank + rope) + kv_rank)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    params = 2 * hidden * q_width + 2 * hidden * kv_width
    if config.get("attention_bias") or model_type == "qwen2_moe":
        params += q_width + 2 * kv_width
        if model_type != "qwen2_moe":
            params += hidden  # o_proj's bias
    if model_type == "olmoe":
        params += q_width + kv_width  # q_norm, k_norm over the projections
    elif model_type == "qwen3_moe":
        params += 2 * head_dim  # q_norm, k_norm per head
    elif model_type == "gpt_oss":
        params += heads  # attention sinks
    return params, 2 * kv_width * 2, 4 * heads * head_dim


def _switch_shape(config: dict[str, Any], name: str) -> ModelShape:
    """Switch Transformers: encoder and decoder counted as one stack of blocks."""
    d = int(_need(config, "d_model", name))
    d_ff = int(_need(config, "d_ff", name))
    num_experts = int(_need(config, "num_experts", name))
    heads = int(_need(config, "num_heads", name))
    inner = heads * int(_need(config, "d_kv", name))
    vocab = int(_need(config, "vocab_size", name))
    enc = int(_need(config, "num_layers", name))
    dec = int(config.get("num_decoder_layers") or enc)

    def sparse(i: int, step: int) -> bool:  # transformers' SwitchTransformersStack rule
        return (i % step == 1 or step == 1) if step > 0 else False

    enc_step = int(_need(config, "encoder_sparse_step", name))
    dec_step = int(_need(config, "decoder_sparse_step", name))
    moe_layers = tuple(i for i in range(enc) if sparse(i, enc_step)) + tuple(
        enc + j for j in range(dec) if sparse(j, dec_step)
    )
    dense_ffns = enc + dec - len(moe_layers)
    buckets = int(config.get("relative_attention_num_buckets") or 32)
    embedding = vocab * d
    lm_head = 0 if config.get("tie_word_embeddings", True) else vocab * d
    attention = enc * 4 * d * inner + dec * 8 * d * inner + 2 * buckets * heads  # + cross-attn, rel. bias
    norms = enc * 2 * d + dec * 3 * d + 2 * d
    ffns = dense_ffns * 2 * d * d_ff + len(moe_layers) * d * num_experts  # dense FFNs, routers
    dense = embedding + lm_head + attention + norms + ffns
    return ModelShape(
        name=name,
        num_layers=enc + dec,
        moe_layers=moe_layers,
        num_experts=num_experts,
        top_k=int(config.get("num_experts_per_tok") or 1),
        hidden=d,
        expert_intermediate=d_ff,
        shared_experts=0,
        shared_intermediate=0,
        dense_params=float(dense),
        kv_bytes_per_token=float(dec * 2 * inner * 2),
        attention_flops_per_token_per_context=float(dec * 4 * inner),
        native_dtype=_native_dtype(config),
        source=f"config.json ({name})",
        matrices_per_expert=2,
        embedding_params=float(embedding),
    )


# gpt-oss-20b's config.json, and the base of gpt-oss-120b's (below)
_GPT_OSS_20B: dict[str, Any] = {
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_local_experts": 32,
    "experts_per_token": 4,
    "num_experts_per_tok": 4,
    "vocab_size": 201088,
    "tie_word_embeddings": False,
    "attention_bias": True,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "quantization_config": {"quant_method": "mxfp4"},
    "torch_dtype": "bfloat16",
}

# the keys Qwen3-30B-A3B's and Qwen3-235B-A22B's config.json share
_QWEN3_MOE: dict[str, Any] = {
    "model_type": "qwen3_moe",
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "torch_dtype": "bfloat16",
}

# The relevant keys of each model's published config.json (huggingface.co/<repo>/blob/main/config.json),
# as they read there. Totals from them, checked in tests/model/test_shapes.py against the published
# figures: Mixtral 46.7B/12.9B (mistral.ai, "Mixtral of experts"), OLMoE 6.9B/1.3B (OLMoE paper),
# gpt-oss 20.9B/3.6B and 116.8B/5.1B (OpenAI's gpt-oss model card, Table 1), Qwen3 30.5B/3.3B and
# 235B/22B (the Qwen3 model cards), DeepSeek-V3 671B/37B (its model card; the 14B MTP module is not
# counted: it is a speculative-decoding head, not part of the served model).
_PRESET_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "mixtral-8x7b": (
        "mistralai/Mixtral-8x7B-v0.1",
        {
            "model_type": "mixtral",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "vocab_size": 32000,
            "tie_word_embeddings": False,
            "sliding_window": None,
            "torch_dtype": "bfloat16",
        },
    ),
    "olmoe-1b-7b": (
        "allenai/OLMoE-1B-7B-0924",
        {
            "model_type": "olmoe",
            "hidden_size": 2048,
            "intermediate_size": 1024,
            "num_hidden_layers": 16,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "num_experts": 64,
            "num_experts_per_tok": 8,
            "vocab_size": 50304,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "torch_dtype": "bfloat16",
        },
    ),
    "gpt-oss-20b": ("openai/gpt-oss-20b", _GPT_OSS_20B),
    # gpt-oss-120b: the same blocks, 36 of them, and 128 experts per layer
    "gpt-oss-120b": (
        "openai/gpt-oss-120b",
        _GPT_OSS_20B
        | {
            "num_hidden_layers": 36,
            "num_local_experts": 128,
            "layer_types": ["sliding_attention", "full_attention"] * 18,
        },
    ),
    "qwen3-30b-a3b": (
        "Qwen/Qwen3-30B-A3B",
        _QWEN3_MOE
        | {
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "moe_intermediate_size": 768,
            "num_hidden_layers": 48,
            "num_attention_heads": 32,
        },
    ),
    "qwen3-235b-a22b": (
        "Qwen/Qwen3-235B-A22B",
        _QWEN3_MOE
        | {
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "moe_intermediate_size": 1536,
            "num_hidden_layers": 94,
            "num_attention_heads": 64,
        },
    ),
    "deepseek-v3": (
        "deepseek-ai/DeepSeek-V3",
        {
            "model_type": "deepseek_v3",
            "hidden_size": 7168,
            "intermediate_size": 18432,
            "moe_intermediate_size": 2048,
            "num_hidden_layers": 61,
            "first_k_dense_replace": 3,
            "moe_layer_freq": 1,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "q_lora_rank": 1536,
            "kv_lora_rank": 512,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "n_routed_experts": 256,
            "n_shared_experts": 1,
            "num_experts_per_tok": 8,
            "vocab_size": 129280,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "num_nextn_predict_layers": 1,  # the MTP module: not served, not counted
            "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
            "torch_dtype": "bfloat16",
        },
    ),
    "switch-base-128": (
        "google/switch-base-128",
        {
            "model_type": "switch_transformers",
            "d_model": 768,
            "d_ff": 3072,
            "d_kv": 64,
            "num_heads": 12,
            "num_layers": 12,
            "num_decoder_layers": 12,
            "num_experts": 128,
            "encoder_sparse_step": 2,
            "decoder_sparse_step": 2,
            "relative_attention_num_buckets": 32,
            "vocab_size": 32128,
            "torch_dtype": "float32",
        },
    ),
}

PRESETS: dict[str, ModelShape] = {
    key: replace(
        shape_from_hf_config(config, key),
        source=f"huggingface.co/{repo} config.json, totals checked against the published figures",
    )
    for key, (repo, config) in _PRESET_CONFIGS.items()
}

# Hugging Face repo ids (matched case-insensitively) -> preset; fine-tunes keep their base's shape.
ALIASES: dict[str, str] = {
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b",
    "allenai/OLMoE-1B-7B-0924": "olmoe-1b-7b",
    "allenai/OLMoE-1B-7B-0924-Instruct": "olmoe-1b-7b",
    "allenai/OLMoE-1B-7B-0924-SFT": "olmoe-1b-7b",
    "openai/gpt-oss-20b": "gpt-oss-20b",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b",
    "Qwen/Qwen3-235B-A22B": "qwen3-235b-a22b",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "deepseek-ai/DeepSeek-V3-Base": "deepseek-v3",
    "deepseek-ai/DeepSeek-V3-0324": "deepseek-v3",
    "deepseek-ai/DeepSeek-R1": "deepseek-v3",
    "google/switch-base-128": "switch-base-128",
}
_BY_NAME = {k.lower(): v for k, v in ALIASES.items()} | {k: k for k in PRESETS}


def _known(name: str) -> ModelShape | None:
    key = _BY_NAME.get(name.strip().lower())
    return PRESETS[key] if key else None


def _config_file(path: Path) -> Path | None:
    """``path`` itself, or the config.json of a model folder or of a package (``moeless package``
    keeps the model's config in ``backbone/``, so loads profiled on a package name their shape)."""
    if path.is_dir():
        found = [path / "config.json", path / "backbone" / "config.json"]
        return next((candidate for candidate in found if candidate.is_file()), None)
    return path if path.is_file() else None


def _from_file(path: Path) -> ModelShape:
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelShapeError(f"{path} is not a readable config.json: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelShapeError(f"{path} is not a config.json: its top level is not an object")
    return replace(shape_from_hf_config(config, str(config.get("_name_or_path") or path)), source=str(path))


def _choices() -> str:
    return f"a preset ({', '.join(PRESETS)}), a Hugging Face id of one, or the path of a config.json"


def resolve_model(spec: str) -> ModelShape:
    """A preset name, an alias (HF id), or a path to a config.json file (or a folder holding one).

    Raises:
        ModelShapeError: unknown (the message lists the presets), or an unreadable config.
    """
    known = _known(spec)
    if known is not None:
        return known
    path = _config_file(Path(spec).expanduser())
    if path is not None:
        return _from_file(path)
    raise ModelShapeError(f"unknown model {spec!r}: give {_choices()}")


def shape_for_loads(meta: dict[str, Any], model: str | None) -> ModelShape:
    """The shape a loads file's header names (its ``model``, via :data:`ALIASES`, or the model folder a
    trace recorded) unless ``model`` (a ``--model`` value) is given.

    Raises:
        ModelShapeError: the header names no model, or one that is not known: pass ``--model``.
    """
    if model:
        return resolve_model(model)
    name = str(meta.get("model") or "")
    if not name:
        raise ModelShapeError(f"the loads name no model: pass --model with {_choices()}")
    known = _known(name)
    if known is not None:
        return known
    path = _config_file(Path(name))
    if path is not None and path.name == "config.json":
        return _from_file(path)
    raise ModelShapeError(f"the loads' model {name!r} has no known shape: pass --model with {_choices()}")
