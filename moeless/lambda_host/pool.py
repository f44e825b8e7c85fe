"""One function's instances, scheduled with Lambda's rules.

An invocation takes an idle instance (provisioned ones first, when it runs the published version,
then on-demand ones); when none is idle it starts a new instance and waits for its init (a cold
start); it never queues behind a busy instance. Concurrency is checked before an on-demand instance
is picked (:mod:`moeless.lambda_host.account`): within the function's reservation, which its
provisioned concurrency is held out of (so a reservation of 0 throttles even a warm function), or,
without one, within the account's unreserved pool; the host also caps the instances alive on the
machine.

Init is limited as on Lambda (:class:`~moeless.aws_limits.LambdaLimits`): an on-demand init
that overruns its limit is abandoned and retried as part of the invocation, under the function's
timeout, which then covers the retried init and the handler; a provisioned instance whose init
overruns or fails fails its configuration, which is then not billed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, Protocol

from moeless.aws_limits import LambdaLimits
from moeless.lambda_host.account import FunctionUsage, reserved_pool_has_room
from moeless.lambda_host.instance import FunctionConfig, Instance, Invocation, error_body
from moeless.lambda_host.meter import BillingMeter
from moeless.lambda_host.versions import LATEST, Qualifiers

LOG_TAIL_BYTES = 4096
# what a provisioned configuration's StatusReason says when its environments' init fails
INIT_FAILURE = "FUNCTION_ERROR_INIT_FAILURE"
BUSY = ("busy", "initializing-busy")


class FunctionNotFound(KeyError):
    """No function of that name on this host."""


class Throttled(Exception):
    """429 TooManyRequestsException, with Lambda's reason code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class PoolHost(Protocol):
    """What a pool needs of its host (a :class:`~moeless.lambda_host.host.LambdaHost`): the
    scheduling lock (one for all functions, so the host can act across them), the meter, where logs
    go, the limits and qualifiers, and room on the machine and in the account's unreserved pool
    (both asked under the lock)."""

    @property
    def lock(self) -> threading.RLock: ...

    @property
    def meter(self) -> BillingMeter: ...

    @property
    def log_dir(self) -> Path: ...

    @property
    def limits(self) -> LambdaLimits: ...

    @property
    def qualifiers(self) -> Qualifiers: ...

    def make_room(self) -> bool: ...

    def unreserved_pool_has_room(self) -> bool: ...

    def count_instances(self, change: int) -> None: ...


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
    """One qualifier's provisioned concurrency; ``failure`` is its StatusReason once FAILED, and
    ``failure_detail`` what went wrong, for the host's own messages."""

    requested: int
    last_modified: str
    failure: str | None = None
    failure_detail: str = ""


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "+0000"


def _init_timeout_line(instance: Instance) -> str:
    """Lambda's log line for an init that overran its limit."""
    init_ms = (time.perf_counter() - instance.spawned_at) * 1e3
    return f"INIT_REPORT Init Duration: {init_ms:.2f} ms\tPhase: init\tStatus: timeout\n"


