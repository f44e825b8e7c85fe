"""Whole-model shapes: the presets carry the published totals, the config reader counts what
transformers builds, and names, paths and bad configs are resolved or refused clearly."""

from __future__ import annotations

import json

import pytest

from moeless.errors import ModelShapeError
from moeless.model.shapes import (
    ALIASES,
    DTYPE_BYTES,
    PRESETS,
    resolve_model,
    shape_for_loads,
    shape_from_hf_config,
)

# (total, active) in billions as published: Mistral's release post, the OLMoE paper, OpenAI's gpt-oss
# model card (Table 1: its active count leaves out the input embedding), the Qwen3 and DeepSeek-V3 cards.
PUBLISHED = {
    "mixtral-8x7b": (46.7, 12.9),
    "olmoe-1b-7b": (6.9, 1.3),
    "gpt-oss-20b": (20.9, 3.6),
    "gpt-oss-120b": (116.8, 5.1),
    "qwen3-30b-a3b": (30.5, 3.3),
    "qwen3-235b-a22b": (235.0, 22.0),
    "deepseek-v3": (671.0, 37.0),
}
WITHOUT_EMBEDDING = {"gpt-oss-20b", "gpt-oss-120b"}


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_presets_match_the_published_totals_within_2_percent(preset):
    shape = PRESETS[preset]
    total, active = PUBLISHED[preset]
    counted = shape.active_compute_params if preset in WITHOUT_EMBEDDING else shape.active_params
    assert shape.total_params / 1e9 == pytest.approx(total, rel=0.02)
    assert counted / 1e9 == pytest.approx(active, rel=0.02)
    assert shape.total_params == pytest.approx(shape.dense_params + shape.routed_params)


def test_hand_checked_figures():
    mixtral = PRESETS["mixtral-8x7b"]
    # GIVEN Mixtral: 32 blocks of 8 SwiGLU experts 4096 x 14336, GQA 32/8 heads of 128
    assert mixtral.expert_params == 3 * 4096 * 14336
    assert mixtral.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    assert mixtral.attention_flops_per_token_per_context == 32 * 4 * 32 * 128
    assert mixtral.expert_bytes("bf16") == 2 * 3 * 4096 * 14336
    # embeddings + lm head + attention (q, k, v, o) + routers + norms
    dense = 2 * 32000 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024) + 32 * 4096 * 8 + 65 * 4096
    assert mixtral.dense_params == dense

    deepseek = PRESETS["deepseek-v3"]
    assert deepseek.moe_layers == tuple(range(3, 61)) and deepseek.num_experts == 256
    assert (deepseek.shared_experts, deepseek.shared_intermediate) == (1, 2048)
    assert deepseek.kv_bytes_per_token == (512 + 64) * 2 * 61 == 70272
    assert deepseek.native_dtype == "fp8"

    gpt = PRESETS["gpt-oss-20b"]
    assert gpt.expert_params == 3 * 2880 * 2880 + 2 * 2880 + 2880  # gate/up and down biases
    assert gpt.kv_bytes_per_token == 24 * 2 * 8 * 64 * 2 == 49152
    assert gpt.native_dtype == "mxfp4" and gpt.expert_bytes("mxfp4") == gpt.expert_params * 0.53125
    # half the blocks slide over 128 tokens: at 1,128 tokens the cache holds 12 x 1,128 + 12 x 128
    assert gpt.kv_bytes(1128) == pytest.approx(2048 * (12 * 1128 + 12 * 128))
    assert gpt.kv_bytes(64) == gpt.kv_bytes_per_token * 64

    switch = PRESETS["switch-base-128"]
    assert switch.moe_layers == (1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23) and switch.top_k == 1
    assert switch.expert_params == 2 * 768 * 3072  # a ReLU FFN: two matrices
    assert switch.total_params / 1e9 == pytest.approx(7.4, rel=0.02)


def test_every_alias_names_a_preset_and_matches_case_insensitively():
    assert set(ALIASES.values()) <= set(PRESETS)
    for repo, key in ALIASES.items():
        assert resolve_model(repo.upper()) is PRESETS[key]
    assert resolve_model("Mixtral-8x7B") is PRESETS["mixtral-8x7b"]


