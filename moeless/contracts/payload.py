"""The invoke payload between the backbone and an expert function (docs/design.md, "Invoke payload").

Request ``{"layer": L, "expert": e, "dtype": "float32" | "float16", "shape": [tokens, hidden],
"data": "<base64 of the little-endian row-major matrix>"}``; reply ``{"dtype", "shape", "data",
"init_ms", "compute_ms"}``; or ``{"error": {"type", "message"}}``. JSON, so it passes through
Lambda's Invoke API unchanged. numpy and pybase64 only (SIMD base64: 0.1 ms where the standard
library's binascii takes 7 ms for the 1.4 MB of a 2,000-row prefill of hidden 128): the function
image has no torch.

A function hosting several experts of one layer takes them in one invoke (a *bundle*): instead of
``"expert"``, ``"experts": [e1, e2, ...]`` and ``"rows": [n1, n2, ...]`` say that the matrix's first
``n1`` rows go to ``e1``, the next ``n2`` to ``e2``, and so on; the reply's matrix holds their
outputs in the same order. One invoke per function and layer instead of one per expert: the
invoke overhead is paid once for all of them.
"""

from __future__ import annotations

import binascii
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pybase64

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
    """A decoded request: which experts, and their input rows as float32 ``[tokens, hidden]``
    (``rows[i]`` consecutive rows for ``experts[i]``, in order)."""

    layer: int
    experts: tuple[int, ...]
    rows: tuple[int, ...]
    wire_dtype: str
    hidden: np.ndarray

    def segments(self) -> list[tuple[int, np.ndarray]]:
        """(expert, its rows) in request order."""
        bounds = np.cumsum((0, *self.rows))
        return [
            (expert, self.hidden[start:end])
            for expert, start, end in zip(self.experts, bounds[:-1], bounds[1:], strict=True)
        ]


def encode_matrix(matrix: np.ndarray, wire_dtype: str = "float32") -> dict[str, Any]:
    """``{"dtype", "shape", "data"}`` for a 2-D matrix, converted to ``wire_dtype`` little-endian."""
    assert matrix.ndim == 2, matrix.shape
    array = np.ascontiguousarray(matrix, dtype=WIRE_DTYPES[wire_dtype])
    return {
        "dtype": wire_dtype,
        "shape": list(array.shape),
        "data": pybase64.b64encode(array.data).decode("ascii"),
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
        raw = pybase64.b64decode(data, validate=True)  # refuses characters outside the alphabet
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


def encode_bundle(
    layer: int, inputs: list[tuple[int, np.ndarray]], wire_dtype: str = "float32"
) -> dict[str, Any]:
    """One request for several experts of ``layer``: ``inputs`` is (expert, rows ``[n, H]``) in order."""
    if len(inputs) == 1:
        return encode_request(layer, inputs[0][0], inputs[0][1], wire_dtype)
    return {
        "layer": layer,
        "experts": [expert for expert, _ in inputs],
        "rows": [len(rows) for _, rows in inputs],
        **encode_matrix(np.concatenate([rows for _, rows in inputs]), wire_dtype),
    }


def _non_negative_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _experts_and_rows(event: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """The request's experts and rows per expert (``None``: one expert, all rows), either form."""
    if "experts" not in event:
        expert = event.get("expert")
        if not isinstance(expert, int) or not _non_negative_int(expert):
            raise PayloadError("InvalidRequest", f"expert must be a non-negative integer, got {expert!r}")
        return (expert,), None
    if "expert" in event:
        raise PayloadError("InvalidRequest", "give either expert or experts + rows, not both")
    experts, rows = event["experts"], event.get("rows")
    if not isinstance(experts, list) or not experts or not all(map(_non_negative_int, experts)):
        raise PayloadError(
            "InvalidRequest", f"experts must be a non-empty list of non-negative integers, got {experts!r}"
        )
    if len(set(experts)) != len(experts):
        raise PayloadError("InvalidRequest", f"experts must be distinct, got {experts!r}")
    if not isinstance(rows, list) or len(rows) != len(experts) or not all(map(_non_negative_int, rows)):
        raise PayloadError(
            "InvalidRequest", f"rows must be one non-negative integer per expert, got {rows!r}"
        )
    return tuple(experts), tuple(rows)


def decode_request(event: Any) -> ExpertRequest:
    """Validate an invoke event. Raises :class:`PayloadError` naming the first problem found."""
    if not isinstance(event, dict):
        raise PayloadError("InvalidRequest", f"the payload must be a JSON object, got {type(event).__name__}")
    layer = event.get("layer")
    if not isinstance(layer, int) or not _non_negative_int(layer):
        raise PayloadError("InvalidRequest", f"layer must be a non-negative integer, got {layer!r}")
    experts, rows = _experts_and_rows(event)
    if isinstance(event.get("data"), str) and len(event["data"]) > MAX_PAYLOAD_BYTES:
        raise PayloadError(
            "PayloadTooLarge",
            f"data is {len(event['data'])} base64 bytes, over Lambda's {MAX_PAYLOAD_BYTES} byte limit: "
            "split the batch",
        )
    hidden = decode_matrix(event)
    if rows is None:
        rows = (hidden.shape[0],)
    elif sum(rows) != hidden.shape[0]:
        raise PayloadError("InvalidShape", f"rows add up to {sum(rows)} but the matrix has {hidden.shape[0]}")
    return ExpertRequest(layer, experts, rows, event.get("dtype", ""), hidden)


def max_tokens_per_request(hidden: int, wire_dtype: str = "float32") -> int:
    """Most token rows one request (or its reply) can carry under the payload limit, with JSON headroom."""
    row_b64 = 4 * -(-hidden * WIRE_DTYPES[wire_dtype].itemsize // 3)
    return max(1, (MAX_PAYLOAD_BYTES - 4096) // row_b64)
