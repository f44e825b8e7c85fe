"""``plan.json``: where each expert runs, in which function, with how much memory and concurrency.

Schema (version 2, see docs/design.md)::

    {"schema_version": 2, "policy": "...", "params": {...}, "workers": W | null,
     "backbone": {"instance": "g6e.xlarge", "count": n} | null,
     "layers": [{"layer": L, "experts": [{"expert": e, "placement": "gpu" | "host" | "function",
        "replicas": r, "workers": [...], "function": "NAME" | null, "memory_mb": m,
        "provisioned_concurrency": p, "offload_rows": R | null}]}],
     "functions": [{"name": "NAME", "experts": [[L, e], ...], "memory_mb": m,
        "provisioned_concurrency": p, "reserved_concurrency": r | null, "keep_warm": k}],
     "estimate": {...}}

Three tiers: ``gpu`` (resident in the backbone's GPU memory, run there), ``host`` (in the backbone
host's RAM, run by onnxruntime on its vCPUs) and ``function`` (Lambda). A ``gpu`` or ``host`` expert
that functions also host and that has ``offload_rows`` runs in two tiers by phase: in a layer of at
least that many rows (the step's tokens: a prefill chunk's step) its rows go to its functions, in
a smaller one (a decode batch's) it stays on the backbone. ``backbone`` names the instance the plan
was sized for and how many of it.

Version 1 plans are read: their ``backbone`` placement was an expert the backbone service ran
in-process on its CPU, i.e. ``host``. The planner writes it; the local host, the backbone service
and the CDK app read it. Until the planner runs, :func:`one_function_per_expert` is the plan:
every expert its own function.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from moeless.aws_prices import MB_PER_VCPU
from moeless.contracts.manifest import Manifest, canonical_digest
from moeless.errors import PlanError
from moeless.fileio import write_json_atomic

SCHEMA_VERSION = 2
_READABLE_VERSIONS = (1, 2)
# One full vCPU: an expert's matmuls are compute-bound, and less memory means a fraction of a core.
DEFAULT_MEMORY_MB = MB_PER_VCPU
LAMBDA_MEMORY_MB = (128, 10_240)
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class Policy(StrEnum):
    """The planner's policies, as plan.json names them: ``static`` is serverful expert
    parallelism (the baseline), ``moeless`` and ``remoe`` the two papers' planners."""

    STATIC = "static"
    MOELESS = "moeless"
    REMOE = "remoe"


class Placement(StrEnum):
    """Where an expert runs: in its own function(s), or resident on the backbone, in its GPU's
    memory (``gpu``) or in its host's RAM, run by its CPUs (``host``)."""

    FUNCTION = "function"
    HOST = "host"
    GPU = "gpu"


RESIDENT = (Placement.HOST, Placement.GPU)
_V1_PLACEMENTS = {"backbone": Placement.HOST, "function": Placement.FUNCTION}


@dataclass
class ExpertPlacement:
    layer: int
    expert: int
    placement: str = Placement.FUNCTION
    replicas: int = 1
    workers: list[int] = field(default_factory=list)
    function: str | None = None
    memory_mb: int = DEFAULT_MEMORY_MB
    provisioned_concurrency: int = 0
    # a resident expert's rows go to its functions in a layer of this many rows (tokens) or more
    # (None: never)
    offload_rows: int | None = None

    @property
    def resident(self) -> bool:
        return self.placement in RESIDENT


@dataclass(frozen=True)
class Backbone:
    """The instance the plan was sized for, and how many of it serve (each its share of the
    sequences, behind the load balancer)."""

    instance: str
    count: int = 1


@dataclass
class FunctionSpec:
    name: str
    experts: list[tuple[int, int]]
    memory_mb: int = DEFAULT_MEMORY_MB
    provisioned_concurrency: int = 0
    reserved_concurrency: int | None = None
    # on-demand environments beyond the provisioned ones that the backbone keeps alive with
    # periodic warm-up invokes (cheap, but Lambda does not promise to keep an idle one)
    keep_warm: int = 0


