"""What one expert function instance does: load its experts once, then serve invokes.

Used by ``functions/expert/handler.py`` (the Lambda) and needs only numpy and onnxruntime
(plus boto3, which AWS's Lambda Python images carry, for ``s3://`` sources).

Configuration (environment of the function):
    MOELESS_EXPERTS_URI   folder or ``s3://bucket/prefix`` holding ``manifest.json`` and ``experts/``
    MOELESS_EXPERTS       experts this function hosts, ``"L:E,L:E"``; empty: every expert in the manifest
    MOELESS_THREADS       onnxruntime intra-op threads; default: the instance's vCPUs
    AWS_LAMBDA_INITIALIZATION_TYPE   set by Lambda; ``provisioned-concurrency`` means init ran before
                          any request, so no invoke reports it as ``init_ms``
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from moeless.artifacts.verify import read_verified
from moeless.aws_limits import DEFAULT_LIMITS
from moeless.contracts.environment import EXPERTS, EXPERTS_URI, THREADS, parse_expert_list
from moeless.contracts.manifest import ExpertEntry, Manifest, load_manifest
from moeless.contracts.payload import MAX_PAYLOAD_BYTES, PayloadError, decode_request, encode_matrix
from moeless.errors import ArtifactError

DEFAULT_CACHE = Path("/tmp/moeless-experts")
ON_DEMAND_INIT_WAIT_S = DEFAULT_LIMITS.on_demand_init_s - 1.0
"""How long an on-demand init waits for the experts. Lambda limits that init to 10 s and, beyond
it, runs init again inside the first invoke (:class:`moeless.aws_limits.LambdaLimits`): a load
that takes longer goes on past init instead, in a thread, and the first invoke waits for it under
the function's timeout, so no init is thrown away. A provisioned environment's init may take 130 s
or the timeout, whichever is longer, and loads in full."""


def _fetch_from_s3(uri: str, experts: list[tuple[int, int]] | None, cache_dir: Path) -> Path:
    """Download the manifest and the hosted experts' files from ``s3://bucket/prefix`` to ``cache_dir``."""
    import boto3

    from moeless.artifacts.store import download_artifacts

    download_artifacts(boto3.client("s3"), uri, cache_dir, experts, backbone=False)
    return cache_dir


def _hosted_entries(manifest: Manifest, experts: list[tuple[int, int]] | None) -> list[ExpertEntry]:
    if not experts:
        return list(manifest.experts)
    try:
        return [manifest.expert(layer, expert) for layer, expert in experts]
    except KeyError as exc:
        raise ArtifactError(f"expert {exc.args[0]} is not in the manifest") from None


