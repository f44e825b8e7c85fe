"""The plan's expert functions on a local host: their configurations, and starting them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from moeless.aws_limits import DEFAULT_LIMITS, LambdaLimits
from moeless.aws_prices import vcpus_for_memory
from moeless.contracts.environment import ALIAS, EXPERTS, EXPERTS_URI, THREADS, encode_expert_list
from moeless.contracts.plan import Plan
from moeless.errors import LambdaHostError
from moeless.lambda_host.host import LambdaHost
from moeless.lambda_host.instance import FunctionConfig

EXPERT_HANDLER = "handler.handler"


def expert_function_configs(
    artifacts: Path,
    plan: Plan,
    task_root: Path,
    python: str = sys.executable,
    timeout_s: float = 30.0,
) -> list[FunctionConfig]:
    """One :class:`FunctionConfig` per function of ``plan``, serving its experts from ``artifacts``.

    ``task_root`` is the folder of the expert handler (``functions/expert`` in a checkout).
    onnxruntime gets as many threads as the function's memory buys vCPUs, as on Lambda.
    """
    return [
        FunctionConfig(
            name=spec.name,
            task_root=Path(task_root).resolve(),
            handler=EXPERT_HANDLER,
            environment={
                EXPERTS_URI: str(Path(artifacts).resolve()),
                EXPERTS: encode_expert_list(spec.experts),
                THREADS: str(vcpus_for_memory(spec.memory_mb)),
            },
            memory_mb=spec.memory_mb,
            timeout_s=timeout_s,
            python=python,
            reserved_concurrency=spec.reserved_concurrency,
        )
        for spec in plan.functions
    ]


def start_expert_host(
    artifacts: Path,
    plan: Plan,
    task_root: Path,
    port: int = 0,
    alias: str = ALIAS,
    max_instances: int = 64,
    idle_timeout_s: float = 300.0,
    timeout_s: float = 30.0,
    log_dir: Path | None = None,
    on_progress: Callable[[str], None] = lambda message: None,
    limits: LambdaLimits = DEFAULT_LIMITS,
) -> LambdaHost:
    """Start a local host with the plan's expert functions, and apply the plan's concurrency.

    Reserved and provisioned concurrency go through the Lambda API (boto3), as they would on AWS;
    this returns once every provisioned instance is initialised (the host fails those whose init
    overruns ``limits``' provisioned init limit).

    Raises:
        LambdaHostError: the port is taken, or provisioned instances failed to initialise.
    """
    from moeless.lambda_host.client import lambda_client
    from moeless.planning.provisioning import apply_concurrency

    configs = expert_function_configs(artifacts, plan, task_root, timeout_s=timeout_s)
    try:
        host = LambdaHost(configs, port, max_instances, idle_timeout_s, log_dir, limits, alias).start()
    except OSError as exc:
        raise LambdaHostError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None
    try:
        apply_concurrency(lambda_client(host.endpoint_url), plan, alias)
        provisioned = sum(spec.provisioned_concurrency for spec in plan.functions)
        if provisioned:
            on_progress(f"initialising {provisioned} provisioned instance(s)...")
            # each init is failed at its limit, counted from its spawn (before this wait)
            failed = host.wait_provisioned(timeout_s=limits.provisioned_init_limit_s(timeout_s) + 5.0)
            if failed:
                raise LambdaHostError(f"provisioned concurrency did not become ready: {failed}")
    except BaseException:
        host.stop()
        raise
    return host
