"""The serverful side's instances: GPU memory, HBM bandwidth, 16-bit FLOPs and the on-demand price of
each EC2 GPU instance, and the cheapest fleet of one type that holds a model.

Prices are on-demand Linux, us-east-1, in USD per hour, after AWS's June 2025 cut of P4/P5 on-demand
prices (up to 45%: p5.48xlarge $98.32 -> $55.04, p4d.24xlarge $32.77 -> $21.96). Where each comes from:

* every price: the us-east-1 Price List API table of github.com/spore-host/spawn,
  ``pkg/slurm/resources.go`` ("verified 2026-07-27"), read 2026-12-01;
* p4d.24xlarge, p4de.24xlarge and p5.48xlarge also in github.com/datareceipts/data-receipts,
  ``109-gpu-pricing/hyperscalers.json`` (retrieved 2026-11-09: $21.957642, $27.44705, $55.04);
* p5en.48xlarge also in ``dstack offer`` output of github.com/dstackai/dstack/pull/4110 (2026-08-06:
  $63.296 in us-east-1, us-east-2 and us-west-2);
* g5.xlarge also in factualminds.com's "Amazon EC2 On-Demand Pricing ... (2026)" (2026-06-17: $1.006),
  and g5.xlarge / g6.xlarge are the figures this project used before (read 2026-11).

Not confirmed: **p5e.48xlarge** has no published on-demand rate (AWS sells it through Capacity Blocks
and reservations, not in us-east-1 on demand); it is listed at p5en's $63.296 so a fleet can be sized
with it, and ties go to p5en (listed first). None of these prices was read off aws.amazon.com itself
(not reachable from here): re-check them at aws.amazon.com/ec2/pricing/on-demand before quoting.

GPU figures per GPU, from NVIDIA's datasheets, dense (no sparsity) bf16/fp16 tensor peak: A10G 24 GB,
600 GB/s, ~70 TFLOP/s (not on a datasheet: AWS's variant of the A10, whose 125 TF it does not reach;
baseten.co "NVIDIA A10 vs A10G for ML model inference"); L4 24 GB, 300 GB/s, 121 TF; L40S 48 GB,
864 GB/s, 362 TF; A100 SXM 40 GB 1,555 GB/s and 80 GB 2,039 GB/s, 312 TF; H100 SXM 80 GB, 3,350 GB/s,
989 TF; H200 141 GB, 4,800 GB/s, 989 TF. Memory is counted in 10^9 bytes (the datasheets' GB).

Usable memory: :data:`USABLE_FRACTION` of the GPU memory holds weights and KV cache; the rest is the
CUDA context, activations and communication buffers (vLLM's default ``gpu_memory_utilization``).
A fleet of several instances holds the model only split across them (tensor/pipeline parallel over
the network); that it fits says nothing about how fast it runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from moeless.errors import CatalogueError

__all__ = ["CATALOGUE", "USABLE_FRACTION", "Fleet", "Instance", "cheapest_fleet", "load_catalogue"]

USABLE_FRACTION = 0.9


@dataclass(frozen=True)
class Instance:
    """One EC2 GPU instance type; every figure is the total over its GPUs."""

    name: str  # "p5.48xlarge"
    gpus: int
    gpu: str  # "H100 80GB"
    gpu_memory_gb: float  # total over the instance's GPUs, 10^9 bytes
    hbm_gbps: float  # total HBM bandwidth, GB/s
    tflops_16bit: float  # total dense bf16/fp16 tensor TFLOP/s (no sparsity)
    hourly_usd: float  # on-demand Linux, us-east-1
    source: str  # where the price and the specs come from, with the date read


@dataclass(frozen=True)
class Fleet:
    """``count`` instances of one type."""

    instance: Instance
    count: int

    @property
    def hourly_usd(self) -> float:
        return self.count * self.instance.hourly_usd

    @property
    def memory_bytes(self) -> float:
        """GPU memory usable for weights and KV cache: :data:`USABLE_FRACTION` of the total."""
        return self.count * self.instance.gpu_memory_gb * 1e9 * USABLE_FRACTION

    @property
    def hbm_gbps(self) -> float:
        return self.count * self.instance.hbm_gbps

    @property
    def tflops_16bit(self) -> float:
        return self.count * self.instance.tflops_16bit

    def label(self) -> str:
        return f"{self.count}x {self.instance.name}"


_SPAWN = "github.com/spore-host/spawn pkg/slurm/resources.go (Price List API, us-east-1, verified 2026-07-27)"
_RECEIPTS = "github.com/datareceipts/data-receipts 109-gpu-pricing/hyperscalers.json (retrieved 2026-11-09)"
_DSTACK = "github.com/dstackai/dstack/pull/4110 (dstack offer, us-east-1, 2026-08-06)"
_READ = "read 2026-12-01"
# per GPU: (label, GB, GB/s, dense 16-bit TFLOP/s, datasheet)
_GPUS = {
    "A10G": ("A10G 24GB", 24.0, 600.0, 70.0, "NVIDIA A10 datasheet; A10G tensor peak per baseten.co"),
    "L4": ("L4 24GB", 24.0, 300.0, 121.0, "NVIDIA L4 datasheet"),
    "L40S": ("L40S 48GB", 48.0, 864.0, 362.0, "NVIDIA L40S datasheet"),
    "A100-40": ("A100 SXM 40GB", 40.0, 1555.0, 312.0, "NVIDIA A100 datasheet"),
    "A100-80": ("A100 SXM 80GB", 80.0, 2039.0, 312.0, "NVIDIA A100 datasheet"),
    "H100": ("H100 SXM 80GB", 80.0, 3350.0, 989.0, "NVIDIA H100 datasheet"),
    "H200": ("H200 141GB", 141.0, 4800.0, 989.0, "NVIDIA H200 datasheet"),
}


def _instance(name: str, gpus: int, gpu: str, hourly_usd: float, price_source: str) -> Instance:
    label, gb, gbps, tflops, datasheet = _GPUS[gpu]
    return Instance(
        name,
        gpus,
        label,
        gpus * gb,
        gpus * gbps,
        gpus * tflops,
        hourly_usd,
        f"price: {price_source}, {_READ}; specs: {datasheet}",
    )


CATALOGUE: dict[str, Instance] = {
    i.name: i
    for i in (
        _instance("g5.xlarge", 1, "A10G", 1.006, _SPAWN + "; factualminds.com (2026-06-17)"),
        _instance("g5.12xlarge", 4, "A10G", 5.672, _SPAWN),
        _instance("g5.48xlarge", 8, "A10G", 16.288, _SPAWN),
        _instance("g6.xlarge", 1, "L4", 0.8048, _SPAWN),
        _instance("g6.12xlarge", 4, "L4", 4.6016, _SPAWN),
        _instance("g6.48xlarge", 8, "L4", 13.3504, _SPAWN),
        _instance("g6e.xlarge", 1, "L40S", 1.861, _SPAWN),
        _instance("g6e.12xlarge", 4, "L40S", 10.49264, _SPAWN),
        _instance("g6e.48xlarge", 8, "L40S", 30.13118, _SPAWN),
        _instance("p4d.24xlarge", 8, "A100-40", 21.957642, f"{_SPAWN}; {_RECEIPTS}"),
        _instance("p4de.24xlarge", 8, "A100-80", 27.44705, f"{_SPAWN}; {_RECEIPTS}"),
        _instance("p5.4xlarge", 1, "H100", 6.88, _SPAWN),
        _instance("p5.48xlarge", 8, "H100", 55.04, f"{_SPAWN}; {_RECEIPTS}"),
        _instance("p5en.48xlarge", 8, "H200", 63.296, f"{_SPAWN}; {_DSTACK}"),
        _instance(
            "p5e.48xlarge",
            8,
            "H200",
            63.296,
            "NOT CONFIRMED: no published on-demand rate (Capacity Blocks only); p5en's rate",
        ),
    )
}


def cheapest_fleet(
    bytes_needed: float, catalogue: Mapping[str, Instance] = CATALOGUE, max_instances: int = 16
) -> Fleet:
    """The cheapest homogeneous set of instances (n x one type) whose usable GPU memory holds
    ``bytes_needed``; ties -> fewer instances, then more bandwidth, then the catalogue's order.

    Raises:
        CatalogueError: nothing of up to ``max_instances`` instances holds it (names the bytes and
            the biggest fleet tried), or the catalogue is empty.
    """
    assert bytes_needed >= 0 and max_instances >= 1, (bytes_needed, max_instances)
    if not catalogue:
        raise CatalogueError("the instance catalogue is empty")
    fits = []
    for order, instance in enumerate(catalogue.values()):
        count = max(1, math.ceil(bytes_needed / Fleet(instance, 1).memory_bytes))
        if count <= max_instances:
            fleet = Fleet(instance, count)
            fits.append(((fleet.hourly_usd, count, -fleet.hbm_gbps, order), fleet))
    if not fits:
        biggest = max((Fleet(i, max_instances) for i in catalogue.values()), key=lambda f: f.memory_bytes)
        raise CatalogueError(
            f"no fleet holds {bytes_needed / 1e9:,.1f} GB: the biggest tried, {biggest.label()}, holds "
            f"{biggest.memory_bytes / 1e9:,.1f} GB ({USABLE_FRACTION:.0%} of its GPU memory)"
        )
    return min(fits, key=lambda pair: pair[0])[1]


_FIELDS = tuple(f.name for f in fields(Instance))
_TEXT = ("name", "gpu", "source")


def _entry(raw: Any, where: str) -> Instance:
    if not isinstance(raw, dict):
        raise CatalogueError(f"{where} is not an object with the fields {', '.join(_FIELDS)}")
    missing = [k for k in _FIELDS if k not in raw]
    unknown = sorted(set(raw) - set(_FIELDS))
    if missing or unknown:
        said = [f"lacks {', '.join(missing)}"] if missing else []
        said += [f"has unknown field(s) {', '.join(unknown)}"] if unknown else []
        raise CatalogueError(f"{where} {' and '.join(said)}")
    for key in _TEXT:
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise CatalogueError(f"{where}: {key} must be a non-empty string, not {raw[key]!r}")
    if not isinstance(raw["gpus"], int) or isinstance(raw["gpus"], bool) or raw["gpus"] < 1:
        raise CatalogueError(f"{where}: gpus must be a whole number of at least 1, not {raw['gpus']!r}")
    for key in ("gpu_memory_gb", "hbm_gbps", "tflops_16bit", "hourly_usd"):
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise CatalogueError(f"{where}: {key} must be a number above 0, not {value!r}")
    return Instance(
        raw["name"],
        raw["gpus"],
        raw["gpu"],
        float(raw["gpu_memory_gb"]),
        float(raw["hbm_gbps"]),
        float(raw["tflops_16bit"]),
        float(raw["hourly_usd"]),
        raw["source"],
    )


def load_catalogue(path: Path) -> dict[str, Instance]:
    """A user's own catalogue, replacing the built-in one: a JSON list of objects with exactly the
    fields of :class:`Instance` (totals over the instance's GPUs, price in USD per hour).

    Raises:
        CatalogueError: the file is unreadable, not a non-empty list, an entry lacks a field, has an
            unknown one or a bad value, or two entries share a name (each named in the message).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CatalogueError(f"instance catalogue {path} is not readable JSON: {exc}") from exc
    if not isinstance(data, list) or not data:
        raise CatalogueError(f"instance catalogue {path} must be a non-empty JSON list of instances")
    catalogue: dict[str, Instance] = {}
    for index, raw in enumerate(data):
        label = raw.get("name") if isinstance(raw, dict) else None
        instance = _entry(raw, f"{path}: instance {index}" + (f" ({label})" if label else ""))
        if instance.name in catalogue:
            raise CatalogueError(f"{path}: instance {index} repeats the name {instance.name!r}")
        catalogue[instance.name] = instance
    return catalogue
