"""Proof of correctness: backbone + ONNX experts (onnxruntime) == the original model."""

from __future__ import annotations

import pytest
import torch

from moeless.contracts.manifest import load_manifest
from moeless.demo.prompts import DEMO_PROMPTS
from moeless.errors import ArtifactError
from moeless.model.split import load_split_model
from moeless.model.tiny import TINY_ARCHS


def _models(tiny, arch: str, **sizes):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = tiny.model(arch, **sizes)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    split = load_split_model(tiny.package(arch, **sizes))
    return reference, split, AutoTokenizer.from_pretrained(model_dir)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_split_model_matches_original_logits_and_greedy_tokens(tiny, arch):
    # GIVEN the original checkpoint and the model rebuilt from its artifacts
    reference, split, tokenizer = _models(tiny, arch)
    # deepseek_v3 in its default tiny size has one MoE layer; also check a deeper one below
    batch = tokenizer(list(DEMO_PROMPTS[:2]), return_tensors="pt", padding=True)
    with torch.no_grad():
        # WHEN both score a padded batch and decode greedily
        want = reference(**batch).logits
        got = split(**batch).logits
        mask = batch.attention_mask.bool()
        ids = tokenizer(DEMO_PROMPTS[0], return_tensors="pt").input_ids
        want_tokens = reference.generate(ids, max_new_tokens=20, do_sample=False)
        got_tokens = split.generate(ids, max_new_tokens=20, do_sample=False)
    # THEN logits agree within 1e-4 and the tokens are identical
    assert (want - got).abs()[mask].max().item() <= 1e-4
    assert torch.equal(want_tokens, got_tokens)


def test_deeper_deepseek_matches(tiny):
    reference, split, tokenizer = _models(tiny, "deepseek_v3", layers=3)
    ids = tokenizer(DEMO_PROMPTS[2], return_tensors="pt").input_ids
    with torch.no_grad():
        assert (reference(ids).logits - split(ids).logits).abs().max().item() <= 1e-4


def test_experts_really_run_from_onnx(tiny):
    # GIVEN an executor that records what it is asked to run
    from moeless.experts.runtime import OnnxExpertPool

    artifacts = tiny.package("mixtral")
    pool = OnnxExpertPool(artifacts)
    seen: list[tuple[int, int, int]] = []

    class Recording:
        def run(self, layer, inputs):
            seen.extend((layer, e, len(rows)) for e, rows in inputs.items())
            return pool.run(layer, inputs)

    split = load_split_model(artifacts, executor=Recording())
    with torch.no_grad():
        split(torch.tensor([[5, 6, 7, 8, 9]]))
    # THEN every layer sent 5 tokens x top-2 rows to its experts
    manifest = load_manifest(artifacts)
    for layer in manifest.moe_layers:
        assert sum(n for lay, _, n in seen if lay == layer) == 5 * manifest.top_k


def test_tampered_expert_is_refused_at_load(tiny, tmp_path):
    import shutil

    artifacts = tmp_path / "art"
    shutil.copytree(tiny.package("qwen3_moe"), artifacts)
    manifest = load_manifest(artifacts)
    victim = artifacts / manifest.experts[0].file
    data = bytearray(victim.read_bytes())
    data[-10] ^= 0xFF
    victim.write_bytes(bytes(data))
    split = load_split_model(artifacts)
    with pytest.raises(ArtifactError, match="does not match its manifest checksum"), torch.no_grad():
        split(torch.arange(40).unsqueeze(0))


def test_tampered_backbone_is_refused_at_load(tiny, tmp_path):
    import shutil

    artifacts = tmp_path / "art"
    shutil.copytree(tiny.package("olmoe"), artifacts)
    config = artifacts / "backbone" / "config.json"
    config.write_text(config.read_text().replace('"hidden_size": 64', '"hidden_size": 65'))
    with pytest.raises(ArtifactError, match="backbone file backbone/config.json does not match"):
        load_split_model(artifacts)


class _ScaledExperts:
    """An executor whose expert e returns its rows times (e + 1), recording what it was sent."""

    def __init__(self) -> None:
        self.calls: list[dict[int, int]] = []

    def run(self, layer: int, inputs):
        self.calls.append({e: len(rows) for e, rows in inputs.items()})
        return {e: rows * (e + 1) for e, rows in inputs.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dispatched_experts_combine_in_expert_order_exactly_as_a_per_expert_loop(dtype):
    from moeless.model.split import _dispatched_experts_class

    # GIVEN 300 tokens routed top-3 over 8 experts, with slots masked out (-1) and one id past E
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(300, 16, generator=generator).to(dtype)
    index = torch.stack([torch.randperm(8, generator=generator)[:3] for _ in range(300)])
    index[::7, 2] = -1
    index[5, 0] = 8
    weights = torch.rand(300, 3, generator=generator)
    executor = _ScaledExperts()
    experts = _dispatched_experts_class()(0, 8, executor)
    # WHEN the module combines the executor's outputs
    got = experts(hidden, index, weights)
    # THEN it equals, bit for bit, adding each expert's weighted rows in expert order
    want = torch.zeros_like(hidden)
    for e in range(8):
        tokens, slots = torch.nonzero(index == e, as_tuple=True)
        out = hidden[tokens].float().numpy() * (e + 1)
        weighted = torch.from_numpy(out).to(dtype) * weights[tokens, slots, None].to(dtype)
        want.index_add_(0, tokens, weighted)
    assert got.dtype == dtype
    assert torch.equal(got, want)
    # AND each expert got exactly its valid rows, once
    assert executor.calls == [{e: int((index == e).sum()) for e in range(8)}]


def test_dispatched_experts_with_no_valid_slot_return_zeros():
    from moeless.model.split import _dispatched_experts_class

    executor = _ScaledExperts()
    experts = _dispatched_experts_class()(0, 8, executor)
    got = experts(torch.ones(4, 16), torch.full((4, 2), -1), torch.ones(4, 2))
    assert torch.equal(got, torch.zeros(4, 16))
    assert executor.calls == [{}]
