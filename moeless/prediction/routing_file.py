"""Per-token routing files recorded outside moeless (e.g. ``../shared/data/routing/gptoss20b_decode.*``).

A routing file is a pair beside each other::

    STEM.npz              request[T] int, position[T] int, experts[T, L, k] int, weights[T, L, k] float
    STEM.requests.jsonl   {"request": r, "prompt": "...", ...} per request
    STEM.loads.json       optional: the loads header (``model``, ``num_experts``, ...)

:func:`load_routing` reads it into a :class:`moeless.prediction.trace.Trace` (layers in file order,
every token a decode token, no router inputs), so that every predictor and metric written for
``moeless profile`` traces runs on a real model's routing unchanged. :func:`load_routing_or_trace` takes
either form.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from moeless.prediction.trace import Trace, TraceError, jsonl_rows, load_trace

REQUIRED = ("request", "position", "experts", "weights")


def _stem(path: Path) -> Path:
    return path.with_suffix("") if path.suffix == ".npz" else path


def _read_requests(path: Path) -> list[dict]:
    rows = []
    for number, row in jsonl_rows(path):
        if not isinstance(row, dict) or not isinstance(row.get("request"), int):
            raise TraceError(f'{path}:{number} has no integer "request"')
        if not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise TraceError(f'{path}:{number} has no "prompt" string')
        rows.append(row)
    return rows


def _header(stem: Path) -> dict:
    path = stem.with_name(stem.name + ".loads.json")
    if not path.is_file():
        return {}
    try:
        loads = json.loads(path.read_text())
    except ValueError:
        raise TraceError(f"{path} is not JSON") from None
    return {key: value for key, value in loads.items() if key != "layers"} if isinstance(loads, dict) else {}


def load_routing(path: Path) -> Trace:
    """Read ``STEM.npz`` + ``STEM.requests.jsonl`` (see the module docstring) as a decode-only trace.

    Raises:
        TraceError: a file is missing, an array is absent or has the wrong shape or type, an expert id
            is out of range, or a token's request has no prompt.
    """
    stem = _stem(Path(path))
    npz, requests_path = stem.with_name(stem.name + ".npz"), stem.with_name(stem.name + ".requests.jsonl")
    try:
        with np.load(npz) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError) as exc:
        raise TraceError(f"{npz} is not a readable .npz: {exc}") from None
    missing = [key for key in REQUIRED if key not in arrays]
    if missing:
        raise TraceError(f"{npz} lacks {', '.join(missing)} (needs {', '.join(REQUIRED)})")
    request, position, experts, weights = (arrays[key] for key in REQUIRED)
    if experts.ndim != 3 or not len(experts):
        raise TraceError(f"{npz}: experts must be [tokens, layers, k], got shape {experts.shape}")
    tokens, layers, top_k = experts.shape
    if weights.shape != experts.shape:
        raise TraceError(f"{npz}: weights {weights.shape} do not match experts {experts.shape}")
    if request.shape != (tokens,) or position.shape != (tokens,):
        raise TraceError(f"{npz}: request and position must be [{tokens}] like experts' first axis")
    for key, array in (("request", request), ("position", position), ("experts", experts)):
        if not np.issubdtype(array.dtype, np.integer):
            raise TraceError(f"{npz}: {key} must hold integers, not {array.dtype}")
    if not np.issubdtype(weights.dtype, np.floating):
        raise TraceError(f"{npz}: weights must be floats, not {weights.dtype}")
    header = _header(stem)
    num_experts = int(header.get("num_experts") or int(experts.max()) + 1)
    if experts.min() < 0 or experts.max() >= num_experts:
        raise TraceError(f"{npz}: expert ids must lie in [0, {num_experts})")
    prompts = _read_requests(requests_path)
    known = {row["request"] for row in prompts}
    orphans = sorted(set(np.unique(request).tolist()) - known)
    if orphans:
        raise TraceError(f"{requests_path} has no prompt for requests {orphans[:5]}")
    meta = {
        "model": header.get("model", stem.name),
        "architecture": header.get("model", "external"),
        "num_experts": num_experts,
        "top_k": top_k,
        "moe_layers": list(range(layers)),
        "requests": len(prompts),
        "tokens": tokens,
        "trace_dir": str(stem),
        "source": "routing file",
    }
    return Trace(
        meta,
        prompts,
        request.astype(np.int32),
        position.astype(np.int32),
        np.ones(tokens, np.int8),
        np.ascontiguousarray(experts.transpose(1, 0, 2)).astype(np.int16),
        np.ascontiguousarray(weights.transpose(1, 0, 2)).astype(np.float16),
        np.zeros(0, np.int32),
        np.zeros((layers, 0, 0), np.float16),
    )


def load_routing_or_trace(path: Path) -> Trace:
    """A ``moeless profile`` trace folder, or a routing file (``STEM.npz``)."""
    path = Path(path)
    return load_trace(path) if path.is_dir() else load_routing(path)
