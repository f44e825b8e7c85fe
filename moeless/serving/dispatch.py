"""Routed experts run as Lambda functions: the serverless :class:`ExpertExecutor`.

For each needed expert of a layer, the dispatcher splits its token rows over its replicas
(:meth:`~moeless.contracts.plan.Plan.invoke_targets`: concurrent environments of the functions
hosting it; join-the-shortest-queue on tokens in flight), invokes them all concurrently
through boto3 ``lambda.invoke`` (AWS, or the local host), and reassembles the outputs in token
order. Slices of several experts bound for one function (one hosting several experts of the
layer) travel as one bundled invoke (:func:`~moeless.planning.packing.bundle_slices`), so that
function pays one invoke's overhead for all of them. An invoke that errors, times out or is
throttled is retried with backoff on the next function hosting its experts; when every attempt
fails, onnxruntime runs the experts in-process from the artifacts, so no request fails because
one function did. Experts the plan keeps on the backbone always run in-process.
"""

from __future__ import annotations

import heapq
import itertools
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from moeless.contracts.environment import ALIAS, IDLE_TIMEOUT_S
from moeless.contracts.manifest import Manifest
from moeless.contracts.payload import (
    decode_matrix,
    encode_bundle,
    encode_request,
    max_tokens_per_request,
    payload_json,
)
from moeless.contracts.plan import Placement, Plan
from moeless.experts.runtime import OnnxExpertPool
from moeless.planning.concurrency import LevelClock, LevelDemand
from moeless.planning.packing import Slice, bundle_slices
from moeless.serving.replanner import RollingLoads
from moeless.serving.stats import ServingStats


class InvokeFailure(Exception):
    """One invoke did not give a usable output (function error, throttle, timeout, bad reply)."""


def jsq_split(tokens: int, outstanding: list[int]) -> list[int]:
    """How many of ``tokens`` rows each replica gets: join the shortest queue, row by row.

    Each row goes to the replica with the least work (tokens in flight plus rows given so far),
    ties to the lowest index; the result levels the replicas' queues. ``[3, 0], 5 -> [1, 4]``.
    """
    heap = [(load, index) for index, load in enumerate(outstanding)]
    heapq.heapify(heap)
    shares = [0] * len(outstanding)
    for _ in range(tokens):
        load, index = heapq.heappop(heap)
        shares[index] += 1
        heapq.heappush(heap, (load + 1, index))
    return shares


