"""One routed expert as a self-contained ONNX graph, and its check against torch.

The graph is written node by node with ``onnx.helper`` rather than traced with
``torch.onnx.export``: an expert is four to eight operators, writing them directly takes
milliseconds instead of seconds per expert (Mixtral-8x7B has 256, DeepSeek-V3 14,848), keeps
the weights in exactly the layout we choose, and needs no tracing of transformers internals.
Correctness does not rest on that choice: every graph is run by onnxruntime against the
torch computation of transformers' expert formula (:func:`reference_forward`) before it is
accepted.

Graph contract (also what the expert function serves):
    input  ``hidden``  float32 ``[tokens, H]``  (tokens is dynamic)
    output ``output``  float32 ``[tokens, H]``
Storage dtypes: ``fp32``; ``fp16`` (weights stored half, cast up at load: half the bytes,
fp32 compute); ``int8`` (onnxruntime dynamic quantisation of the MatMul weights).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from moeless.errors import PackagingError
from moeless.experts.session import session_options

if TYPE_CHECKING:
    import torch

    from moeless.model.expert_weights import ExpertWeights

OPSET = 17
DTYPES = ("fp32", "fp16", "int8")
FP32_MAX_ABS_ERROR = 1e-4
VERIFY_TOKEN_COUNTS = (1, 9)


@dataclass(frozen=True)
class ExpertSpec:
    """What an expert computes, independent of its weights."""

    kind: str  # "swiglu" | "gpt_oss"
    hidden: int
    intermediate: int
    activation: dict[str, Any]


@dataclass(frozen=True)
class VerifyResult:
    """Error of the ONNX expert against torch on random inputs (all token counts pooled)."""

    max_abs_error: float
    rel_rms_error: float


def reference_forward(weights: ExpertWeights, spec: ExpertSpec, x: torch.Tensor) -> torch.Tensor:
    """transformers' expert formula for ``x [T, H]`` -> ``[T, H]`` (float32, no routing weight)."""
    import torch
    from torch.nn import functional as F

    if spec.kind == "swiglu":
        from transformers.activations import ACT2FN

        gate, up = F.linear(x, weights.gate_up).chunk(2, dim=-1)
        return F.linear(ACT2FN[spec.activation["act"]](gate) * up, weights.down)
    alpha, limit = spec.activation["alpha"], spec.activation["limit"]
    gate_up = x @ weights.gate_up + weights.gate_up_bias
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    glu = gate * torch.sigmoid(gate * alpha)
    return ((up + 1) * glu) @ weights.down + weights.down_bias


def _split_gate_up(weights: ExpertWeights, spec: ExpertSpec) -> tuple[np.ndarray, np.ndarray | None]:
    """Return ``W [H, 2I]`` with gate columns first, then up columns, and the matching bias."""
    if spec.kind == "swiglu":
        return weights.gate_up.T.contiguous().numpy(), None
    order = np.concatenate([np.arange(0, 2 * spec.intermediate, 2), np.arange(1, 2 * spec.intermediate, 2)])
    assert weights.gate_up_bias is not None, "GPT-OSS experts carry a gate/up bias"
    bias = weights.gate_up_bias.numpy()[order]
    return weights.gate_up.numpy()[:, order], bias