@dataclass(frozen=True)
class PlanEstimate:
    """What a plan is expected to cost and how long its MoE layers take, from the cost model.

    ``sources`` names where every constant behind the figures comes from; ``plan_seconds`` is the
    planner's own running time."""

    cost_per_1k_requests: float
    makespan_ms: float
    functions: int
    provisioned_concurrency: int
    priced_as: str
    sources: list[str] = field(default_factory=list)
    plan_seconds: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanEstimate:
        """The estimate of a plan file; keys this version does not know are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


@dataclass
class Plan:
    policy: str
    experts: list[ExpertPlacement]
    functions: list[FunctionSpec]
    params: dict[str, Any] = field(default_factory=dict)
    workers: int | None = None
    estimate: PlanEstimate | None = None
    backbone: Backbone | None = None

    def to_dict(self) -> dict[str, Any]:
        layers: dict[int, list[dict[str, Any]]] = {}
        for placement in self.experts:
            row = asdict(placement)
            layers.setdefault(row.pop("layer"), []).append(row)
        return {
            "schema_version": SCHEMA_VERSION,
            "policy": self.policy,
            "params": self.params,
            "workers": self.workers,
            "backbone": asdict(self.backbone) if self.backbone else None,
            "layers": [{"layer": layer, "experts": rows} for layer, rows in sorted(layers.items())],
            "functions": [asdict(f) | {"experts": [list(p) for p in f.experts]} for f in self.functions],
            "estimate": asdict(self.estimate) if self.estimate else {},
        }

    def replica_functions(self) -> dict[tuple[int, int], list[str]]:
        """(layer, expert) -> the functions hosting a replica of it, in plan order."""
        hosts: dict[tuple[int, int], list[str]] = {}
        for spec in self.functions:
            for layer, expert in spec.experts:
                hosts.setdefault((layer, expert), []).append(spec.name)
        return hosts

    def invoke_targets(self) -> dict[tuple[int, int], list[str]]:
        """(layer, expert) -> where a step's invokes for it go, one entry per concurrent invoke.

        An expert's ``replicas`` are concurrent execution environments, not separate functions: its
        tokens are split into that many invokes, spread over the functions hosting it in turn. One
        function hosting an expert with 3 replicas gives ``[f, f, f]`` (three environments of f, as
        its provisioned concurrency provides); plans that give each replica its own function list
        each once. Resident experts have an entry only where they offload (``offload_rows``).
        """
        hosts = self.replica_functions()
        targets: dict[tuple[int, int], list[str]] = {}
        for placement in self.experts:
            key = (placement.layer, placement.expert)
            names = hosts.get(key)
            if not names or (placement.resident and placement.offload_rows is None):
                continue
            targets[key] = [names[k % len(names)] for k in range(max(placement.replicas, len(names)))]
        return targets

    def digest(self) -> str:
        """The plan's identity (sha256 of its canonical JSON, shortened), as the deployed plan's key."""
        return canonical_digest(self.to_dict())

    def in_process(self) -> list[tuple[int, int]]:
        """The experts the backbone runs itself (resident, or hosted by no function): what a
        backbone fetches at start. The others it needs only for the fallback, on demand."""
        return sorted(self.tiers())

    def tiers(self) -> dict[tuple[int, int], Placement]:
        """(layer, expert) -> where the backbone runs it itself: ``gpu`` or ``host`` (an expert
        hosted by no function runs on the host)."""
        targets = self.invoke_targets()
        return {
            (p.layer, p.expert): Placement(p.placement) if p.resident else Placement.HOST
            for p in self.experts
            if p.resident or (p.layer, p.expert) not in targets
        }

    def offloads(self) -> dict[tuple[int, int], int]:
        """(layer, expert) -> rows from which a resident expert's layer goes to its functions."""
        targets = self.invoke_targets()
        return {
            (p.layer, p.expert): p.offload_rows
            for p in self.experts
            if p.resident and p.offload_rows is not None and (p.layer, p.expert) in targets
        }

    def prefixed(self, prefix: str) -> Plan:
        """This plan with its functions deployed under ``prefix`` (one stage's names in a shared account).

        A leading ``moeless-`` of a name gives way to the prefix: ``moeless-l000-e003`` under
        ``moeless-prod-`` is ``moeless-prod-l000-e003``.
        """
        if not prefix:
            return self
        rename = {f.name: prefix + f.name.removeprefix("moeless-") for f in self.functions}
        if len(set(rename.values())) != len(rename):
            raise PlanError(f"function names collide under the prefix {prefix!r}")
        if long := [name for name in rename.values() if not _NAME.match(name)]:
            raise PlanError(f"{long[0]!r} is not a valid Lambda name (at most 64 letters, digits, - and _)")
        return replace(
            self,
            experts=[replace(p, function=rename.get(p.function or "", p.function)) for p in self.experts],
            functions=[replace(f, name=rename[f.name]) for f in self.functions],
        )

    def save(self, path: Path) -> None:
        write_json_atomic(Path(path), self.to_dict())

    def check_fits(self, manifest: Manifest) -> None:
        """Refuse a plan that names experts the artifacts lack, or leaves some expert unplaced."""
        known = {(e.layer, e.expert) for e in manifest.experts}
        placed = {(p.layer, p.expert) for p in self.experts}
        hosted = {pair for f in self.functions for pair in f.experts}
        if unknown := sorted((placed | hosted) - known):
            raise PlanError(f"the plan names experts the artifacts do not have: {_pairs(unknown[:5])}")
        if missing := sorted(known - placed):
            raise PlanError(
                f"the plan places no replica of {len(missing)} expert(s), e.g. {_pairs(missing[:5])}"
            )
        on_functions = {(p.layer, p.expert) for p in self.experts if p.placement == Placement.FUNCTION}
        on_functions |= {(p.layer, p.expert) for p in self.experts if p.offload_rows is not None}
        if unhosted := sorted(on_functions - hosted):
            raise PlanError(f"no function hosts expert(s) {_pairs(unhosted[:5])}")


