"""The plan's expert functions as local function configurations."""

from __future__ import annotations

import sys
from pathlib import Path

from moeless.aws_prices import vcpus_for_memory
from moeless.lambda_host.instance import FunctionConfig
from moeless.plan import Plan

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
                "MOELESS_EXPERTS_URI": str(Path(artifacts).resolve()),
                "MOELESS_EXPERTS": ",".join(f"{layer}:{expert}" for layer, expert in spec.experts),
                "MOELESS_THREADS": str(vcpus_for_memory(spec.memory_mb)),
            },
            memory_mb=spec.memory_mb,
            timeout_s=timeout_s,
            python=python,
            reserved_concurrency=spec.reserved_concurrency,
        )
        for spec in plan.functions
    ]
