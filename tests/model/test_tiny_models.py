"""``moeless model tiny``: real transformers checkpoints, offline and deterministic."""

from __future__ import annotations

import pytest

from moeless.fileio import sha256_file
from moeless.model.tiny import TINY_ARCHS, TinySpec, build_tiny_model


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_model_loads_with_auto_classes(tiny, arch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # GIVEN a tiny checkpoint of each architecture
    model_dir = tiny.model(arch)
    # WHEN transformers loads it with its Auto classes
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # THEN it is the declared architecture and the tokenizer round-trips text
    assert model.config.model_type == arch
    text = "def spam(eggs): return eggs * 2"
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    assert tokenizer.eos_token_id == model.config.eos_token_id


def test_same_seed_gives_identical_files(tmp_path):
    spec = TinySpec(arch="qwen3_moe", seed=7)
    first = build_tiny_model(tmp_path / "a", spec)
    second = build_tiny_model(tmp_path / "b", spec)
    other = build_tiny_model(tmp_path / "c", TinySpec(arch="qwen3_moe", seed=8))
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert sha256_file(first / name) == sha256_file(second / name), name
    assert sha256_file(first / "model.safetensors") != sha256_file(other / "model.safetensors")
