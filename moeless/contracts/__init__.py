"""The formats that cross parts: the package manifest, the plan, expert loads, the invoke payload
and the names and environment variables the deployables share. Nothing here imports another part."""

from moeless.contracts import environment
from moeless.contracts.loads import Loads, load_loads
from moeless.contracts.manifest import ExpertEntry, Manifest, load_manifest
from moeless.contracts.payload import (
    PayloadError,
    decode_matrix,
    decode_request,
    encode_bundle,
    encode_matrix,
    encode_request,
    payload_json,
)
from moeless.contracts.plan import (
    ExpertPlacement,
    FunctionSpec,
    Placement,
    Plan,
    Policy,
    load_plan,
    one_function_per_expert,
    plan_for,
)

__all__ = [
    "ExpertEntry",
    "ExpertPlacement",
    "FunctionSpec",
    "Loads",
    "Manifest",
    "PayloadError",
    "Placement",
    "Plan",
    "Policy",
    "decode_matrix",
    "decode_request",
    "encode_bundle",
    "encode_matrix",
    "encode_request",
    "environment",
    "load_loads",
    "load_manifest",
    "load_plan",
    "one_function_per_expert",
    "payload_json",
    "plan_for",
]