def test_a_config_json_on_disk_goes_through_resolve_model(tmp_path):
    config = {
        "_name_or_path": "me/my-moe",
        "model_type": "qwen3_moe",
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "mlp_only_layers": [0],
        "vocab_size": 100,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    for spec in (str(tmp_path / "config.json"), str(tmp_path)):
        shape = resolve_model(spec)
        assert shape.name == "me/my-moe" and shape.moe_layers == (1, 2, 3)
        assert shape.expert_params == 3 * 64 * 32 and shape.kv_bytes_per_token == 4 * 2 * 2 * 16 * 2
        assert shape.source == str(tmp_path / "config.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ModelShapeError, match="not a readable config.json"):
        resolve_model(str(tmp_path / "bad.json"))


def test_loads_profiled_on_a_package_take_their_shape_from_its_backbone_config(tiny):
    artifacts = tiny.package("qwen3_moe")
    shape = shape_for_loads({"model": str(artifacts)}, None)
    assert shape.source == str(artifacts / "backbone" / "config.json")
    assert shape.num_experts == json.loads((artifacts / "manifest.json").read_text())["num_experts"]


def test_an_unknown_model_lists_the_presets_and_says_a_path_is_accepted():
    with pytest.raises(ModelShapeError) as caught:
        resolve_model("mistralai/Mistral-7B-v0.1")
    assert "deepseek-v3" in str(caught.value) and "config.json" in str(caught.value)


def test_a_dense_config_and_a_missing_key_are_refused_by_name():
    dense = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 32000}
    with pytest.raises(ModelShapeError, match="not a Mixture-of-Experts.*num_local_experts"):
        shape_from_hf_config(dense, "llama")
    config = {"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}
    with pytest.raises(ModelShapeError, match="'hidden_size'"):
        shape_from_hf_config(config)
    with pytest.raises(ModelShapeError, match="num_experts_per_tok"):
        shape_from_hf_config({"model_type": "olmoe", "num_experts": 64})
    # DeepSeek's dense first blocks need the dense intermediate size
    deepseek = {k: v for k, v in _deepseek_like().items() if k != "intermediate_size"}
    with pytest.raises(ModelShapeError, match="'intermediate_size'"):
        shape_from_hf_config(deepseek)


def _deepseek_like() -> dict:
    return {
        "model_type": "deepseek_v3",
        "hidden_size": 64,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "num_attention_heads": 4,
        "kv_lora_rank": 16,
        "q_lora_rank": 24,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 100,
    }


def test_an_unknown_dtype_lists_the_known_ones():
    with pytest.raises(ModelShapeError, match=", ".join(DTYPE_BYTES)):
        PRESETS["mixtral-8x7b"].expert_bytes("fp4")


def test_shape_for_loads_reads_the_header_or_the_option(tmp_path):
    assert shape_for_loads({"model": "allenai/OLMoE-1B-7B-0924-Instruct"}, None) is PRESETS["olmoe-1b-7b"]
    assert shape_for_loads({"model": "anything/else"}, "gpt-oss-20b") is PRESETS["gpt-oss-20b"]
    with pytest.raises(ModelShapeError, match="pass --model"):
        shape_for_loads({"model": "someone/unknown-moe"}, None)
    with pytest.raises(ModelShapeError, match="name no model: pass --model"):
        shape_for_loads({}, None)
    # a trace records the model folder it profiled: its config.json is read
    (tmp_path / "config.json").write_text(json.dumps(_deepseek_like()))
    assert shape_for_loads({"model": str(tmp_path)}, None).moe_layers == (1, 2)


# Small configs of each family, as transformers builds them: the reader must count every parameter.
SMALL = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
}
MLA = {"kv_lora_rank": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}
DEEPSEEK = {
    "n_routed_experts": 8,
    "n_shared_experts": 2,
    "moe_intermediate_size": 48,
    "first_k_dense_replace": 1,
}
FAMILIES = [
    pytest.param("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}, id="mixtral"),
    pytest.param(
        "qwen2_moe",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 48,
            "shared_expert_intermediate_size": 80,
            "decoder_sparse_step": 2,
            "mlp_only_layers": [0],
        },
        id="qwen2-moe-shared-expert-sparse-step",
    ),
    pytest.param(
        "qwen3_moe",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48, "mlp_only_layers": [1]},
        id="qwen3-moe-mlp-only-layer",
    ),
    pytest.param("olmoe", {"num_experts": 4, "num_experts_per_tok": 2}, id="olmoe"),
    pytest.param(
        "deepseek_v3",
        {**DEEPSEEK, **MLA, "q_lora_rank": 40, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1},
        id="deepseek-v3-mla",
    ),
    pytest.param(
        "deepseek_v2",
        {**DEEPSEEK, **MLA, "q_lora_rank": None, "num_experts_per_tok": 2, "topk_method": "greedy"},
        id="deepseek-v2-mla-no-q-lora",
    ),
    pytest.param(
        "gpt_oss",
        {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 16, "sliding_window": 8},
        id="gpt-oss-biases-sinks",
    ),
]


@pytest.mark.parametrize(("model_type", "extra"), FAMILIES)
def test_the_reader_counts_what_transformers_builds(model_type, extra):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(model_type, **SMALL, **extra)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    built = sum(p.numel() for p in model.parameters())
    # DeepSeek-V3's router score-correction bias is a buffer there, a weight in the checkpoint
    built += sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert shape_from_hf_config(config.to_dict()).total_params == built


def test_the_reader_counts_what_transformers_builds_for_switch():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(
        "switch_transformers",
        d_model=64,
        d_ff=96,
        d_kv=16,
        num_heads=4,
        num_layers=4,
        num_decoder_layers=4,
        num_experts=4,
        vocab_size=100,
        encoder_sparse_step=2,
        decoder_sparse_step=2,
    )
    with torch.device("meta"):
        model = transformers.AutoModelForSeq2SeqLM.from_config(config)
    shape = shape_from_hf_config(config.to_dict())
    assert shape.total_params == sum(p.numel() for p in model.parameters())
    assert shape.moe_layers == (1, 3, 5, 7)
