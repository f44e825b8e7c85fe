"""What a simulation replays, built from the command line's files: the model's shape and routing,
the requests, the deployment. Shared by ``moeless simulate`` and ``moeless plan --slo-tpot-ms``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moeless.errors import SimulationError
from moeless.model.shapes import ModelShape
from moeless.simulation.policies import Deployment, requests_for, requests_replaying
from moeless.simulation.routing import RecordedRouting, SampledRouting, StepRouting
from moeless.simulation.simulator import Request
from moeless.simulation.speculation import Acceptance


def shape_and_routing(
    trace_path: Path | None, loads_path: Path | None, model_spec: str | None, resample: bool, seed: int
) -> tuple[ModelShape, StepRouting]:
    """The model's shape (from ``model_spec``, else what the data names) and the routing over its
    layers: per-token routing replayed from a trace, or sampled from loads."""
    from moeless.contracts.loads import load_loads
    from moeless.model.shapes import resolve_model, shape_for_loads
    from moeless.prediction.routing_file import load_routing_or_trace

    if (trace_path is None) == (loads_path is None):
        raise SimulationError("give one of --trace or --loads")
    if loads_path is not None:
        loads = load_loads(loads_path)
        shape = resolve_model(model_spec) if model_spec else shape_for_loads(loads.meta, None)
        if resample:
            experts, top_k = shape.num_experts, shape.top_k
        else:
            experts, top_k = None, loads.top_k or shape.top_k
            _check_experts(shape, loads.num_experts)
        routing = SampledRouting.from_loads(
            loads, top_k, list(shape.moe_layers), shape.num_layers, experts, seed
        )
        return shape, routing
    assert trace_path is not None
    trace = load_routing_or_trace(trace_path)
    if model_spec:
        shape = resolve_model(model_spec)
    else:
        config = Path(str(trace.meta.get("model", ""))) / "config.json"
        shape = resolve_model(str(config)) if config.is_file() else shape_for_loads(trace.meta, None)
    _check_experts(shape, trace.num_experts)
    return shape, RecordedRouting.from_trace(trace, list(shape.moe_layers), shape.num_layers)


def _check_experts(shape: ModelShape, recorded: int) -> None:
    if shape.num_experts != recorded:
        raise SimulationError(
            f"the routing has {recorded} experts per layer but {shape.name} has {shape.num_experts}: "
            "pass the --model it was recorded on, or --resample-experts to carry its skew over"
        )


def replay_for(
    routing: StepRouting,
    arrivals_path: Path | None,
    rate: float | None,
    arrival: str,
    duration_s: float,
    prompt_tokens: int,
    output_tokens: int,
    seed: int,
) -> tuple[list[Request], str]:
    """The requests to replay and where they come from: a recorded trace (rescaled to ``rate``
    requests/s, cut to the duration), else the synthetic ``arrival`` process (a recorded routing's
    requests keep their recorded lengths)."""
    from moeless.simulation.arrivals import arrival_times, read_arrivals, synthetic

    if rate is not None and arrivals_path is None:
        raise SimulationError(
            "--rate rescales --arrivals; for a synthetic process give --arrival poisson:RATE"
        )
    rng = np.random.default_rng(seed)
    if arrivals_path is not None:
        traffic = read_arrivals(arrivals_path)
        traffic = (traffic.rescaled(rate) if rate else traffic).cut(duration_s)
        return requests_for(traffic), traffic.source
    if isinstance(routing, RecordedRouting):
        return requests_replaying(arrival_times(arrival, duration_s, rng), routing), arrival
    traffic = synthetic(arrival, duration_s, rng, prompt_tokens, output_tokens)
    return requests_for(traffic), traffic.source


def deployment_for(
    shape: ModelShape,
    expert_dtype: str,
    gpu_dtype: str,
    max_batch: int,
    context_tokens: int,
    instances_path: Path | None,
    prefill_chunk: int | None = None,
    speculate: int = 0,
    draft_acceptance: Acceptance | None = None,
) -> Deployment:
    """The deployment of ``shape``, on the built-in GPU catalogue or the one in ``instances_path``
    (with ``speculate`` drafts per forward kept at ``draft_acceptance``)."""
    catalogue = None
    if instances_path is not None:
        from moeless.planning.instances import load_catalogue

        catalogue = load_catalogue(instances_path)
    return Deployment.choose(
        shape,
        expert_dtype,
        gpu_dtype,
        max_batch,
        context_tokens,
        catalogue,
        prefill_chunk=prefill_chunk,
        speculate=speculate,
        draft_acceptance=draft_acceptance,
    )
