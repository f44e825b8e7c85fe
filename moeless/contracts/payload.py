"""The invoke payload between the backbone and an expert function (docs/design.md, "Invoke payload").

Request ``{"layer": L, "expert": e, "dtype": "float32" | "float16", "shape": [tokens, hidden],
"data": "<base64 of the little-endian row-major matrix>"}``; reply ``{"dtype", "shape", "data",
"init_ms", "compute_ms"}``; or ``{"error": {"type", "message"}}``. JSON, so it passes through
Lambda's Invoke API unchanged. numpy only: the function image has no torch.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

# Lambda's synchronous invoke payload limit (request and response), bytes of JSON.
MAX_PAYLOAD_BYTES = 6 * 1024 * 1024
WIRE_DTYPES: dict[str, np.dtype[Any]] = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}


class PayloadError(ValueError):
    """A request the function refuses; ``type`` names the kind of problem for the caller."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(message)
        self.type = type_

    def to_reply(self) -> dict[str, Any]:
        return {"error": {"type": self.type, "message": str(self)}}


@dataclass(frozen=True)
class ExpertRequest:
    """A decoded request: which expert, and its input rows as float32 ``[tokens, hidden]``."""

    layer: int
    expert: int
    wire_dtype: str
    hidden: np.ndarray


def encode_matrix(matrix: np.ndarray, wire_dtype: str = "float32") -> dict[str, Any]:
    """``{"dtype", "shape", "data"}`` for a 2-D matrix, converted to ``wire_dtype`` little-endian."""
    assert matrix.ndim == 2, matrix.shape
    array = np.ascontiguousarray(matrix, dtype=WIRE_DTYPES[wire_dtype])
    return {
        "dtype": wire_dtype,
        "shape": list(array.shape),
        "data": base64.b64encode(array.tobytes()).decode(),
    }


def decode_matrix(obj: dict[str, Any]) -> np.ndarray:
    """Inverse of :func:`encode_matrix`, returning float32. Raises :class:`PayloadError`."""
    wire_dtype = obj.get("dtype")
    if wire_dtype not in WIRE_DTYPES:
        raise PayloadError("InvalidDtype", f"dtype must be one of {sorted(WIRE_DTYPES)}, got {wire_dtype!r}")
    shape = obj.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) != 2
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
    ):
        raise PayloadError(
            "InvalidShape", f"shape must be [tokens, hidden] of non-negative ints, got {shape!r}"
        )
    data = obj.get("data")
    if not isinstance(data, str):
        raise PayloadError("InvalidData", "data must be a base64 string")
    try:
        # strict mode refuses characters outside the alphabet, like validate=True, without a regex pass
        raw = binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise PayloadError("InvalidData", f"data is not valid base64: {exc}") from exc
    itemsize = WIRE_DTYPES[wire_dtype].itemsize
    needed = shape[0] * shape[1] * itemsize
    if len(raw) != needed:
        raise PayloadError(
            "InvalidShape", f"data holds {len(raw)} bytes but shape {shape} of {wire_dtype} needs {needed}"
        )
    return np.frombuffer(raw, dtype=WIRE_DTYPES[wire_dtype]).reshape(shape).astype(np.float32, copy=False)


def payload_json(payload: dict[str, Any]) -> bytes:
    """``payload`` as JSON bytes, its base64 ``data`` spliced in without a scan for escapes.

    The base64 alphabet needs no JSON escaping, and json.dumps spends most of its time scanning the
    long string: about 1 ms of 1.5 ms for 64 tokens x 1024 (benchmarks/invoke_overhead.py).
    """
    data = payload.get("data")
    if not isinstance(data, str):
        return json.dumps(payload).encode()
    head = json.dumps({key: value for key, value in payload.items() if key != "data"})[:-1]
    separator = ", " if len(head) > 1 else ""
    return f'{head}{separator}"data": "'.encode() + data.encode("ascii") + b'"}'


def encode_request(
    layer: int, expert: int, hidden: np.ndarray, wire_dtype: str = "float32"
) -> dict[str, Any]:
    """The request for ``hidden [tokens, H]`` to expert ``(layer, expert)``."""
    return {"layer": layer, "expert": expert, **encode_matrix(hidden, wire_dtype)}


def decode_request(event: Any) -> ExpertRequest:
    """Validate an invoke event. Raises :class:`PayloadError` naming the first problem found."""
    if not isinstance(event, dict):
        raise PayloadError("InvalidRequest", f"the payload must be a JSON object, got {type(event).__name__}")
    for key in ("layer", "expert"):
        value = event.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise PayloadError("InvalidRequest", f"{key} must be a non-negative integer, got {value!r}")
    if isinstance(event.get("data"), str) and len(event["data"]) > MAX_PAYLOAD_BYTES:
        raise PayloadError(
            "PayloadTooLarge",
            f"data is {len(event['data'])} base64 bytes, over Lambda's {MAX_PAYLOAD_BYTES} byte limit: "
            "split the batch",
        )
    return ExpertRequest(event["layer"], event["expert"], event.get("dtype", ""), decode_matrix(event))


def max_tokens_per_request(hidden: int, wire_dtype: str = "float32") -> int:
    """Most token rows one request (or its reply) can carry under the payload limit, with JSON headroom."""
    row_b64 = 4 * -(-hidden * WIRE_DTYPES[wire_dtype].itemsize // 3)
    return max(1, (MAX_PAYLOAD_BYTES - 4096) // row_b64)
