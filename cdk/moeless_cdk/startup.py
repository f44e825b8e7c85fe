"""How a backbone task starts, sized from the plan: what it fetches, where, and how long ECS waits.

A task fetches the backbone and the experts it runs in process (:meth:`Plan.in_process`), not the
whole package: a DeepSeek-V3 package is about 2.4 TiB in fp32, its backbone and in-process
experts a small part of it. Experts it needs only when a function fails come on demand into a
cache bounded by ``fallback_cache_bytes`` (least recently used out first). Both live on the
instance's volume (a host path mounted into the task), so a task replaced on the same instance
resumes from what is there; checksums decide what is kept.

The start-up time is an estimate from stated rates (below), used for ECS's health-check grace
and the container health check's retries; nothing else depends on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aws_cdk import Duration

from moeless.planning.instances import CATALOGUE
from moeless_cdk.config import DeployConfig, DeployConfigError

CACHE_VOLUME = "moeless-cache"
GIB = 2**30
# the AL2023 ECS GPU AMI's root snapshot and the system's own files
SYSTEM_GIB = 30
# the backbone image (CUDA 12.8 runtime with cuDNN, torch for CUDA 12.8): its compressed layers
# as pulled plus the unpacked copy, with room for the next version beside it during a rollout
IMAGE_GIB = 40
# S3 to an EC2 instance in-region through the gateway endpoint, boto3's default multipart
# download (10 threads): an assumption on the low side of what such transfers reach; re-check
# on a deployment (the container logs each file's time)
S3_FETCH_BYTES_PER_S = 200e6
# weights from local disk into GPU memory: an assumption (NVMe-backed gp3 at its baseline)
LOAD_BYTES_PER_S = 125e6
# pulling the image onto a fresh instance and starting Python: an assumption
BOOT_S = 180
# the service process beyond the weights it holds (Python, torch, CUDA's host side)
PROCESS_OVERHEAD_GIB = 4
# ECS's ranges for a container health check (botocore's ECS model, HealthCheck)
HEALTH_START_PERIOD_MAX_S = 300
HEALTH_INTERVAL_S = (30, 300)
HEALTH_RETRIES = 10


@dataclass(frozen=True)
class Startup:
    """The numbers one plan's backbone task starts with."""

    fetched_bytes: int  # the backbone's files and the in-process experts
    fallback_cache_bytes: int
    expected_start_s: float

    host_path: str = "/var/lib/moeless/cache"
    container_path: str = "/opt/moeless/artifacts"

    @classmethod
    def of(cls, config: DeployConfig) -> Startup:
        """The start of ``config``'s backbone task; refused where the instance's RAM cannot hold
        what the task keeps in memory (its host-tier experts among it)."""
        manifest, plan = config.manifest, config.plan
        backbone = sum(f.bytes for f in manifest.backbone_files())
        in_process = sum(manifest.expert(*pair).bytes for pair in plan.in_process())
        fallback_candidates = sum(e.bytes for e in manifest.experts) - in_process
        cache = min(fallback_candidates, int(config.fallback_cache_gib * GIB))
        fetched = backbone + in_process
        expected = BOOT_S + fetched / S3_FETCH_BYTES_PER_S + backbone / LOAD_BYTES_PER_S
        startup = cls(fetched, cache, expected, host_path=f"/var/lib/moeless/{config.stage}")
        instance = CATALOGUE.get(config.instance_type)
        needed = startup.memory_reservation_mib * 2**20
        if instance is not None and needed > instance.host_memory_bytes:
            raise DeployConfigError(
                f"a backbone task keeps {needed / GIB:,.0f} GiB in memory (the backbone, the plan's "
                f"{len(plan.in_process())} in-process experts, the fallback cache), more than a "
                f"{instance.name}'s {instance.host_memory_gb:g} GiB: plan for a bigger instance, or "
                "a smaller moeless:fallbackCacheGiB"
            )
        return startup

    @property
    def volume_gib(self) -> int:
        """The instance's root volume: system, image, what the task fetches and the fallback cache."""
        return (
            SYSTEM_GIB + IMAGE_GIB + math.ceil((self.fetched_bytes + self.fallback_cache_bytes) * 1.1 / GIB)
        )

    @property
    def memory_reservation_mib(self) -> int:
        """The task's soft memory: the process, its weights while they load, the fallback's sessions."""
        return (PROCESS_OVERHEAD_GIB * GIB + self.fetched_bytes + self.fallback_cache_bytes) // 2**20

    @property
    def health_start_period(self) -> Duration:
        return Duration.seconds(min(HEALTH_START_PERIOD_MAX_S, math.ceil(self.expected_start_s)))

    @property
    def health_interval(self) -> Duration:
        """Long enough that start period + retries x interval covers the expected start twice."""
        low, high = HEALTH_INTERVAL_S
        needed = (2 * self.expected_start_s - HEALTH_START_PERIOD_MAX_S) / HEALTH_RETRIES
        return Duration.seconds(min(high, max(low, math.ceil(needed))))

    @property
    def health_retries(self) -> int:
        return HEALTH_RETRIES

    @property
    def grace(self) -> Duration:
        """How long the service ignores the load balancer's health checks of a new task."""
        return Duration.seconds(max(600, math.ceil(2 * self.expected_start_s)))
