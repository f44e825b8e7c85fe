"""The environment contract between the deployables: the variables the backbone container and the
expert function read, the alias expert functions are invoked on, and the defaults they share.

One home for these, so that the CDK app, the local Lambda host, the emulator mirror, the backbone
container and the CLI cannot drift apart.

Backbone service (``backbone_service/main.py``):

    MOELESS_ARTIFACTS         the package: a folder, or ``s3://bucket/prefix``
    MOELESS_ARTIFACTS_CACHE   where an S3 package is fetched to
    MOELESS_FALLBACK_CACHE_BYTES  most bytes of fallback experts kept there and open at once (LRU);
                              unset: no bound (a package on local disk)
    MOELESS_PLAN              plan.json: a path or ``s3://bucket/key`` (optional)
    MOELESS_FUNCTION_PREFIX   the deployed functions' name prefix (``moeless-STAGE-``)
    MOELESS_LAMBDA_ENDPOINT   a local host's URL; unset on AWS
    MOELESS_QUALIFIER         the alias to invoke (default :data:`ALIAS`)
    MOELESS_DEVICE            auto | cuda | cpu
    MOELESS_MAX_BATCH         sequences per step (default :data:`DEFAULT_MAX_BATCH`)
    MOELESS_REPLAN_INTERVAL   seconds between re-provisioning (default :data:`DEFAULT_REPLAN_INTERVAL_S`)

Expert function (``functions/expert/handler.py``):

    MOELESS_EXPERTS_URI       folder or ``s3://bucket/prefix`` holding ``manifest.json`` and ``experts/``
    MOELESS_EXPERTS           the experts it hosts, :func:`encode_expert_list`'s ``"L:E,L:E"``
    MOELESS_THREADS           onnxruntime intra-op threads (default: the instance's vCPUs)
"""

from __future__ import annotations

from collections.abc import Iterable

ALIAS = "live"
"""The alias every expert function is invoked on; it carries the provisioned concurrency."""

DEFAULT_REPLAN_INTERVAL_S = 60.0
"""Seconds between re-provisioning from observed loads while serving (0: never)."""

IDLE_TIMEOUT_S = 300.0
"""How long Lambda keeps an idle on-demand environment, as the simulator and the re-planner take it
(AWS publishes no figure; observed lifetimes are minutes): an assumption."""

KEEP_WARM_PING_S = 240.0
"""Seconds between the backbone's pings of a plan's kept-warm environments (under Lambda's idle
timeout, which the simulator takes as 300 s), as served and as simulated."""

EXPERT_TIMEOUT_S = 60
"""The expert functions' timeout: an invoke, and a cold start that goes on into it, finish within
it (the planner keeps each function's weights loadable in time: ``CostModel.max_cold_start_ms``)."""

DEFAULT_MAX_BATCH = 16
"""Sequences the backbone runs in one engine step."""

DEFAULT_DRAFT_CONFIDENCE = 0.0
"""The probability a draft model must give a guess to carry it (its draft stops before the first
less sure one): 0, every guess, as many as ``speculate``. A cut saves rows (and so distinct experts
and invokes) where the draft's probabilities say how often it is right; transformers' assistant
models use 0.4, which would all but silence a small draft that is rarely sure yet right half the
time (benchmarks/results/speculate.md), so it is opt-in."""

ARTIFACTS = "MOELESS_ARTIFACTS"
ARTIFACTS_CACHE = "MOELESS_ARTIFACTS_CACHE"
FALLBACK_CACHE_BYTES = "MOELESS_FALLBACK_CACHE_BYTES"
PLAN = "MOELESS_PLAN"
FUNCTION_PREFIX = "MOELESS_FUNCTION_PREFIX"
LAMBDA_ENDPOINT = "MOELESS_LAMBDA_ENDPOINT"
QUALIFIER = "MOELESS_QUALIFIER"
DEVICE = "MOELESS_DEVICE"
MAX_BATCH = "MOELESS_MAX_BATCH"
REPLAN_INTERVAL = "MOELESS_REPLAN_INTERVAL"
EXPERTS_URI = "MOELESS_EXPERTS_URI"
EXPERTS = "MOELESS_EXPERTS"
THREADS = "MOELESS_THREADS"


def encode_expert_list(experts: Iterable[tuple[int, int]]) -> str:
    """``[(0, 3), (1, 7)]`` -> ``"0:3,1:7"``: the value of ``MOELESS_EXPERTS``."""
    return ",".join(f"{layer}:{expert}" for layer, expert in experts)


def parse_expert_list(text: str) -> list[tuple[int, int]]:
    """``"0:3,1:7"`` -> ``[(0, 3), (1, 7)]``. Raises ``ValueError`` on malformed text."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        layer, _, expert = item.partition(":")
        pairs.append((int(layer), int(expert)))
    return pairs
