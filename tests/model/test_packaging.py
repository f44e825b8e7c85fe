"""``moeless package``: manifest, resume, atomicity, bad input."""

from __future__ import annotations

import errno
import json
import shutil

import pytest

from moeless.artifacts.verify import verify_artifacts
from moeless.contracts.manifest import MANIFEST_NAME, load_manifest
from moeless.errors import ArtifactError, CheckpointError, PackagingError, UnsupportedArchitectureError
from moeless.fileio import sha256_file
from moeless.model import packaging
from moeless.model.export import FP32_MAX_ABS_ERROR
from moeless.model.packaging import package
from moeless.model.tiny import TINY_ARCHS


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_manifest_describes_every_file(tiny, arch):
    artifacts = tiny.package(arch)
    manifest = load_manifest(artifacts)
    assert manifest.architecture == arch
    assert len(manifest.experts) == len(manifest.moe_layers) * manifest.num_experts
    assert all(e.max_abs_error <= FP32_MAX_ABS_ERROR for e in manifest.experts)
    for entry in manifest.all_files():
        assert sha256_file(artifacts / entry.file) == entry.sha256
        assert (artifacts / entry.file).stat().st_size == entry.bytes
    assert verify_artifacts(artifacts) == []


def test_deepseek_dense_first_layer_and_shared_experts_stay_in_backbone(tiny):
    from safetensors import safe_open

    manifest = load_manifest(tiny.package("deepseek_v3", layers=3))
    assert manifest.moe_layers == [1, 2]  # first_k_dense_replace=1
    assert manifest.routing["rule"] == "sigmoid_grouped_topk"
    names = set()
    for entry in manifest.backbone_files():
        if entry.file.endswith(".safetensors"):
            with safe_open(tiny.package("deepseek_v3", layers=3) / entry.file, "pt") as handle:
                names |= set(handle.keys())
    assert any(".shared_experts." in n for n in names)
    assert not any(".experts." in n and ".shared_experts." not in n for n in names)


def test_rerun_reuses_and_redoes_only_what_changed(tiny, tmp_path):
    out = tmp_path / "art"
    first = package(tiny.model("olmoe"), out, progress=False)
    assert first.experts_exported == 16
    # GIVEN one expert file altered and one deleted
    (out / first.manifest.experts[3].file).write_bytes(b"tampered")
    (out / first.manifest.experts[5].file).unlink()
    # WHEN packaging runs again
    second = package(tiny.model("olmoe"), out, progress=False)
    # THEN exactly those two are exported again, and the result is byte-identical
    assert (second.experts_exported, second.experts_reused) == (2, 14)
    assert [e.sha256 for e in second.manifest.experts] == [e.sha256 for e in first.manifest.experts]
    assert verify_artifacts(out) == []


def test_parallel_jobs_give_identical_files(tiny, tmp_path):
    serial = package(tiny.model("mixtral"), tmp_path / "j1", jobs=1, progress=False).manifest
    parallel = package(tiny.model("mixtral"), tmp_path / "j3", jobs=3, progress=False).manifest
    assert [e.sha256 for e in serial.experts] == [e.sha256 for e in parallel.experts]


