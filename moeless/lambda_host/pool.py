"""One function's instances, scheduled with Lambda's rules.

An invocation takes an idle instance (the qualifier's provisioned ones first, then on-demand ones);
when none is idle it starts a new instance and waits for its init (a cold start); it never queues
behind a busy instance. Reserved concurrency caps the invocations in flight (429 beyond it, checked
before any instance is picked, so reserved concurrency 0 throttles even a warm function); the
host caps the instances alive on the machine (the account concurrency limit, locally).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from moeless.lambda_host.instance import FunctionConfig, Instance, Invocation, error_body
from moeless.lambda_host.meter import BillingMeter

# How long an on-demand cold start may take before the invocation fails (AWS allows 10 s of init;
# a laptop importing onnxruntime next to other work needs more slack).
INIT_TIMEOUT_S = 60.0
LOG_TAIL_BYTES = 4096


class FunctionNotFound(KeyError):
    """No function of that name on this host."""


class Throttled(Exception):
    """429 TooManyRequestsException, with Lambda's reason code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class InvokeResult:
    body: bytes
    function_error: str | None
    log_tail: str
    duration_ms: float
    billed_ms: int
    init_ms: float


@dataclass
class ProvisionedConfig:
    requested: int
    last_modified: str
    failure: str | None = None


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "+0000"


