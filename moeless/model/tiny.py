"""Tiny random-init MoE checkpoints, built offline, for tests and the demo.

Each is a real transformers model (``save_pretrained``, safetensors) of a supported
architecture, with a byte-level BPE tokenizer trained with the ``tokenizers`` library on
text that ships with every Python (the interpreter's own documentation, ``pydoc_data``),
so ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained(OUT_DIR)`` load both with
no network. The same seed gives byte-identical files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moeless.model.chat_template import DEFAULT_CHAT_TEMPLATE

TINY_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss", "phimoe")
SPECIAL_TOKENS = ("<|endoftext|>", "<|pad|>")


@dataclass(frozen=True)
class TinySpec:
    """Sizes of a tiny model. ``layers`` counts decoder layers (DeepSeek-V3's first is dense)."""

    arch: str = "mixtral"
    layers: int = 2
    experts: int = 8
    top_k: int = 2
    hidden: int = 64
    intermediate: int = 128
    vocab: int = 512
    seed: int = 0


def python_doc_text() -> str:
    """English technical prose that every CPython carries: the pydoc topic documentation."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def train_tokenizer(vocab_size: int, text: str | None = None) -> Any:
    """Train a byte-level BPE tokenizer and wrap it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = text if text is not None else python_doc_text()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = text.splitlines()
    tokenizer.train_from_iterator((lines[i : i + 1000] for i in range(0, len(lines), 1000)), trainer)
    eos, pad = SPECIAL_TOKENS
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=eos, eos_token=eos, pad_token=pad)


def tiny_config(spec: TinySpec, eos_id: int, pad_id: int) -> Any:
    """A transformers config of ``spec.arch`` at tiny sizes."""
    import transformers

    common: dict[str, Any] = dict(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        num_experts_per_tok=spec.top_k,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=False,
        # Weights scaled so activations stay near unit scale at any width (like trained
        # models after RMSNorm); a fixed 0.1 blows expert outputs up at hidden >= 1024.
        initializer_range=min(0.1, spec.hidden**-0.5),
    )
    experts, inter = spec.experts, spec.intermediate
    if spec.arch == "mixtral":
        return transformers.MixtralConfig(num_local_experts=experts, intermediate_size=inter, **common)
    if spec.arch == "phimoe":
        return transformers.PhimoeConfig(num_local_experts=experts, intermediate_size=inter, **common)
    if spec.arch == "qwen2_moe":
        return transformers.Qwen2MoeConfig(
            num_experts=experts,
            moe_intermediate_size=inter,
            intermediate_size=inter,
            shared_expert_intermediate_size=inter,
            norm_topk_prob=False,
            **common,
        )
    if spec.arch == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            num_experts=experts,
            moe_intermediate_size=inter,
            intermediate_size=inter,
            norm_topk_prob=True,
            **common,
        )
    if spec.arch == "olmoe":
        return transformers.OlmoeConfig(num_experts=experts, intermediate_size=inter, **common)
    if spec.arch == "deepseek_v3":
        groups = 2 if experts % 2 == 0 else 1
        common["num_key_value_heads"] = common["num_attention_heads"]  # MLA: no grouped KV heads
        return transformers.DeepseekV3Config(
            n_routed_experts=experts,
            moe_intermediate_size=inter,
            intermediate_size=2 * inter,
            n_shared_experts=1,
            n_group=groups,
            topk_group=1,
            first_k_dense_replace=1,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            **common,
        )
    if spec.arch == "gpt_oss":
        return transformers.GptOssConfig(
            num_local_experts=experts,
            intermediate_size=inter,
            head_dim=spec.hidden // 4,
            sliding_window=64,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            **common,
        )
    raise ValueError(f"unknown tiny architecture {spec.arch!r}; choose one of {', '.join(TINY_ARCHS)}")


def build_tiny_model(out_dir: Path, spec: TinySpec) -> Path:
    """Write a random-init checkpoint and its tokenizer to ``out_dir``; return ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    assert spec.top_k <= spec.experts, "top_k cannot exceed the number of experts"
    out_dir = Path(out_dir)
    tokenizer = train_tokenizer(spec.vocab)
    eos_id = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[0])
    pad_id = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[1])
    config = tiny_config(spec, eos_id, pad_id)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False
    )
    model.save_pretrained(out_dir)
    tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE  # chat completions render like any checkpoint's
    tokenizer.save_pretrained(out_dir)
    return out_dir
