"""The local Lambda host: functions, their instances, the meter, and the API callers use.

Use as a context manager::

    with LambdaHost(configs) as host:
        boto3.client("lambda", endpoint_url=host.endpoint_url, ...).invoke(FunctionName=..., Payload=...)
    print(host.meter.snapshot())
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from moeless.aws_limits import DEFAULT_LIMITS, LambdaLimits
from moeless.contracts.environment import ALIAS, IDLE_TIMEOUT_S
from moeless.lambda_host import account
from moeless.lambda_host.instance import FunctionConfig
from moeless.lambda_host.meter import BillingMeter
from moeless.lambda_host.pool import FunctionNotFound, FunctionPool
from moeless.lambda_host.shapes import account_settings
from moeless.lambda_host.versions import Qualifiers

# The processes one machine runs at once; far fewer than the account's concurrency on Lambda.
DEFAULT_MAX_INSTANCES = 64


class LambdaHost:
    """Hosts Lambda functions as local ``awslambdaric`` processes behind the Lambda HTTP APIs.

    Args:
        functions: the functions to host.
        port: port of the Invoke/control API on 127.0.0.1 (0: a free one).
        max_instances: instances alive at once on this machine, all functions together; beyond it an
            idle on-demand instance is evicted or the call is throttled (the machine's own limit,
            below the account's concurrency).
        idle_timeout_s: on-demand instances idle this long are stopped.
        log_dir: where each instance's log stream goes (a temporary folder by default).
        limits: the account's concurrency and the init limits (AWS's defaults).
        alias: the alias every function has on its published version.
    """

    def __init__(
        self,
        functions: list[FunctionConfig],
        port: int = 0,
        max_instances: int = DEFAULT_MAX_INSTANCES,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        log_dir: Path | None = None,
        limits: LambdaLimits = DEFAULT_LIMITS,
        alias: str = ALIAS,
    ) -> None:
        names = [f.name for f in functions]
        if len(set(names)) != len(names):
            raise ValueError("function names must be unique")
        left = account.unreserved(
            limits, [account.FunctionUsage(f.reserved_concurrency, 0, 0) for f in functions]
        )
        if left < limits.min_unreserved_concurrency:
            raise ValueError(
                f"the functions' reservations leave {left} of the account's {limits.account_concurrency} "
                f"concurrency unreserved, below the minimum of {limits.min_unreserved_concurrency}"
            )
        self.lock = threading.RLock()
        self.meter = BillingMeter()
        self.max_instances = max_instances
        self.idle_timeout_s = idle_timeout_s
        self.limits = limits
        self.qualifiers = Qualifiers(alias)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="moeless-lambda-logs-")
            log_dir = Path(self._tmp.name)
        self.log_dir = log_dir
        self.pools = {f.name: FunctionPool(f, self) for f in functions}
        usage = [pool.usage() for pool in self.pools.values()]
        # on-demand invocations in flight never outnumber the instances alive, so while the unreserved
        # pool leaves more than that (an estimate kept low: refreshed whenever a setting lowers it),
        # an invocation needs no count of the pool
        self._headroom = account.on_demand_headroom(limits, usage)
        self._alive = 0
        self._port = port
        self._server: Any = None
        self._stopped = threading.Event()

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> LambdaHost:
        from moeless.lambda_host.invoke_api import serve

        self._server = serve(self, self._port)
        threading.Thread(target=self._reap_forever, name="reaper", daemon=True).start()
        return self

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        """Stop taking calls, then stop every instance (in parallel)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        threads = [threading.Thread(target=pool.stop) for pool in self.pools.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> LambdaHost:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    def _reap_forever(self) -> None:
        interval = max(0.05, min(1.0, self.idle_timeout_s / 4))
        while not self._stopped.wait(interval):
            for pool in self.pools.values():
                pool.reap_idle(self.idle_timeout_s)

    # --- scheduling ----------------------------------------------------------------------------

    def pool(self, name: str) -> FunctionPool:
        """The function called ``name`` (a plain name, ``name:qualifier``, or an ARN)."""
        name = name.rsplit(":function:", 1)[-1].split(":", 1)[0]
        try:
            return self.pools[name]
        except KeyError:
            raise FunctionNotFound(name) from None

    def instance_count(self) -> int:
        with self.lock:
            return sum(len(pool.instances) for pool in self.pools.values())

    def make_room(self) -> bool:
        """Room for one more instance: evict the least recently used idle on-demand one if needed."""
        with self.lock:
            if self.instance_count() < self.max_instances:
                return True
            idle = [
                i for pool in self.pools.values() for i in pool.idle_on_demand() if not i.retire_when_idle
            ]
            if not idle:
                return False
            victim = min(idle, key=lambda i: i.last_used)
            self.pools[victim.config.name].evict(victim)
            return True

    def count_instances(self, change: int) -> None:
        """An instance was spawned (+1) or has exited (-1)."""
        with self.lock:
            self._alive += change

    def unreserved_pool_has_room(self) -> bool:
        """Room in the account's unreserved pool for one more on-demand invocation."""
        with self.lock:
            if self._headroom > self._alive:
                return True
            usage = [p.usage() for p in self.pools.values()]
            self._headroom = account.on_demand_headroom(self.limits, usage)
            return account.unreserved_pool_has_room(self.limits, usage)

    # --- the account's concurrency ---------------------------------------------------------------

    def set_reserved(self, name: str, count: int | None) -> None:
        """``PutFunctionConcurrency`` (``None``: ``DeleteFunctionConcurrency``).

        Raises:
            ConcurrencyRefused: it would leave less than the minimum unreserved.
            ValueError: ``count`` is below the function's provisioned concurrency.
        """
        with self.lock:
            pool = self.pool(name)
            if count is not None:
                others = [p.usage() for p in self.pools.values() if p is not pool]
                account.check_reservation(self.limits, others, count)
            pool.set_reserved(count)
            self._headroom = account.on_demand_headroom(self.limits, [p.usage() for p in self.pools.values()])

    def set_provisioned(self, name: str, qualifier: str, count: int) -> dict[str, Any]:
        """``PutProvisionedConcurrencyConfig`` on an alias or the published version.

        Raises:
            QualifierNotFound: no such version or alias.
            ConcurrencyRefused: more than the function's reservation, or than the unreserved pool
                allows.
            ValueError: the version already has a configuration through the other qualifier.
        """
        with self.lock:
            pool = self.pool(name)
            self.qualifiers.version_of(pool.config.name, qualifier)
            pool.check_version_unclaimed(qualifier)
            others = [p.usage() for p in self.pools.values() if p is not pool]
            account.check_provisioning(self.limits, pool.usage(excluding=qualifier), others, count)
            status = pool.set_provisioned(qualifier, count)
            self._headroom = account.on_demand_headroom(self.limits, [*others, pool.usage()])
            return status

    def account_settings(self) -> dict[str, Any]:
        """``GetAccountSettings``' answer."""
        with self.lock:
            usage = [p.usage() for p in self.pools.values()]
            unreserved = account.unreserved(self.limits, usage)
            return account_settings(self.limits.account_concurrency, unreserved, len(self.pools))

    def wait_provisioned(self, timeout_s: float) -> dict[str, str]:
        """Wait until no provisioned configuration is IN_PROGRESS (or ``timeout_s`` passed); returns
        those not READY (``name:qualifier``), each with what went wrong or its status."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                configs = {
                    f"{name}:{qualifier}": (pool.provisioned_status(qualifier)["Status"], config)
                    for name, pool in self.pools.items()
                    for qualifier, config in pool.provisioned.items()
                }
            waiting = any(status == "IN_PROGRESS" for status, _ in configs.values())
            if not waiting or time.monotonic() > deadline:
                return {
                    key: config.failure_detail or status
                    for key, (status, config) in configs.items()
                    if status != "READY"
                }
            time.sleep(0.05)

    def describe(self) -> dict[str, Any]:
        """Functions, their instances and provisioned configurations, as JSON-able data."""
        return {
            name: {
                "memory_mb": pool.config.memory_mb,
                "reserved_concurrency": pool.config.reserved_concurrency,
                "provisioned": {q: pool.provisioned_status(q) for q in list(pool.provisioned)},
                "instances": pool.describe(),
            }
            for name, pool in self.pools.items()
        }
