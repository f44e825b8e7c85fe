"""The stall probe: how fast a structure decodes beside a prefill, every environment warm.

A p99 over requests meets the overlap of one request's prompt with others' decoding wherever a
request decodes long enough for another to arrive; a window of a trace need not show it. The
probe is that overlap at its worst routine size, judged without any cold start, so it is what the
structure itself allows, whatever is kept warm (docs/planner.md, step 6, "The stall bound").
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from moeless.contracts.plan import Plan
from moeless.simulation.policies import Deployment, simulate_policy
from moeless.simulation.routing import StepRouting
from moeless.simulation.simulator import Request
from moeless.sizing.settings import STALL_STEPS


def stall_probe(deployment: Deployment) -> list[Request]:
    """The worst routine step for decoding, as requests: a full batch decoding beside a prefill.

    ``max_batch - 1`` sequences with one-token prompts arrive at 0 (step 1 prefills them); one
    prompt arrives just after, so it joins from step 2, while they decode. Chunked: the prompt is
    :data:`STALL_STEPS` chunks, so each of their next STALL_STEPS tokens shares its step with a full
    chunk, the most prompt a step may carry whatever the traffic. Whole prompts: it is as long as
    the deployment admits (``context_tokens``), in one step, and they decode one token past it.
    """
    chunk = deployment.prefill_chunk
    steps = STALL_STEPS if chunk else 1
    prompt = chunk * steps if chunk else deployment.context_tokens
    decoders = [Request(0.0, 1, steps + 1, n) for n in range(max(deployment.max_batch - 1, 1))]
    return [*decoders, Request(1e-3, prompt, 1, len(decoders))]


def stall_tpot_ms(plan: Plan, deployment: Deployment, routing: StepRouting) -> float:
    """The decoding sequences' p99 TPOT in the :func:`stall_probe`, every environment warm: the
    oracle policy (every replica it needs warm and free) on one backbone instance, one step loop,
    so the prompt joins the decoding batch."""
    one_loop = replace(deployment, backbone=replace(deployment.backbone, count=1))
    probe = stall_probe(deployment)
    plan = replace(plan, backbone=None)  # (a sized plan names its backbones: the probe runs one)
    result = simulate_policy("oracle", one_loop, routing, probe, 0.0, plan=plan, timeline=False)
    return float(np.percentile(result.tpot_ms, 99))