class LambdaDispatcher:
    """An :class:`~moeless.experts.runtime.ExpertExecutor` whose experts are Lambda functions.

    Args:
        artifacts_dir: the package (its experts back the in-process fallback).
        manifest: the package's manifest.
        plan: which functions host which experts; its in-process experts (``Plan.in_process``) stay here.
        client: a boto3 ``lambda`` client (thread-safe; give it a connection pool >= ``max_concurrency``).
        qualifier: alias to invoke (carries provisioned concurrency); ``None`` for ``$LATEST``.
        attempts: invokes tried (on successive replicas) before the in-process fallback.
        backoff_s: wait before the 2nd attempt; doubles after each further one.
        stats: where invokes, retries, fallbacks, cold starts and dispatch latency are counted.
        fallback_source: ``s3://`` package to fetch a fallback expert from when it is not on disk.
        fallback_cache_bytes: most bytes of fallback experts kept open (LRU); the plan's
            in-process experts are kept regardless.
        device: the backbone's device; on ``cuda`` the plan's gpu-tier experts run there.
    """

    def __init__(
        self,
        artifacts_dir: Path,
        manifest: Manifest,
        plan: Plan,
        client: Any,
        qualifier: str | None = ALIAS,
        attempts: int = 3,
        backoff_s: float = 0.02,
        max_concurrency: int = 64,
        stats: ServingStats | None = None,
        fallback_source: str | None = None,
        fallback_cache_bytes: int | None = None,
        device: str = "cpu",
    ) -> None:
        self.client = client
        self.qualifier = qualifier
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.stats = stats or ServingStats()
        self.replicas = plan.invoke_targets()
        self.local = OnnxExpertPool(
            artifacts_dir,
            manifest,
            source=fallback_source,
            budget_bytes=fallback_cache_bytes,
            pinned=frozenset(plan.in_process()),
            on_gpu=frozenset(key for key, tier in plan.tiers().items() if tier == Placement.GPU),
            device=device,
        )
        self.offloads = plan.offloads()
        self.top_k = max(1, manifest.top_k)
        self.max_rows = max_tokens_per_request(manifest.hidden_size)
        self._in_flight: dict[str, int] = {}
        self.observed: RollingLoads | None = None  # set to record the tokens each expert receives
        self.last_used: dict[str, float] = {}  # function -> monotonic time of its last invoke
        # function -> set when its warm-up invoke finished: a call waits for the warming instance
        # rather than starting a second cold one beside it
        self.warming: dict[str, threading.Event] = {}
        self.hidden_size = manifest.hidden_size
        # what each function saw since the last take_demand(), by concurrency level: the forecasting
        # re-planner's input (the simulator counts it the same way)
        self._demand: dict[str, LevelDemand] = {}
        self._levels = LevelClock(IDLE_TIMEOUT_S)
        self._invokes_in_flight: dict[str, int] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="invoke")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def run(self, layer: int, inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        started = time.perf_counter()
        if self.observed is not None:
            self.observed.add(layer, {expert: len(rows) for expert, rows in inputs.items()})
        # expert -> (first row, job, index of the slice in the job's outputs)
        parts: dict[int, list[tuple[int, int, int]]] = {e: [] for e in inputs}
        jobs: list[tuple[Callable[..., list[np.ndarray]], tuple[Any, ...]]] = []
        slices: dict[str, list[Slice]] = {}  # function -> the expert slices it gets this layer
        # the layer's rows (the step's tokens: each picks top_k experts): a prefill chunk's step
        # sends the offloading resident experts' rows to their functions, a decode batch's does not
        layer_rows = sum(len(rows) for rows in inputs.values()) // self.top_k if self.offloads else 0
        for expert, rows in inputs.items():
            names = self.replicas.get((layer, expert), [])
            offload = self.offloads.get((layer, expert))
            if offload is not None:
                names = names if layer_rows >= offload else []
                if names:
                    self.stats.inc("offloads")
            if not names:  # in process (Plan.in_process): on the backbone, or hosted by no function
                parts[expert].append((0, len(jobs), 0))
                jobs.append((self._run_local, (layer, [(expert, rows)])))
                continue
            for name, start, end in self._assign(names, len(rows)):
                slices.setdefault(name, []).append((expert, start, end))
        for name, assigned in slices.items():
            for bundle in bundle_slices(assigned, self.max_rows):
                for index, (expert, start, _) in enumerate(bundle):
                    parts[expert].append((start, len(jobs), index))
                jobs.append((self._invoke_with_retries, (layer, bundle, inputs, name)))
        if len(jobs) == 1:  # a layer whose experts share one function: no hand-off to a thread
            results = [jobs[0][0](*jobs[0][1])]
        else:
            futures = [self._pool.submit(job, *args) for job, args in jobs]
            results = [future.result() for future in futures]
        outputs = {
            expert: np.concatenate([results[job][index] for _, job, index in sorted(pieces)])
            for expert, pieces in parts.items()
        }
        self.stats.observe_dispatch(layer, time.perf_counter() - started)
        return outputs

    def _assign(self, names: list[str], rows: int) -> list[tuple[str, int, int]]:
        """Split ``rows`` over the replicas (JSQ), each share cut to fit Lambda's payload limit.

        Returns (function, start, end) slices and counts them as in flight until invoked.
        """
        with self._lock:
            shares = jsq_split(rows, [self._in_flight.get(name, 0) for name in names])
            slices, start = [], 0
            for name, share in zip(names, shares, strict=True):
                self._in_flight[name] = self._in_flight.get(name, 0) + share
                for offset in range(0, share, self.max_rows):
                    end = start + min(self.max_rows, share - offset)
                    slices.append((name, start, end))
                    start = end
            return slices

    def take_demand(self) -> tuple[dict[str, LevelDemand], dict[str, int]]:
        """The demand by level since the last call (and forget it), and each function's
        environments in use now: invokes in flight, or levels used within the idle timeout."""
        now = time.monotonic()
        with self._lock:
            demand, self._demand = self._demand, {}
            in_use = self._levels.all_in_use(now)
            for name, n in self._invokes_in_flight.items():
                in_use[name] = max(in_use.get(name, 0), n)
            return demand, {name: n for name, n in in_use.items() if n}

    def warm(self, function: str, layer: int, expert: int) -> None:
        """A warm-up invoke (one zero row), off the request path; counted apart from serving invokes."""
        from botocore.exceptions import BotoCoreError, ClientError

        payload = payload_json(encode_request(layer, expert, np.zeros((1, self.hidden_size), np.float32)))
        kwargs = {"Qualifier": self.qualifier} if self.qualifier else {}
        self.stats.inc("prewarm_invokes")
        try:
            body = json.loads(
                self.client.invoke(FunctionName=function, Payload=payload, **kwargs)["Payload"].read()
            )
        except (ClientError, BotoCoreError, OSError, ValueError):
            self.stats.inc("prewarm_failures")
            return
        self.last_used[function] = time.monotonic()
        if isinstance(body, dict) and body.get("init_ms", 0) > 0:
            self.stats.inc("prewarm_cold_starts")

    def _run_local(self, layer: int, inputs: list[tuple[int, np.ndarray]]) -> list[np.ndarray]:
        outputs = self.local.run(layer, dict(inputs))
        return [outputs[expert] for expert, _ in inputs]

    def _invoke_with_retries(
        self, layer: int, bundle: list[Slice], inputs: dict[int, np.ndarray], first: str
    ) -> list[np.ndarray]:
        """One bundle's outputs, in its order: invoked on ``first``, retried on the next function
        hosting all of its experts, else run in-process."""
        rows = [(expert, inputs[expert][start:end]) for expert, start, end in bundle]
        hosting = [set(self.replicas[(layer, expert)]) for expert, _, _ in bundle]
        hosts = [
            name
            for name in dict.fromkeys(self.replicas[(layer, bundle[0][0])])
            if all(name in h for h in hosting)
        ]
        order = hosts[hosts.index(first) :] + hosts[: hosts.index(first)]
        try:
            for attempt in range(self.attempts):
                if attempt:
                    self.stats.inc("retries")
                    time.sleep(self.backoff_s * 2 ** (attempt - 1))
                try:
                    return self._invoke(order[attempt % len(order)], layer, rows)
                except InvokeFailure:
                    self.stats.inc("invoke_failures")
        finally:
            with self._lock:
                self._in_flight[first] -= sum(end - start for _, start, end in bundle)
        self.stats.inc("fallbacks")
        return self._run_local(layer, rows)

    def _invoke(self, function: str, layer: int, rows: list[tuple[int, np.ndarray]]) -> list[np.ndarray]:
        from botocore.exceptions import BotoCoreError, ClientError

        payload = payload_json(encode_bundle(layer, rows))
        kwargs = {"Qualifier": self.qualifier} if self.qualifier else {}
        warming = self.warming.get(function)
        if warming is not None and not warming.is_set():
            self.stats.inc("waited_for_warmup")
            warming.wait(timeout=30)
        self.stats.inc("invokes")
        started = self.last_used[function] = time.monotonic()
        with self._lock:
            level = self._invokes_in_flight[function] = self._invokes_in_flight.get(function, 0) + 1
            idle = self._levels.touch(function, level, started)
        try:
            response = self.client.invoke(FunctionName=function, Payload=payload, **kwargs)
            body = json.loads(response["Payload"].read())
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            self.stats.inc("throttles" if code == "TooManyRequestsException" else "invoke_errors")
            raise InvokeFailure(f"{function}: {code}") from exc
        except (BotoCoreError, OSError, ValueError) as exc:
            self.stats.inc("invoke_errors")
            raise InvokeFailure(f"{function}: {exc}") from exc
        finally:
            with self._lock:
                self._invokes_in_flight[function] -= 1
                demand = self._demand.setdefault(function, LevelDemand())
                demand.add(level, time.monotonic() - started, idle)
        if response.get("FunctionError") or not isinstance(body, dict) or "error" in body:
            self.stats.inc("invoke_errors")
            raise InvokeFailure(f"{function}: {str(body)[:200]}")
        if body.get("init_ms", 0) > 0:
            self.stats.inc("cold_starts")
        try:
            output = decode_matrix(body)
        except ValueError as exc:
            self.stats.inc("invoke_errors")
            raise InvokeFailure(f"{function}: bad reply: {exc}") from exc
        expected = (sum(len(part) for _, part in rows), self.hidden_size)
        if output.shape != expected:
            self.stats.inc("invoke_errors")
            raise InvokeFailure(f"{function}: reply shape {output.shape} != {expected}")
        bounds = np.cumsum([0, *(len(part) for _, part in rows)])
        return [output[start:end] for start, end in itertools.pairwise(bounds)]
