"""One expert as ONNX: the torch reference is transformers' own module, and the graph matches it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moeless.model.expert_weights import ExpertWeights
from moeless.model.export import ExpertSpec, build_expert_model, reference_forward, verify_expert_model


def _run(model_bytes: bytes, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return session.run(["output"], {"hidden": x})[0]


def test_swiglu_reference_equals_transformers_mixtral_experts():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    # GIVEN transformers' fused experts module with random weights
    torch.manual_seed(0)
    config = MixtralConfig(hidden_size=16, intermediate_size=24, num_local_experts=3)
    module = MixtralExperts(config)
    torch.nn.init.normal_(module.gate_up_proj)
    torch.nn.init.normal_(module.down_proj)
    x = torch.randn(5, 16)
    # WHEN every token goes to expert 2 with weight 1
    want = module(x, torch.full((5, 1), 2), torch.ones(5, 1))
    weights = ExpertWeights(gate_up=module.gate_up_proj[2].detach(), down=module.down_proj[2].detach())
    got = reference_forward(weights, ExpertSpec("swiglu", 16, 24, {"act": "silu"}), x)
    # THEN our reference is transformers' computation
    torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-6)


def test_gpt_oss_graph_matches_transformers_in_the_clamped_range():
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    # GIVEN GPT-OSS experts whose weights are large enough to hit the swiglu clamp (limit 7)
    torch.manual_seed(1)
    config = GptOssConfig(hidden_size=16, intermediate_size=8, num_local_experts=2)
    module = GptOssExperts(config)
    for param in module.parameters():
        torch.nn.init.normal_(param, std=3.0)
    x = torch.randn(6, 16)
    spec = ExpertSpec("gpt_oss", 16, 8, {"alpha": config.swiglu_alpha, "limit": config.swiglu_limit})
    weights = ExpertWeights(
        gate_up=module.gate_up_proj[1].detach(),
        down=module.down_proj[1].detach(),
        gate_up_bias=module.gate_up_proj_bias[1].detach(),
        down_bias=module.down_proj_bias[1].detach(),
    )
    gate_up = x @ weights.gate_up + weights.gate_up_bias
    assert (gate_up.abs() > config.swiglu_limit).any(), "the test must exercise the clamp"
    # WHEN transformers, our reference and the ONNX graph compute expert 1
    want = module(x, torch.full((6, 1), 1), torch.ones(6, 1)).detach()
    ref = reference_forward(weights, spec, x)
    got = _run(build_expert_model(weights, spec, "fp32", "t"), x.numpy())
    # THEN all three agree (relative to the large output scale)
    torch.testing.assert_close(ref, want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize(
    ("dtype", "max_rel_rms", "size_ratio"),
    [
        pytest.param("fp32", 1e-6, 1.0, id="fp32"),
        pytest.param("fp16", 2e-3, 0.5, id="fp16-half-size"),
        pytest.param("int8", 0.06, 0.25, id="int8-quarter-size"),
    ],
)
def test_storage_dtypes_record_their_error(dtype, max_rel_rms, size_ratio):
    torch.manual_seed(2)
    spec = ExpertSpec("swiglu", 64, 256, {"act": "silu"})
    weights = ExpertWeights(gate_up=torch.randn(512, 64) * 0.1, down=torch.randn(64, 256) * 0.1)
    fp32_size = len(build_expert_model(weights, spec, "fp32", "t"))
    model = build_expert_model(weights, spec, dtype, "t")
    result = verify_expert_model(model, weights, spec, dtype, seed=0)
    assert result.rel_rms_error <= max_rel_rms
    assert len(model) <= fp32_size * size_ratio * 1.15


def test_fp32_expert_over_tolerance_is_rejected():
    from moeless.errors import PackagingError

    # GIVEN an ONNX expert built from weights that differ from the ones we check against
    torch.manual_seed(3)
    spec = ExpertSpec("swiglu", 32, 64, {"act": "silu"})
    weights = ExpertWeights(gate_up=torch.randn(128, 32), down=torch.randn(32, 64))
    tampered = ExpertWeights(gate_up=weights.gate_up + 1e-3, down=weights.down)
    model = build_expert_model(tampered, spec, "fp32", "L000_E000")
    # WHEN it is verified, THEN it is rejected with the measured error
    with pytest.raises(PackagingError, match="rejected: fp32 max abs error"):
        verify_expert_model(model, weights, spec, "fp32", seed=0)