class FunctionPool:
    """Instances of one function.

    Args:
        config: the function.
        host: its host (lock, meter, log folder, limits, qualifiers, room); the function's log
            streams live in ``host.log_dir / name``.
    """

    def __init__(self, config: FunctionConfig, host: PoolHost) -> None:
        self.config = config
        self.instances: list[Instance] = []
        self.provisioned: dict[str, ProvisionedConfig] = {}
        self.stopping = False
        self._host = host
        self._lock = host.lock
        self._meter = host.meter
        self._log_dir = host.log_dir / config.name
        host.meter.register(config.name, config.memory_mb)

    # --- invocations --------------------------------------------------------------------------

    def invoke(self, payload: bytes, qualifier: str, log_tail: bool = False) -> InvokeResult:
        """Run one synchronous invocation of ``qualifier``.

        With ``log_tail`` the result carries the invocation's log lines (``LogType=Tail``).

        Raises:
            QualifierNotFound: the function has no such version or alias.
            Throttled: over a concurrency limit.
        """
        version = self._host.qualifiers.version_of(self.config.name, qualifier)
        invocation = Invocation(payload, qualifier, version)
        instance, cold = self._start(invocation)
        if cold and not invocation.delivered.wait(self._host.limits.on_demand_init_s):
            retried = self._retry_init(instance, invocation)
            if retried is not None:
                instance, abandoned_init_ms = retried
                retried_at = time.perf_counter()
                self._await(instance, invocation, retried_at + self.config.timeout_s)
                # Lambda reports a retried init inside the invocation's Duration; the abandoned one
                # is billed as the cold start's init, as any on-demand init is here
                invocation.duration_ms = (time.perf_counter() - retried_at) * 1e3
                invocation.init_ms = abandoned_init_ms
                return self._settle(instance, invocation, log_tail)
        self._await(instance, invocation)
        return self._settle(instance, invocation, log_tail)

    def _await(self, instance: Instance, invocation: Invocation, deadline: float | None = None) -> None:
        """Wait for ``invocation`` to finish; past the function's timeout (from the hand-over to the
        runtime, or ``deadline`` when a retried init runs in it) the instance is killed."""
        timeout_s, request = self.config.timeout_s, invocation.request_id
        finished = invocation.delivered.wait(
            timeout_s if deadline is None else max(0.0, deadline - time.perf_counter())
        )
        if finished:
            end = invocation.handed_at + timeout_s if deadline is None else deadline
            finished = invocation.done.wait(max(0.0, end - time.perf_counter()))
        if not finished:
            message = f"RequestId: {request} Error: Task timed out after {timeout_s:.2f} seconds"
            instance.kill(error_body("Sandbox.Timedout", message))
        invocation.done.wait()

    def _retry_init(self, instance: Instance, invocation: Invocation) -> tuple[Instance, float] | None:
        """Abandon ``instance``'s overrun init and start the invocation's own instance (Lambda
        retries Init as part of the first invocation). Returns the new instance and the abandoned
        init's milliseconds; ``None`` when the runtime took the invocation meanwhile, or the host
        is stopping."""
        with self._lock:
            if self.stopping or not instance.release(invocation):
                return None
            abandoned_init_ms = (time.perf_counter() - instance.spawned_at) * 1e3
            instance.write_log(_init_timeout_line(instance))
            self.instances.remove(instance)  # its place on the machine goes to the retry
            retry = self._spawn(None)
            retry.assign(invocation)
        instance.kill()
        return retry, abandoned_init_ms

    def _start(self, invocation: Invocation) -> tuple[Instance, bool]:
        """Give ``invocation`` an instance: an idle one, else a new one (cold). Returns (instance, cold)."""
        with self._lock:
            if self.stopping:
                raise Throttled("ServiceUnavailable", "the local host is shutting down")
            if invocation.version != LATEST:
                for instance in self.instances:
                    if instance.provisioned and self._take(instance, invocation):
                        return instance, False
            self._admit_on_demand()
            for instance in self.instances:
                if not instance.provisioned and self._take(instance, invocation):
                    return instance, False
            if not self._host.make_room():
                self._throttle("ConcurrentInvocationLimitExceeded", "the host's instance limit is reached")
            instance = self._spawn(None)
            instance.assign(invocation)
            return instance, True

    @staticmethod
    def _take(instance: Instance, invocation: Invocation) -> bool:
        return not instance.retire_when_idle and instance.try_reserve() and instance.assign(invocation)

    def _admit_on_demand(self) -> None:
        """Raise :class:`Throttled` unless one more on-demand invocation fits the function's
        reservation or, without one, the account's unreserved pool."""
        reserved = self.config.reserved_concurrency
        if reserved is not None:
            if not reserved_pool_has_room(self.usage()):
                self._throttle(
                    "ReservedFunctionConcurrentInvocationLimitExceeded",
                    f"{self.config.name} has reserved concurrency {reserved}",
                )
        elif not self._host.unreserved_pool_has_room():
            limit = self._host.limits.account_concurrency
            why = f"the account's concurrency limit ({limit}) is reached"
            self._throttle("ConcurrentInvocationLimitExceeded", why)

    def _throttle(self, reason: str, why: str) -> NoReturn:
        self._meter.throttle(self.config.name)
        raise Throttled(reason, f"Rate Exceeded: {why}")

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
        return sum(i.state in BUSY for i in self.instances)

    def usage(self, excluding: str | None = None) -> FunctionUsage:
        """The function's claim on the account's concurrency (``excluding`` one qualifier's
        provisioned configuration, the one about to be set)."""
        with self._lock:
            provisioned = sum(
                c.requested for q, c in self.provisioned.items() if q != excluding and c.failure is None
            )
            on_demand = sum(i.state in BUSY for i in self.instances if not i.provisioned)
            return FunctionUsage(self.config.reserved_concurrency, provisioned, on_demand)

    # --- instances ----------------------------------------------------------------------------

    def _spawn(self, qualifier: str | None) -> Instance:
        number = sum(1 for _ in self._log_dir.glob("*.log")) if self._log_dir.exists() else 0
        log_path = self._log_dir / f"{time.strftime('%Y-%m-%d')}-{number:04d}.log"
        instance = Instance(self.config, qualifier, log_path, self._ready, self._exited)
        self.instances.append(instance)
        self._host.count_instances(+1)
        if qualifier is not None:
            limit_s = self._host.limits.provisioned_init_limit_s(self.config.timeout_s)
            timer = threading.Timer(limit_s, self._init_overran, (instance, limit_s))
            timer.daemon = True
            timer.start()
        return instance

    def _init_overran(self, instance: Instance, limit_s: float) -> None:
        """A provisioned instance still initialising at its limit fails its configuration."""
        with self._lock:
            if instance.state != "initializing" or instance.qualifier is None:
                return
            instance.write_log(_init_timeout_line(instance))
            self._fail_provisioned(instance.qualifier, f"init did not finish in {limit_s:g} s")

    def _ready(self, instance: Instance) -> None:
        if instance.provisioned:
            self._meter.provisioned_init(self.config.name)
        if instance.retire_when_idle:
            with self._lock:
                self._retire(instance)

    def _exited(self, instance: Instance) -> None:
        with self._lock:
            self._host.count_instances(-1)
            if instance in self.instances:
                self.instances.remove(instance)
            qualifier = instance.qualifier
            if qualifier is None or self.stopping or instance.retire_when_idle:
                return
            config = self.provisioned.get(qualifier)
            if config is None:
                return
            if instance.init_error is not None:
                self._fail_provisioned(qualifier, instance.init_error.decode("utf-8", "replace"))
            elif self._count(qualifier) < config.requested:
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

    def check_version_unclaimed(self, qualifier: str) -> None:
        """Raise ``ValueError`` when the version ``qualifier`` runs has a provisioned configuration
        through another qualifier (a version has one, on itself or on an alias pointing at it)."""
        with self._lock:
            if any(q != qualifier for q in self.provisioned):
                raise ValueError(
                    "Alias can't be used for Provisioned Concurrency configuration on an already "
                    "Provisioned version"
                    if qualifier == self._host.qualifiers.alias
                    else "Version is pointed by a Provisioned Concurrency alias"
                )

    def set_provisioned(self, qualifier: str, count: int) -> dict[str, Any]:
        """Start (or retire) instances until ``count`` are provisioned for ``qualifier``, an alias
        or the published version (Lambda's rules are the host's to check first)."""
        with self._lock:
            self.provisioned[qualifier] = ProvisionedConfig(count, _now_iso())
            self._meter.set_provisioned(self.config.name, qualifier, count)
            current = [i for i in self.instances if i.qualifier == qualifier and not i.retire_when_idle]
            for instance in current[count:]:
                self._retire(instance)
            for _ in range(count - len(current)):
                if not self._host.make_room():
                    self._fail_provisioned(qualifier, "the host's instance limit is reached")
                    break
                self._spawn(qualifier)
            return self.provisioned_status(qualifier)

    def _fail_provisioned(self, qualifier: str, detail: str) -> None:
        """Mark the configuration FAILED: its period is not billed and its instances are let go."""
        config = self.provisioned.get(qualifier)
        if config is None or config.failure is not None:
            return
        config.failure, config.failure_detail = INIT_FAILURE, detail
        self._meter.discard_provisioned(self.config.name, qualifier)
        for instance in [i for i in self.instances if i.qualifier == qualifier]:
            self._retire(instance)
            if instance.state == "initializing":
                instance.kill()

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
        """Set (``None``: remove) the reservation; the account's rules are the host's to check.

        Raises:
            ValueError: ``count`` is below the provisioned concurrency already configured.
        """
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