def _pairs(pairs: list[tuple[int, int]]) -> str:
    return ", ".join(f"layer {layer} expert {expert}" for layer, expert in pairs)


def function_name(layer: int, expert: int) -> str:
    """The default name of the function hosting one expert."""
    return f"moeless-l{layer:03d}-e{expert:03d}"


def one_function_per_expert(manifest: Manifest, memory_mb: int = DEFAULT_MEMORY_MB) -> Plan:
    """The plan before any planning: each expert in its own function, one replica, nothing provisioned."""
    experts = [
        ExpertPlacement(e.layer, e.expert, function=function_name(e.layer, e.expert), memory_mb=memory_mb)
        for e in manifest.experts
    ]
    functions = [FunctionSpec(p.function or "", [(p.layer, p.expert)], memory_mb) for p in experts]
    return Plan("one-function-per-expert", experts, functions)


def plan_for(manifest: Manifest, path: Path | None) -> Plan:
    """The plan at ``path`` checked against ``manifest``, or one function per expert without one."""
    return load_plan(path, manifest) if path else one_function_per_expert(manifest)


def plan_from_dict(data: Any) -> Plan:
    """Build a :class:`Plan` from parsed JSON; raises :class:`PlanError` naming what is wrong."""
    if not isinstance(data, dict):
        raise PlanError("a plan is a JSON object")
    version = data.get("schema_version")
    if version not in _READABLE_VERSIONS:
        raise PlanError(
            f"plan schema_version {version!r} is not supported (this moeless reads "
            f"{' and '.join(map(str, _READABLE_VERSIONS))}): plan again with `moeless plan`"
        )
    try:
        experts = [
            ExpertPlacement(layer=int(layer["layer"]), **_placement_row(row, version))
            for layer in data["layers"]
            for row in layer["experts"]
        ]
        backbone = data.get("backbone")
        functions = [
            FunctionSpec(**(row | {"experts": [(int(a), int(b)) for a, b in row["experts"]]}))
            for row in data.get("functions", [])
        ]
        plan = Plan(
            policy=str(data["policy"]),
            experts=experts,
            functions=functions,
            params=dict(data.get("params") or {}),
            workers=data.get("workers"),
            estimate=PlanEstimate.from_dict(data["estimate"]) if data.get("estimate") else None,
            backbone=Backbone(str(backbone["instance"]), int(backbone["count"])) if backbone else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"the plan is malformed: {type(exc).__name__}: {exc}") from None
    _check_values(plan)
    return plan


def _placement_row(row: dict[str, Any], version: int) -> dict[str, Any]:
    """One expert's row as this version reads it: a version 1 ``backbone`` placement is ``host``
    (the backbone service ran it in-process, on its CPU)."""
    if version == 1 and "placement" in row:
        return row | {"placement": _V1_PLACEMENTS.get(row["placement"], row["placement"])}
    return row


def _check_values(plan: Plan) -> None:
    low, high = LAMBDA_MEMORY_MB
    names = [f.name for f in plan.functions]
    if len(set(names)) != len(names):
        raise PlanError("function names in the plan are not unique")
    for spec in plan.functions:
        if not _NAME.match(spec.name):
            raise PlanError(
                f"function name {spec.name!r} is not a valid Lambda name (letters, digits, - and _)"
            )
        if not low <= spec.memory_mb <= high:
            raise PlanError(
                f"function {spec.name}: memory_mb {spec.memory_mb} is outside Lambda's {low}-{high} MB"
            )
        reserved = spec.reserved_concurrency
        if spec.provisioned_concurrency < 0 or (
            reserved is not None and reserved < spec.provisioned_concurrency
        ):
            raise PlanError(f"function {spec.name}: provisioned concurrency must be >= 0 and <= reserved")
        if not isinstance(spec.keep_warm, int) or spec.keep_warm < 0:
            raise PlanError(f"function {spec.name}: keep_warm must be an integer >= 0")
    if plan.backbone is not None and plan.backbone.count < 1:
        raise PlanError(f"backbone count must be at least 1, not {plan.backbone.count}")
    for placement in plan.experts:
        if placement.placement not in tuple(Placement) or placement.replicas < 1:
            raise PlanError(
                f"layer {placement.layer} expert {placement.expert}: placement must be "
                f"{'|'.join(Placement)} with replicas >= 1"
            )
        if placement.offload_rows is not None and (not placement.resident or placement.offload_rows < 1):
            raise PlanError(
                f"layer {placement.layer} expert {placement.expert}: offload_rows is for gpu or host "
                "experts, and at least 1"
            )


def load_plan(path: Path, manifest: Manifest | None = None) -> Plan:
    """Read a plan file, and check it fits ``manifest`` when given."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise PlanError(f"cannot read the plan {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise PlanError(f"{path} is not valid JSON: {exc}") from None
    plan = plan_from_dict(data)
    if manifest is not None:
        plan.check_fits(manifest)
    return plan
