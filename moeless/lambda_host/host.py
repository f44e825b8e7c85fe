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

from moeless.contracts.environment import IDLE_TIMEOUT_S
from moeless.lambda_host.instance import FunctionConfig
from moeless.lambda_host.meter import BillingMeter
from moeless.lambda_host.pool import FunctionNotFound, FunctionPool

# Lambda's default account limit is 1,000 concurrent executions; one machine runs far fewer processes.
DEFAULT_MAX_INSTANCES = 64


class LambdaHost:
    """Hosts Lambda functions as local ``awslambdaric`` processes behind the Lambda HTTP APIs.

    Args:
        functions: the functions to host.
        port: port of the Invoke/control API on 127.0.0.1 (0: a free one).
        max_instances: instances alive at once on this machine, all functions together; beyond it an
            idle on-demand instance is evicted or the call is throttled (the account limit, locally).
        idle_timeout_s: on-demand instances idle this long are stopped.
        log_dir: where each instance's log stream goes (a temporary folder by default).
    """

    def __init__(
        self,
        functions: list[FunctionConfig],
        port: int = 0,
        max_instances: int = DEFAULT_MAX_INSTANCES,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        log_dir: Path | None = None,
    ) -> None:
        names = [f.name for f in functions]
        if len(set(names)) != len(names):
            raise ValueError("function names must be unique")
        self.lock = threading.RLock()
        self.meter = BillingMeter()
        self.max_instances = max_instances
        self.idle_timeout_s = idle_timeout_s
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="moeless-lambda-logs-")
            log_dir = Path(self._tmp.name)
        self.log_dir = log_dir
        self.pools = {
            f.name: FunctionPool(f, self.lock, self.meter, self.log_dir, self.make_room) for f in functions
        }
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

    def wait_provisioned(self, timeout_s: float) -> dict[str, dict[str, Any]]:
        """Wait until every provisioned configuration is READY or FAILED; returns their status."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = {
                f"{name}:{qualifier}": pool.provisioned_status(qualifier)
                for name, pool in self.pools.items()
                for qualifier in list(pool.provisioned)
            }
            if all(s["Status"] != "IN_PROGRESS" for s in status.values()) or time.monotonic() > deadline:
                return status
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