class ExpertFunction:
    """One instance's experts: onnxruntime sessions created at init, reused by every invoke.

    Args:
        source: artifacts folder, or ``s3://bucket/prefix``.
        experts: (layer, expert) pairs to host; ``None``: all of the manifest.
        threads: onnxruntime intra-op threads (the instance's vCPUs by default).
        report_init: whether the first invoke reports this instance's init time as ``init_ms``.
        log_stream: where one JSON line per invoke goes (CloudWatch on Lambda).

    Raises:
        ArtifactError: manifest missing, an expert unknown, or a file failing its checksum.
    """

    def __init__(
        self,
        source: str,
        experts: list[tuple[int, int]] | None = None,
        threads: int | None = None,
        report_init: bool = True,
        cache_dir: Path = DEFAULT_CACHE,
        log_stream: IO[str] | None = None,
        init_wait_s: float | None = None,
    ) -> None:
        self._started = time.perf_counter()
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        self.sessions: dict[tuple[int, int], Any] = {}
        self.init_ms = 0.0
        self._report_init = report_init
        self._pending_init_ms = 0.0
        self.log_stream = log_stream or sys.stdout
        loader = threading.Thread(
            target=self._load, args=(source, experts, threads, cache_dir), name="load-experts", daemon=True
        )
        loader.start()
        loader.join(init_wait_s)
        if self._loaded.is_set() and self._load_error is not None:
            raise self._load_error

    def _load(
        self, source: str, experts: list[tuple[int, int]] | None, threads: int | None, cache_dir: Path
    ) -> None:
        """Fetch (from S3) and open the hosted experts; the first invoke waits for this to end."""
        import onnxruntime as ort

        from moeless.experts.session import session_options

        try:
            root = _fetch_from_s3(source, experts, cache_dir) if source.startswith("s3://") else Path(source)
            self.manifest = load_manifest(root)
            self.hidden = self.manifest.hidden_size
            options = session_options(threads or os.cpu_count() or 1)
            for entry in _hosted_entries(self.manifest, experts):
                data = read_verified(root, entry)
                self.sessions[(entry.layer, entry.expert)] = ort.InferenceSession(
                    data, options, providers=["CPUExecutionProvider"]
                )
            self.init_ms = (time.perf_counter() - self._started) * 1e3
            self._pending_init_ms = self.init_ms if self._report_init else 0.0
        except BaseException as exc:  # handed to init, or to the invoke that waits for the load
            self._load_error = exc
        finally:
            self._loaded.set()

    def _ready(self) -> None:
        """Wait for the experts (a load that outlived init goes on into the first invoke)."""
        self._loaded.wait()
        if self._load_error is not None:
            raise self._load_error

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ExpertFunction:
        """Build from the function's environment (see the module docstring)."""
        source = env.get(EXPERTS_URI)
        if not source:
            raise ArtifactError("MOELESS_EXPERTS_URI is not set: where are this function's experts?")
        threads = int(env[THREADS]) if env.get(THREADS) else None
        on_demand = env.get("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand") == "on-demand"
        return cls(
            source,
            parse_expert_list(env.get(EXPERTS, "")) or None,
            threads,
            report_init=env.get("AWS_LAMBDA_INITIALIZATION_TYPE") != "provisioned-concurrency",
            init_wait_s=ON_DEMAND_INIT_WAIT_S if on_demand else None,
        )

    def invoke(self, event: Any, request_id: str = "") -> dict[str, Any]:
        """Run one request; never raises for bad input (returns ``{"error": ...}`` instead)."""
        self._ready()
        try:
            reply = self._run(event)
        except PayloadError as exc:
            reply = exc.to_reply()
        cold = False
        if "error" not in reply:  # a refused request does not consume the cold start
            cold = self._pending_init_ms > 0
            reply["init_ms"] = round(self._pending_init_ms, 3)
            self._pending_init_ms = 0.0
        self._log(request_id, cold, event, reply)
        return reply

    def _run(self, event: Any) -> dict[str, Any]:
        request = decode_request(event)
        missing = [e for e in request.experts if (request.layer, e) not in self.sessions]
        if missing:
            hosted = ", ".join(f"{layer}:{expert}" for layer, expert in sorted(self.sessions))
            raise PayloadError(
                "UnknownExpert",
                f"layer {request.layer} expert {missing[0]} is not hosted here (hosted: {hosted})",
            )
        if request.hidden.shape[1] != self.hidden:
            raise PayloadError(
                "InvalidShape", f"hidden size {request.hidden.shape[1]} != the model's {self.hidden}"
            )
        started = time.perf_counter()
        outputs = [
            self.sessions[(request.layer, expert)].run(["output"], {"hidden": rows})[0]
            for expert, rows in request.segments()
        ]
        output = outputs[0] if len(outputs) == 1 else np.concatenate(outputs)
        compute_ms = (time.perf_counter() - started) * 1e3
        reply = encode_matrix(output, request.wire_dtype) | {"compute_ms": round(compute_ms, 3)}
        if len(reply["data"]) > MAX_PAYLOAD_BYTES:
            raise PayloadError("PayloadTooLarge", "the reply exceeds Lambda's payload limit: split the batch")
        return reply

    def _log(self, request_id: str, cold: bool, event: Any, reply: dict[str, Any]) -> None:
        record: dict[str, Any] = {
            "level": "ERROR" if "error" in reply else "INFO",
            "request_id": request_id,
            "cold_start": cold,
        }
        if isinstance(event, dict):
            record |= {
                "layer": event.get("layer"),
                "expert": event.get("expert", event.get("experts")),
                "shape": event.get("shape"),
            }
        record |= reply.get("error", {}) or {
            "compute_ms": reply.get("compute_ms"),
            "init_ms": reply.get("init_ms"),
        }
        self.log_stream.write(json.dumps(record, default=str) + "\n")
        self.log_stream.flush()
