"""The serverful side's instances: GPU memory, HBM bandwidth, 16-bit FLOPs, the host's vCPUs, RAM and
memory bandwidth, and the on-demand price of each EC2 GPU instance; the cheapest fleet of one type that
holds a model, and the cheapest single instance that holds a hybrid backbone (part on the GPU, part
in host RAM).

Prices are on-demand Linux, us-east-1, in USD per hour, after AWS's June 2025 cut of P4/P5 on-demand
prices (up to 45%: p5.48xlarge $98.32 -> $55.04, p4d.24xlarge $32.77 -> $21.96). Where each comes from:

* every price: the us-east-1 Price List API table of github.com/spore-host/spawn,
  ``pkg/slurm/resources.go`` ("verified 2026-07-27"), read 2026-12-01 (the single-GPU g5/g6/g6e
  sizes above xlarge read 2026-12-05);
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

The host: vCPUs, RAM (GiB, as AWS lists it) and CPU model of every instance are those of AWS's
"Specifications for Amazon EC2 accelerated computing instances" (docs.aws.amazon.com/ec2/latest/
instancetypes/ac.html, a stored copy that lists P6-B300 and G7e, read 2026-12-05); vCPUs and RAM
agree with spawn's DescribeInstanceTypes table above. The host's memory bandwidth is worked out, not
measured: memory channels per socket x MT/s x 8 bytes x sockets, times
:data:`HOST_BANDWIDTH_EFFICIENCY`. Channels and speed are the CPU family's (AMD EPYC 7002 Rome and
7003 Milan: 8 channels of DDR4-3200; Xeon Cascade Lake: 6 of DDR4-2933; Xeon Sapphire Rapids: 8 of
DDR5-4800); AWS does not publish how its hosts are populated, so one DIMM per channel at the rated
speed is assumed (two per channel run Milan's DDR4 at 2933, about 8% less). Sockets: a whole host
(the largest size of the family) is two, from its core count (96 or 48 cores against 48-core 7R32 /
7R13 / Sapphire Rapids parts and the 24-core 8275CL), an inference, not read off AWS. An instance
that is a fraction of a host (g5.xlarge: 4 of the host's 192 vCPUs) is given its vCPU share of the
host's bandwidth. That is conservative: a small VM's few cores can draw more than their share while
the neighbours are idle, but nothing guarantees it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from moeless.errors import CatalogueError

__all__ = [
    "CATALOGUE",
    "HOST_BANDWIDTH_EFFICIENCY",
    "HOST_USABLE_FRACTION",
    "USABLE_FRACTION",
    "Fleet",
    "Instance",
    "cheapest_backbone",
    "cheapest_fleet",
    "load_catalogue",
]

USABLE_FRACTION = 0.9
# Of the host's RAM, what weights kept there may take: the rest is the OS, the serving process itself
# (Python, CUDA's pinned staging buffers) and page cache for the files the weights are loaded from.
# An assumption, not a measurement.
HOST_USABLE_FRACTION = 0.85
# Sustained over theoretical DRAM bandwidth: STREAM triad reaches roughly 70-80% of the wire rate
# (e.g. Texas Instruments' AM62x/AM64x benchmark notes SPRAD45A and SPRACV1B: triad 74-78% of DDR4's
# MT/s x width, measured on small SoCs). Taken to hold for these servers' CPUs: not measured on them.
HOST_BANDWIDTH_EFFICIENCY = 0.75
GIB = 2**30


@dataclass(frozen=True)
class Instance:
    """One EC2 GPU instance type; every GPU figure is the total over its GPUs."""

    name: str  # "p5.48xlarge"
    gpus: int
    gpu: str  # "H100 80GB"
    gpu_memory_gb: float  # total over the instance's GPUs, 10^9 bytes
    hbm_gbps: float  # total HBM bandwidth, GB/s
    tflops_16bit: float  # total dense bf16/fp16 tensor TFLOP/s (no sparsity)
    hourly_usd: float  # on-demand Linux, us-east-1
    source: str  # where the price and the specs come from, with the date read
    vcpus: int
    host_memory_gb: float  # the instance's RAM in GiB (2^30 bytes), as AWS lists it
    host_memory_gbps: float  # the host memory bandwidth this instance can count on, GB/s
    host_source: str  # where the vCPUs, RAM and bandwidth come from, with the date read

    @property
    def host_memory_bytes(self) -> float:
        return self.host_memory_gb * GIB

    @property
    def host_bytes_usable(self) -> float:
        """Host RAM that weights may take: :data:`HOST_USABLE_FRACTION` of it."""
        return self.host_memory_bytes * HOST_USABLE_FRACTION


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
_AWS_SPECS = (
    "AWS 'Specifications for Amazon EC2 accelerated computing instances' (vCPUs, GiB, CPU; stored copy, "
    "read 2026-12-05), vCPUs and GiB also in spawn's DescribeInstanceTypes table (verified 2026-07-27)"
)
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
# per host CPU: (label, memory channels per socket, MT/s, sockets per host, vCPUs per host)
_CPUS = {
    "7R32": ("AMD EPYC 7R32 (Rome), DDR4-3200", 8, 3200, 2, 192),
    "7R13": ("AMD EPYC 7R13 (Milan), DDR4-3200", 8, 3200, 2, 192),
    "8275CL": ("Intel Xeon Platinum 8275CL (Cascade Lake), DDR4-2933", 6, 2933, 2, 96),
    "SPR": ("Intel Xeon Sapphire Rapids, DDR5-4800", 8, 4800, 2, 192),
}


def _host_gbps(channels: int, mt_s: int, sockets: int, vcpus: int, host_vcpus: int) -> float:
    """The host's sustained memory bandwidth in GB/s, the instance's vCPU share of it."""
    peak_gbps = channels * mt_s * 8 * sockets / 1e3
    return peak_gbps * HOST_BANDWIDTH_EFFICIENCY * vcpus / host_vcpus


def _instance(
    name: str, gpus: int, gpu: str, vcpus: int, ram_gib: float, cpu: str, hourly_usd: float, price_source: str
) -> Instance:
    label, gb, gbps, tflops, datasheet = _GPUS[gpu]
    cpu_label, channels, mt_s, sockets, host_vcpus = _CPUS[cpu]
    assert vcpus <= host_vcpus, (name, vcpus, host_vcpus)
    return Instance(
        name=name,
        gpus=gpus,
        gpu=label,
        gpu_memory_gb=gpus * gb,
        hbm_gbps=gpus * gbps,
        tflops_16bit=gpus * tflops,
        hourly_usd=hourly_usd,
        source=f"price: {price_source}, {_READ}; specs: {datasheet}",
        vcpus=vcpus,
        host_memory_gb=ram_gib,
        host_memory_gbps=_host_gbps(channels, mt_s, sockets, vcpus, host_vcpus),
        host_source=(
            f"{_AWS_SPECS}; bandwidth: {cpu_label}, {channels} channels x {sockets} sockets (vendor spec, "
            f"AWS's DIMM population not published) x {HOST_BANDWIDTH_EFFICIENCY}, {vcpus}/{host_vcpus} vCPUs"
        ),
    )


CATALOGUE: dict[str, Instance] = {
    i.name: i
    for i in (
        _instance("g5.xlarge", 1, "A10G", 4, 16, "7R32", 1.006, _SPAWN + "; factualminds.com (2026-06-17)"),
        _instance("g5.2xlarge", 1, "A10G", 8, 32, "7R32", 1.212, _SPAWN),
        _instance("g5.4xlarge", 1, "A10G", 16, 64, "7R32", 1.624, _SPAWN),
        _instance("g5.8xlarge", 1, "A10G", 32, 128, "7R32", 2.448, _SPAWN),
        _instance("g5.16xlarge", 1, "A10G", 64, 256, "7R32", 4.096, _SPAWN),
        _instance("g5.12xlarge", 4, "A10G", 48, 192, "7R32", 5.672, _SPAWN),
        _instance("g5.48xlarge", 8, "A10G", 192, 768, "7R32", 16.288, _SPAWN),
        _instance("g6.xlarge", 1, "L4", 4, 16, "7R13", 0.8048, _SPAWN),
        _instance("g6.2xlarge", 1, "L4", 8, 32, "7R13", 0.9776, _SPAWN),
        _instance("g6.4xlarge", 1, "L4", 16, 64, "7R13", 1.3232, _SPAWN),
        _instance("g6.8xlarge", 1, "L4", 32, 128, "7R13", 2.0144, _SPAWN),
        _instance("g6.16xlarge", 1, "L4", 64, 256, "7R13", 3.3968, _SPAWN),
        _instance("g6.12xlarge", 4, "L4", 48, 192, "7R13", 4.6016, _SPAWN),
        _instance("g6.48xlarge", 8, "L4", 192, 768, "7R13", 13.3504, _SPAWN),
        _instance("g6e.xlarge", 1, "L40S", 4, 32, "7R13", 1.861, _SPAWN),
        _instance("g6e.2xlarge", 1, "L40S", 8, 64, "7R13", 2.24208, _SPAWN),
        _instance("g6e.4xlarge", 1, "L40S", 16, 128, "7R13", 3.00424, _SPAWN),
        _instance("g6e.8xlarge", 1, "L40S", 32, 256, "7R13", 4.52856, _SPAWN),
        _instance("g6e.16xlarge", 1, "L40S", 64, 512, "7R13", 7.57719, _SPAWN),
        _instance("g6e.12xlarge", 4, "L40S", 48, 384, "7R13", 10.49264, _SPAWN),
        _instance("g6e.24xlarge", 4, "L40S", 96, 768, "7R13", 15.06559, _SPAWN),
        _instance("g6e.48xlarge", 8, "L40S", 192, 1536, "7R13", 30.13118, _SPAWN),
        _instance("p4d.24xlarge", 8, "A100-40", 96, 1152, "8275CL", 21.957642, f"{_SPAWN}; {_RECEIPTS}"),
        _instance("p4de.24xlarge", 8, "A100-80", 96, 1152, "8275CL", 27.44705, f"{_SPAWN}; {_RECEIPTS}"),
        _instance("p5.4xlarge", 1, "H100", 16, 256, "7R13", 6.88, _SPAWN),
        _instance("p5.48xlarge", 8, "H100", 192, 2048, "7R13", 55.04, f"{_SPAWN}; {_RECEIPTS}"),
        _instance("p5en.48xlarge", 8, "H200", 192, 2048, "SPR", 63.296, f"{_SPAWN}; {_DSTACK}"),
        _instance(
            "p5e.48xlarge",
            8,
            "H200",
            192,
            2048,
            "7R13",
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


def cheapest_backbone(
    gpu_bytes: float,
    host_bytes: float,
    catalogue: Mapping[str, Instance] = CATALOGUE,
    min_host_gbps: float = 0.0,
) -> Instance:
    """The cheapest single instance whose usable GPU memory (:data:`USABLE_FRACTION`) holds
    ``gpu_bytes`` and whose usable host RAM (:data:`HOST_USABLE_FRACTION`) holds ``host_bytes``: the
    node of a hybrid backbone that keeps some weights in RAM; with ``min_host_gbps``, the cheapest
    whose host also reads at least that fast. Ties -> more HBM bandwidth, then more host bandwidth,
    then the catalogue's order.

    Raises:
        CatalogueError: no instance holds both (names the bytes asked and the instances with the most
            GPU memory and the most host RAM), or the catalogue is empty.
    """
    assert gpu_bytes >= 0 and host_bytes >= 0, (gpu_bytes, host_bytes)
    if not catalogue:
        raise CatalogueError("the instance catalogue is empty")
    fits = [
        ((i.hourly_usd, -i.hbm_gbps, -i.host_memory_gbps, order), i)
        for order, i in enumerate(catalogue.values())
        if Fleet(i, 1).memory_bytes >= gpu_bytes
        and i.host_bytes_usable >= host_bytes
        and i.host_memory_gbps >= min_host_gbps
    ]
    if fits:
        return min(fits, key=lambda pair: pair[0])[1]
    most_gpu = max(catalogue.values(), key=lambda i: i.gpu_memory_gb)
    most_host = max(catalogue.values(), key=lambda i: i.host_memory_gb)
    tried = " and ".join(_holds(i) for i in {most_gpu.name: most_gpu, most_host.name: most_host}.values())
    faster = f" with a host of at least {min_host_gbps:g} GB/s" if min_host_gbps else ""
    raise CatalogueError(
        f"no single instance{faster} holds {gpu_bytes / 1e9:,.1f} GB on its GPUs and "
        f"{host_bytes / 1e9:,.1f} GB in host RAM: the biggest tried, {tried} (usable: "
        f"{USABLE_FRACTION:.0%} of GPU memory, {HOST_USABLE_FRACTION:.0%} of RAM)"
    )


def _holds(instance: Instance) -> str:
    gpu_gb = Fleet(instance, 1).memory_bytes / 1e9
    return f"{instance.name}, holds {gpu_gb:,.1f} GB GPU and {instance.host_bytes_usable / 1e9:,.1f} GB host"


_FIELDS = tuple(f.name for f in fields(Instance))
_TEXT = ("name", "gpu", "source", "host_source")
_WHOLE = ("gpus", "vcpus")
_POSITIVE = ("gpu_memory_gb", "hbm_gbps", "tflops_16bit", "hourly_usd", "host_memory_gb", "host_memory_gbps")


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
    for key in _WHOLE:
        if not isinstance(raw[key], int) or isinstance(raw[key], bool) or raw[key] < 1:
            raise CatalogueError(f"{where}: {key} must be a whole number of at least 1, not {raw[key]!r}")
    for key in _POSITIVE:
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise CatalogueError(f"{where}: {key} must be a number above 0, not {value!r}")
    return Instance(
        name=raw["name"],
        gpus=raw["gpus"],
        gpu=raw["gpu"],
        gpu_memory_gb=float(raw["gpu_memory_gb"]),
        hbm_gbps=float(raw["hbm_gbps"]),
        tflops_16bit=float(raw["tflops_16bit"]),
        hourly_usd=float(raw["hourly_usd"]),
        source=raw["source"],
        vcpus=raw["vcpus"],
        host_memory_gb=float(raw["host_memory_gb"]),
        host_memory_gbps=float(raw["host_memory_gbps"]),
        host_source=raw["host_source"],
    )


def load_catalogue(path: Path) -> dict[str, Instance]:
    """A user's own catalogue, replacing the built-in one: a JSON list of objects with exactly the
    fields of :class:`Instance` (GPU figures totals over the instance's GPUs, price in USD per hour,
    ``host_memory_gb`` in GiB, ``host_memory_gbps`` the host bandwidth this instance can count on).

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