class FunctionPool:
    """Instances of one function.

    Args:
        config: the function.
        lock: the host's scheduling lock (one for all functions, so the host can evict across them).
        meter: where billing goes.
        log_dir: the function's log streams live in ``log_dir / name``.
        make_room: asks the host for room for one more instance; ``False`` when the machine is full.
    """

    def __init__(
        self,
        config: FunctionConfig,
        lock: threading.RLock,
        meter: BillingMeter,
        log_dir: Path,
        make_room: Callable[[], bool],
    ) -> None:
        self.config = config
        self.instances: list[Instance] = []
        self.provisioned: dict[str, ProvisionedConfig] = {}
        self.stopping = False
        self._lock = lock
        self._meter = meter
        self._log_dir = log_dir / config.name
        self._make_room = make_room
        meter.register(config.name, config.memory_mb)

    # --- invocations --------------------------------------------------------------------------

    def invoke(self, payload: bytes, qualifier: str, log_tail: bool = False) -> InvokeResult:
        """Run one synchronous invocation. Raises :class:`Throttled` when over a concurrency limit.

        With ``log_tail`` the result carries the invocation's log lines (``LogType=Tail``).
        """
        invocation = Invocation(payload, qualifier)
        instance, cold = self._start(invocation)
        request = f"RequestId: {invocation.request_id} Error:"
        if not invocation.delivered.wait(INIT_TIMEOUT_S if cold else self.config.timeout_s):
            instance.kill(
                error_body("Sandbox.Timedout", f"{request} init did not finish in {INIT_TIMEOUT_S:.0f} s")
            )
        elif not invocation.done.wait(self.config.timeout_s - (time.perf_counter() - invocation.handed_at)):
            seconds = f"{self.config.timeout_s:.2f}"
            instance.kill(error_body("Sandbox.Timedout", f"{request} Task timed out after {seconds} seconds"))
        invocation.done.wait()
        return self._settle(instance, invocation, log_tail)

    def _start(self, invocation: Invocation) -> tuple[Instance, bool]:
        """Give ``invocation`` an instance: an idle one, else a new one (cold). Returns (instance, cold)."""
        with self._lock:
            if self.stopping:
                raise Throttled("ServiceUnavailable", "the local host is shutting down")
            # reserved concurrency caps invocations in flight, warm instance or not (0 stops all)
            reserved = self.config.reserved_concurrency
            if reserved is not None and self.in_flight() >= reserved:
                self._meter.throttle(self.config.name)
                raise Throttled(
                    "ReservedFunctionConcurrentInvocationLimitExceeded",
                    f"Rate Exceeded: {self.config.name} has reserved concurrency {reserved}",
                )
            candidates = [i for i in self.instances if i.qualifier == invocation.qualifier]
            candidates += [i for i in self.instances if i.qualifier is None]
            for instance in candidates:
                if instance.try_reserve() and instance.assign(invocation):
                    return instance, False
            if not self._make_room():
                self._meter.throttle(self.config.name)
                raise Throttled(
                    "ConcurrentInvocationLimitExceeded",
                    "Rate Exceeded: the host's concurrency limit is reached",
                )
            instance = self._spawn(None)
            instance.assign(invocation)
            return instance, True

    def _settle(self, instance: Instance, invocation: Invocation, log_tail: bool) -> InvokeResult:
        report = (
            f"END RequestId: {invocation.request_id}\n"
            f"REPORT RequestId: {invocation.request_id}\tDuration: {invocation.duration_ms:.2f} ms\t"
        )
        billed = self._meter.invoke(
            self.config.name,
            invocation.duration_ms,
            invocation.init_ms,
            invocation.provisioned,
            error=invocation.function_error is not None,
        )
        report += f"Billed Duration: {billed} ms\tMemory Size: {self.config.memory_mb} MB"
        report += f"\tInit Duration: {invocation.init_ms:.2f} ms\n" if invocation.init_ms else "\n"
        instance.write_log(report)
        if instance.retire_when_idle:
            self._retire(instance)
        return InvokeResult(
            invocation.body,
            invocation.function_error,
            self._log_tail(instance, invocation.log_offset) if log_tail else "",
            invocation.duration_ms,
            billed,
            invocation.init_ms,
        )

    @staticmethod
    def _log_tail(instance: Instance, offset: int) -> str:
        try:
            with open(instance.log_path, "rb") as log:
                log.seek(offset)
                return log.read()[-LOG_TAIL_BYTES:].decode("utf-8", "replace")
        except OSError:
            return ""

    def in_flight(self) -> int:
        return sum(i.state in ("busy", "initializing-busy") for i in self.instances)

    # --- instances ----------------------------------------------------------------------------

    def _spawn(self, qualifier: str | None) -> Instance:
        number = sum(1 for _ in self._log_dir.glob("*.log")) if self._log_dir.exists() else 0
        log_path = self._log_dir / f"{time.strftime('%Y-%m-%d')}-{number:04d}.log"
        instance = Instance(self.config, qualifier, log_path, self._ready, self._exited)
        self.instances.append(instance)
        return instance

    def _ready(self, instance: Instance) -> None:
        if instance.provisioned:
            self._meter.provisioned_init(self.config.name)
        if instance.retire_when_idle:
            with self._lock:
                self._retire(instance)

    def _exited(self, instance: Instance) -> None:
        with self._lock:
            if instance in self.instances:
                self.instances.remove(instance)
            qualifier = instance.qualifier
            config = self.provisioned.get(qualifier) if qualifier else None
            if config is None or self.stopping or instance.retire_when_idle:
                return
            if instance.init_error is not None:
                config.failure = instance.init_error.decode("utf-8", "replace")
                return
            if qualifier is not None and self._count(qualifier) < config.requested:
                self._spawn(qualifier)  # keep the provisioned count: replace the lost instance

    def _retire(self, instance: Instance) -> None:
        instance.retire_when_idle = True
        if instance.try_reserve() or instance.state == "dead":
            threading.Thread(target=instance.stop, daemon=True).start()

    def evict(self, instance: Instance) -> None:
        """Stop an idle instance now to make room for another function's (the host decides)."""
        with self._lock:
            self._retire(instance)
            if instance in self.instances:
                self.instances.remove(instance)

    def _count(self, qualifier: str) -> int:
        return sum(1 for i in self.instances if i.qualifier == qualifier and not i.retire_when_idle)

    def idle_on_demand(self) -> list[Instance]:
        return [i for i in self.instances if i.qualifier is None and i.state == "idle"]

    def reap_idle(self, idle_timeout_s: float) -> int:
        """Stop on-demand instances idle for longer than ``idle_timeout_s``; returns how many."""
        cutoff = time.monotonic() - idle_timeout_s
        with self._lock:
            stale = [i for i in self.idle_on_demand() if i.last_used < cutoff]
            for instance in stale:
                self._retire(instance)
        return len(stale)

    # --- provisioned and reserved concurrency ------------------------------------------------

    def set_provisioned(self, qualifier: str, count: int) -> dict[str, Any]:
        """Start (or retire) instances until ``count`` are provisioned for ``qualifier``."""
        with self._lock:
            reserved = self.config.reserved_concurrency
            if reserved is not None and count > reserved:
                raise ValueError(f"provisioned concurrency {count} exceeds reserved concurrency {reserved}")
            self.provisioned[qualifier] = ProvisionedConfig(count, _now_iso())
            self._meter.set_provisioned(self.config.name, qualifier, count)
            current = [i for i in self.instances if i.qualifier == qualifier and not i.retire_when_idle]
            for instance in current[count:]:
                self._retire(instance)
            for _ in range(count - len(current)):
                if not self._make_room():
                    self.provisioned[qualifier].failure = "the host's concurrency limit is reached"
                    break
                self._spawn(qualifier)
            return self.provisioned_status(qualifier)

    def provisioned_status(self, qualifier: str) -> dict[str, Any]:
        """``GetProvisionedConcurrencyConfig``'s answer. Raises ``KeyError`` when none is set."""
        with self._lock:
            config = self.provisioned[qualifier]
            live = [i for i in self.instances if i.qualifier == qualifier and not i.retire_when_idle]
            ready = sum(i.state in ("idle", "busy") for i in live)
            available = sum(i.state == "idle" for i in live)
            status = "FAILED" if config.failure else ("READY" if ready >= config.requested else "IN_PROGRESS")
            answer: dict[str, Any] = {
                "RequestedProvisionedConcurrentExecutions": config.requested,
                "AvailableProvisionedConcurrentExecutions": available,
                "AllocatedProvisionedConcurrentExecutions": min(ready, config.requested),
                "Status": status,
                "LastModified": config.last_modified,
            }
            if config.failure:
                answer["StatusReason"] = config.failure
            return answer

    def delete_provisioned(self, qualifier: str) -> None:
        """Remove the qualifier's provisioned concurrency. Raises ``KeyError`` when none is set."""
        with self._lock:
            del self.provisioned[qualifier]
            self._meter.set_provisioned(self.config.name, qualifier, 0)
            for instance in [i for i in self.instances if i.qualifier == qualifier]:
                self._retire(instance)

    def set_reserved(self, count: int | None) -> None:
        with self._lock:
            provisioned = sum(c.requested for c in self.provisioned.values())
            if count is not None and count < provisioned:
                raise ValueError(
                    f"reserved concurrency {count} is below provisioned concurrency {provisioned}"
                )
            self.config.reserved_concurrency = count

    def stop(self) -> None:
        with self._lock:
            self.stopping = True
            instances = list(self.instances)
            for qualifier in self.provisioned:
                self._meter.set_provisioned(self.config.name, qualifier, 0)
        for instance in instances:
            instance.stop()

    def describe(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                {
                    "id": i.id,
                    "pid": i.process.pid,
                    "state": i.state,
                    "qualifier": i.qualifier,
                    "init_ms": round(i.init_ms, 3),
                    "runtime_api": i.runtime_api,
                    "log": str(i.log_path),
                }
                for i in self.instances
            ]