def test_interrupted_run_leaves_nothing_verify_accepts_and_resumes(tiny, tmp_path, monkeypatch):
    out = tmp_path / "art"
    real_export = packaging._export_expert
    calls = {"n": 0}

    def export_then_interrupt(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt
        return real_export(*args, **kwargs)

    # GIVEN a run interrupted after 5 experts
    monkeypatch.setattr(packaging, "_export_expert", export_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        package(tiny.model("mixtral"), out, progress=False)
    # THEN there is no manifest, verify refuses the folder, and no temporary file is left
    assert not (out / MANIFEST_NAME).exists()
    with pytest.raises(ArtifactError, match="manifest.json is missing"):
        verify_artifacts(out)
    assert not list(out.rglob(".*.tmp-*"))
    # WHEN it is run again, THEN it resumes from the 5 finished experts
    monkeypatch.setattr(packaging, "_export_expert", real_export)
    report = package(tiny.model("mixtral"), out, progress=False)
    assert (report.experts_reused, report.experts_exported) == (5, 11)
    assert verify_artifacts(out) == []


def test_disk_full_is_one_clear_error_and_no_package(tiny, tmp_path, monkeypatch):
    out = tmp_path / "art"
    real_write_bytes = packaging.Path.write_bytes

    def fill_disk_at_expert_l1_e2(self, data):
        if self.name.startswith(".L001_E002.onnx.tmp"):
            real_write_bytes(self, data[:100])  # a partial write, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_bytes(self, data)

    # GIVEN a disk that fills up while the 11th expert is written
    monkeypatch.setattr(packaging.Path, "write_bytes", fill_disk_at_expert_l1_e2)
    # WHEN packaging, THEN one error names the file, no manifest exists and no partial file is left
    with pytest.raises(PackagingError, match="disk full while writing .*L001_E002.onnx"):
        package(tiny.model("mixtral"), out, progress=False)
    assert not (out / MANIFEST_NAME).exists()
    assert not list(out.rglob(".*.tmp-*"))
    assert not (out / "experts" / "L001_E002.onnx").exists()


def test_sharded_checkpoint_is_read_lazily(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    # GIVEN a GPT-OSS checkpoint (fused experts) saved in many small shards with an index
    model = AutoModelForCausalLM.from_pretrained(tiny.model("gpt_oss"))
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="40KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny.model("gpt_oss") / name, sharded / name)
    assert (sharded / "model.safetensors.index.json").is_file()
    # WHEN it is packaged, THEN the experts are the same files as from the single-file checkpoint
    manifest = package(sharded, tmp_path / "art", progress=False).manifest
    reference = load_manifest(tiny.package("gpt_oss"))
    assert [e.sha256 for e in manifest.experts] == [e.sha256 for e in reference.experts]


def _sharded_copy(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny.model("qwen2_moe"))
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="100KB")
    return sharded


def test_missing_shard_is_named(tiny, tmp_path):
    sharded = _sharded_copy(tiny, tmp_path)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[1]
    (sharded / victim).unlink()
    with pytest.raises(CheckpointError, match=f"shard {victim} .* is missing"):
        package(sharded, tmp_path / "art", progress=False)
    assert not (tmp_path / "art").exists()


def test_truncated_shard_is_refused(tiny, tmp_path):
    sharded = _sharded_copy(tiny, tmp_path)
    victim = sorted(sharded.glob("model-*.safetensors"))[0]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        package(sharded, tmp_path / "art", progress=False)


def test_missing_directory_and_non_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        package(tmp_path / "nope", tmp_path / "art", progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        package(tmp_path / "empty", tmp_path / "art", progress=False)


def _save_config_only(config, folder):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)


def test_dense_model_is_refused_clearly(tmp_path):
    from transformers import LlamaConfig

    _save_config_only(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        ),
        tmp_path / "llama",
    )
    with pytest.raises(UnsupportedArchitectureError, match="'llama' is not a Mixture-of-Experts model"):
        package(tmp_path / "llama", tmp_path / "art", progress=False)


def test_llama4_is_refused_by_name(tmp_path):
    (tmp_path / "l4").mkdir()
    (tmp_path / "l4" / "config.json").write_text(
        json.dumps({"model_type": "llama4_text", "num_local_experts": 16})
    )
    import torch
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, tmp_path / "l4" / "model.safetensors")
    with pytest.raises(UnsupportedArchitectureError, match="Llama 4"):
        package(tmp_path / "l4", tmp_path / "art", progress=False)


def test_quantised_experts_are_refused(tiny, tmp_path):
    from safetensors.torch import load_file, save_file

    src = tiny.model("gpt_oss")
    folder = tmp_path / "mxfp4"
    shutil.copytree(src, folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.mlp.experts.gate_up_proj_blocks"] = tensors.pop(
        "model.layers.0.mlp.experts.gate_up_proj"
    )
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(UnsupportedArchitectureError, match="MXFP4"):
        package(folder, tmp_path / "art", progress=False)


def test_fp8_weights_are_refused_not_read_without_their_scales(tiny, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "fp8"
    shutil.copytree(tiny.model("deepseek_v3"), folder)
    tensors = load_file(folder / "model.safetensors")
    name = next(k for k in tensors if ".experts.0.gate_proj.weight" in k)
    tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    tensors[name.replace(".weight", ".weight_scale_inv")] = torch.ones(1, 1)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(UnsupportedArchitectureError, match="fp8_cast_bf16"):
        package(folder, tmp_path / "art", progress=False)