def build_expert_model(weights: ExpertWeights, spec: ExpertSpec, dtype: str, name: str) -> bytes:
    """Serialise one expert as an ONNX model (weights inside the file).

    Args:
        weights: the expert in transformers' layout (see :class:`ExpertWeights`).
        spec: kind and sizes.
        dtype: ``fp32`` | ``fp16`` | ``int8``.
        name: graph name, e.g. ``"L003_E017"``.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    assert dtype in DTYPES, dtype
    w_gate_up, b_gate_up = _split_gate_up(weights, spec)
    w_down = weights.down.T.contiguous().numpy() if spec.kind == "swiglu" else weights.down.numpy()
    b_down = weights.down_bias.numpy() if weights.down_bias is not None else None
    store = np.float16 if dtype == "fp16" else np.float32

    nodes: list[Any] = []
    inits: list[Any] = []

    def weight(tensor_name: str, array: np.ndarray) -> str:
        """Add an initializer; in fp16 storage, add a Cast back to float32 and return its output."""
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array.astype(store)), tensor_name))
        if store is np.float32:
            return tensor_name
        nodes.append(helper.make_node("Cast", [tensor_name], [f"{tensor_name}_f32"], to=TensorProto.FLOAT))
        return f"{tensor_name}_f32"

    def const(tensor_name: str, value: float) -> str:
        inits.append(numpy_helper.from_array(np.array(value, dtype=np.float32), tensor_name))
        return tensor_name

    inter = spec.intermediate
    inits.append(numpy_helper.from_array(np.array([inter, inter], dtype=np.int64), "split_sizes"))
    gate_up = "gate_up"
    nodes.append(helper.make_node("MatMul", ["hidden", weight("w_gate_up", w_gate_up)], [gate_up]))
    if b_gate_up is not None:
        nodes.append(helper.make_node("Add", [gate_up, weight("b_gate_up", b_gate_up)], ["gate_up_b"]))
        gate_up = "gate_up_b"
    nodes.append(helper.make_node("Split", [gate_up, "split_sizes"], ["gate", "up"], axis=1))
    if spec.kind == "swiglu":
        nodes += [
            helper.make_node("Sigmoid", ["gate"], ["gate_sig"]),
            helper.make_node("Mul", ["gate", "gate_sig"], ["gate_act"]),
            helper.make_node("Mul", ["gate_act", "up"], ["inner"]),
        ]
    else:
        limit, alpha = spec.activation["limit"], spec.activation["alpha"]
        nodes += [
            helper.make_node("Min", ["gate", const("limit", limit)], ["gate_c"]),
            helper.make_node("Clip", ["up", const("neg_limit", -limit), "limit"], ["up_c"]),
            helper.make_node("Mul", ["gate_c", const("alpha", alpha)], ["gate_scaled"]),
            helper.make_node("Sigmoid", ["gate_scaled"], ["gate_sig"]),
            helper.make_node("Mul", ["gate_c", "gate_sig"], ["glu"]),
            helper.make_node("Add", ["up_c", const("one", 1.0)], ["up_1"]),
            helper.make_node("Mul", ["up_1", "glu"], ["inner"]),
        ]
    out = "output"
    down_out = out if b_down is None else "down_out"
    nodes.append(helper.make_node("MatMul", ["inner", weight("w_down", w_down)], [down_out]))
    if b_down is not None:
        nodes.append(helper.make_node("Add", [down_out, weight("b_down", b_down)], [out]))

    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["tokens", spec.hidden])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["tokens", spec.hidden])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="moeless")
    model.ir_version = 8
    helper.set_model_props(model, {"moeless.kind": spec.kind, "moeless.dtype": dtype})
    onnx.checker.check_model(model)
    if dtype == "int8":
        return _quantise_int8(model)
    return model.SerializeToString()


def _quantise_int8(model: Any) -> bytes:
    """Dynamic int8 quantisation of the MatMul weights (activations quantised per call)."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The quantiser logs a generic "consider pre-processing" warning on the root logger for
    # every model; shape inference adds nothing for a two-MatMul graph, so keep it quiet.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with tempfile.TemporaryDirectory(prefix="moeless-int8-") as tmp:
            out = Path(tmp) / "int8.onnx"
            # 7-bit weights: on AVX2 CPUs without VNNI onnxruntime's u8s8 kernel (VPMADDUBSW) can
            # saturate (its quantisation docs); 8-bit weights measured 7.0% relative RMS error there.
            quantize_dynamic(model, out, weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)
            return out.read_bytes()
    finally:
        root.setLevel(level)


def verify_expert_model(
    model_bytes: bytes,
    weights: ExpertWeights,
    spec: ExpertSpec,
    dtype: str,
    seed: int,
    threads: int = 1,
    fp32_atol: float = FP32_MAX_ABS_ERROR,
) -> VerifyResult:
    """Run the ONNX expert and the torch reference on the same random inputs and compare.

    Inputs are standard-normal ``[T, H]`` for each T in ``VERIFY_TOKEN_COUNTS`` (exercising
    the dynamic token axis), seeded so a re-run measures the same error.

    Raises:
        PackagingError: fp32 error above ``fp32_atol``, or a non-finite output.
    """
    import onnxruntime as ort
    import torch

    session = ort.InferenceSession(model_bytes, session_options(threads), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    max_abs, sq_err, sq_ref = 0.0, 0.0, 0.0
    for tokens in VERIFY_TOKEN_COUNTS:
        x = rng.standard_normal((tokens, spec.hidden), dtype=np.float32)
        (got,) = session.run(["output"], {"hidden": x})
        with torch.no_grad():
            want = reference_forward(weights, spec, torch.from_numpy(x)).numpy()
        if got.shape != want.shape or not np.all(np.isfinite(got)):
            raise PackagingError(f"{dtype} expert {session.get_modelmeta().graph_name} gave a bad output")
        diff = got.astype(np.float64) - want.astype(np.float64)
        max_abs = max(max_abs, float(np.max(np.abs(diff))))
        sq_err += float(np.sum(diff**2))
        sq_ref += float(np.sum(want.astype(np.float64) ** 2))
    result = VerifyResult(max_abs_error=max_abs, rel_rms_error=float(np.sqrt(sq_err / max(sq_ref, 1e-30))))
    if dtype == "fp32" and result.max_abs_error > fp32_atol:
        raise PackagingError(
            f"expert {session.get_modelmeta().graph_name} rejected: fp32 max abs error "
            f"{result.max_abs_error:.2e} > {fp32_atol:.0e} against torch (relative RMS error "
            f"{result.rel_rms_error:.1e}; if that is tiny, the outputs are simply large: raise --fp32-atol)"
        )
    return result
