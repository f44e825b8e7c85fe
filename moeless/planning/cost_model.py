"""One model of what an expert costs and how long it takes, used by the planner and the simulator.

Every constant says where it comes from: a benchmark of this project (command and figure), a
fact in docs/design.md, or a stated price or assumption with its date. ``CostModel.sources()`` lists
them for reports.

Expert time on ``v`` vCPUs for ``n`` tokens (SwiGLU expert, fp32): it either streams its weights
from memory or is bound by arithmetic, whichever is slower:

    t(n) = max(weight_bytes / (v * mem_gbps), 6 * H * I * n / (v * gflops))

Calibrated with ``benchmarks/expert_runtime.py`` (2 threads, onnxruntime fp32): 4096 x 14336 took
21.8 ms at 1 token (705 MB -> 32 GB/s, 16 per vCPU) and 140.8 ms at 64 tokens (22.5 GFLOP ->
160 GFLOP/s, 80 per vCPU); checked against 1024 x 2816 at 8 tokens: model 1.08 ms, measured 1.12.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from moeless.aws_prices import MB_PER_GB, PRICES, LambdaPrices, vcpus_for_memory
from moeless.contracts.environment import EXPERT_TIMEOUT_S
from moeless.errors import PlanError
from moeless.planning.instances import CATALOGUE, Instance

# benchmarks/sim_vs_real.py's calibration on this project's 2-core machine (shared with other
# work; mean of its before and after calibrations, one run): in the running service, a warm MoE
# layer of n invokes took 3.1 + 5.3 x (n - 1) ms with a lognormal spread of 0.23; 8 cold starts at
# once ended 184 ms apart
INVOKE_SERIAL_MS_LOCAL = 5.3
COLD_START_SERIAL_MS_LOCAL = 184.0
INVOKE_SPREAD_LOCAL = 0.23

# Lambda memory sizes the planner chooses from: 1..6 full vCPUs (1,769 MB per vCPU).
MEMORY_OPTIONS_MB = (1769, 3538, 5307, 7076, 8845, 10240)


@dataclass(frozen=True)
class ExpertDtype:
    """How an exported expert's dtype changes a function: bytes per parameter in its ONNX file (cold
    start, payload of the image), in memory once loaded (the memory-bound time and the function's
    size), and its CPU speed relative to fp32."""

    file_bytes: float
    memory_bytes: float
    compute_speedup: float


# benchmarks/expert_runtime.py (README, 2 cores, onnxruntime): fp16 stores half-size weights but
# computes in fp32 on CPU (24.3 vs 21.8 ms at 1 token, 132.8 vs 140.8 ms at 64); int8 (dynamic
# quantisation, per-channel) runs 4.2x faster than fp32 (33.5 vs 140.8 ms at 64 tokens, 235 vs 996
# at 512) at a quarter of the bytes.
EXPERT_DTYPES = {
    "fp32": ExpertDtype(4.0, 4.0, 1.0),
    "fp16": ExpertDtype(2.0, 4.0, 1.0),
    "int8": ExpertDtype(1.0, 1.0, 4.2),
}


@dataclass(frozen=True)
class ExpertShape:
    """One routed expert's sizes: what its compute time, memory and cold start follow from."""

    hidden: int
    intermediate: int
    weight_bytes: float


@dataclass(frozen=True)
class CostModel:
    """Latency and price inputs of the planner and the simulator."""

    mem_gbps_per_vcpu: float = 16.0
    gflops_per_vcpu: float = 80.0
    # warm invoke overhead, p50: local host measured (benchmarks/invoke_overhead.py, 8 x 1024 via boto3);
    # AWS: an assumption for an in-region synchronous invoke of a warm function (re-check on a deployment)
    invoke_overhead_ms_local: float = 2.7
    invoke_overhead_ms_aws: float = 15.0
    # payload transfer, per MB of base64 request + reply: local from benchmarks/invoke_overhead.py
    # (boto3 overhead 2.36 ms at 1 x 1024, 6.14 at 64 x 1024 (0.70 MB both ways); 2.3 at 1 x 4096,
    # 17.6 at 64 x 4096 (2.8 MB): 5.4-5.5 ms per MB); AWS an assumption (~100 MB/s each way for a
    # synchronous invoke in-region, re-check on a deployment)
    invoke_ms_per_mb_local: float = 5.5
    invoke_ms_per_mb_aws: float = 10.0
    # the part of each invoke that invokes issued together do one after another: locally the boto3
    # client, the host's HTTP servers and the service share one interpreter and 2 cores, so the k-th
    # invoke of a layer leaves k x this later (benchmarks/sim_vs_real.py: a warm layer of n invokes
    # of the tiny Mixtral's experts takes a + s x (n - 1), s = INVOKE_SERIAL_MS_LOCAL); on AWS the
    # client's threads overlap the network waits: an assumption (boto3's ~1 ms of Python per
    # call is not modelled)
    invoke_serial_ms_local: float = INVOKE_SERIAL_MS_LOCAL
    invoke_serial_ms_aws: float = 0.0
    # the spread (sigma of a lognormal factor on a layer's invoke overheads) that the machine's
    # momentary load gives: locally measured by benchmarks/sim_vs_real.py; AWS: none modelled
    invoke_spread_local: float = INVOKE_SPREAD_LOCAL
    invoke_spread_aws: float = 0.0
    # cold start = process start + session init; local process start measured 125-143 ms and session init
    # ~6.9 ms per MB of ONNX (4,896 ms for 705 MB) by benchmarks/invoke_overhead.py; AWS container images
    # take 1-10 s (docs/design.md): 1 s base is the optimistic end
    cold_start_base_ms: float = 1000.0
    cold_start_ms_per_mb: float = 6.9
    # on AWS a function fetches its experts from S3 at init (moeless:expertCode=s3; the local host
    # reads them from the package folder): 150 MB/s, an assumption (boto3's multipart download in a
    # Lambda environment; AWS publishes no figure), re-check on a deployment
    s3_fetch_ms_per_mb_aws: float = 6.7
    # how long a cold start may take: the invoke that waits for it runs under the function's
    # timeout, less room for the invoke itself (an on-demand init beyond Lambda's 10 s goes on into
    # that invoke: see moeless/experts/function.py); provisioned environments have 130 s or more
    max_cold_start_ms: float = EXPERT_TIMEOUT_S * 1e3 - 10_000
    # each cold start still initialising when another begins delays that one by this: locally the
    # instances' processes share the machine's 2 cores (benchmarks/sim_vs_real.py: 8 cold starts
    # at once end about 7 x this after one alone); on AWS each sandbox has its own CPU
    cold_start_serial_ms_local: float = COLD_START_SERIAL_MS_LOCAL
    cold_start_serial_ms_aws: float = 0.0
    # seconds from asking for more provisioned concurrency until it serves: AWS documents no
    # figure ("it can take a few minutes"): an assumption
    provisioning_delay_s: float = 120.0
    # resident set of an expert function beyond its weights (python, numpy, onnxruntime): an estimate
    runtime_overhead_mb: int = 400
    # in-process expert time on the backbone's GPU relative to one Lambda vCPU: an assumption
    gpu_speedup: float = 50.0
    gpu: Instance = field(default_factory=lambda: CATALOGUE["g5.xlarge"])  # the backbone's GPU
    prices: LambdaPrices = PRICES
    aws: bool = True

    @property
    def invoke_overhead_ms(self) -> float:
        return self.invoke_overhead_ms_aws if self.aws else self.invoke_overhead_ms_local

    @property
    def cold_start_serial_ms(self) -> float:
        """How much each cold start already initialising delays a new one (see ``..._local``)."""
        return self.cold_start_serial_ms_aws if self.aws else self.cold_start_serial_ms_local

    @property
    def invoke_spread(self) -> float:
        """Sigma of the lognormal load factor on a layer's invoke overheads (see ``..._local``)."""
        return self.invoke_spread_aws if self.aws else self.invoke_spread_local

    @property
    def invoke_serial_ms(self) -> float:
        """How much later each further invoke of one layer leaves (see ``invoke_serial_ms_local``)."""
        return self.invoke_serial_ms_aws if self.aws else self.invoke_serial_ms_local

    def invoke_ms(self, tokens: int, hidden: int) -> float:
        """Overhead and payload transfer of one invoke carrying ``tokens`` float32 rows both ways."""
        megabytes = 2 * tokens * 4 * -(-hidden * 4 // 3) / 1e6
        per_mb = self.invoke_ms_per_mb_aws if self.aws else self.invoke_ms_per_mb_local
        return self.invoke_overhead_ms + per_mb * megabytes

    def expert_ms(
        self, tokens: float, hidden: int, intermediate: int, vcpus: float, weight_bytes: float
    ) -> float:
        """Compute time of one expert call on ``vcpus`` (0 tokens: no call, 0 ms)."""
        if tokens <= 0:
            return 0.0
        memory_ms = weight_bytes / (vcpus * self.mem_gbps_per_vcpu * 1e9) * 1e3
        compute_ms = 6.0 * hidden * intermediate * tokens / (vcpus * self.gflops_per_vcpu * 1e9) * 1e3
        return max(memory_ms, compute_ms)

    def backbone_expert_ms(self, tokens: float, hidden: int, intermediate: int, weight_bytes: float) -> float:
        return self.expert_ms(tokens, hidden, intermediate, self.gpu_speedup, weight_bytes)

    def function_memory_mb(self, weight_bytes: float) -> int:
        """Smallest full-vCPU size that holds the weights and the runtime."""
        needed = weight_bytes / 2**20 + self.runtime_overhead_mb
        for option in MEMORY_OPTIONS_MB:
            if option >= needed:
                return option
        raise PlanError(
            f"{needed:.0f} MB of experts and runtime do not fit one Lambda function (10,240 MB at most): "
            "host fewer experts per function (more --workers)"
        )

    def cold_start_ms(self, weight_bytes: float) -> float:
        """Start, fetch (on AWS) and load ``weight_bytes`` of experts."""
        fetch = self.s3_fetch_ms_per_mb_aws if self.aws else 0.0
        return self.cold_start_base_ms + (self.cold_start_ms_per_mb + fetch) * weight_bytes / 1e6

    def too_slow_to_load(self, weight_bytes: float) -> str | None:
        """Why a function of ``weight_bytes`` of experts cannot cold-start in time, else ``None``."""
        init_ms = self.cold_start_ms(weight_bytes)
        if init_ms <= self.max_cold_start_ms:
            return None
        return (
            f"{weight_bytes / 2**20:,.0f} MB of experts take {init_ms / 1e3:.0f} s to fetch and load at a "
            f"cold start, beyond the {self.max_cold_start_ms / 1e3:.0f} s it may take (the functions' "
            f"{EXPERT_TIMEOUT_S} s timeout, less the invoke): host fewer experts per function"
        )

    def invoke_usd(self, duration_ms: float, memory_mb: int, provisioned: bool = False) -> float:
        """One invoke: the request plus its billed duration."""
        return self.prices.per_request + self.duration_usd(duration_ms, memory_mb, provisioned)

    def duration_usd(self, duration_ms: float, memory_mb: int, provisioned: bool = False) -> float:
        """Lambda's duration charge of one invoke (or init): rounded up to the billing step, at the
        on-demand or, on a provisioned environment, the provisioned duration price."""
        prices = self.prices
        rate = prices.provisioned_duration_per_gb_second if provisioned else prices.per_gb_second
        step = prices.duration_step_ms  # billed_ms and gb_seconds, inline: the simulator bills each invoke
        return math.ceil(duration_ms / step) * step / 1e3 * memory_mb / MB_PER_GB * rate

    def provisioned_usd_per_s(self, memory_mb: int, concurrency: int) -> float:
        return concurrency * memory_mb / 1024 * self.prices.provisioned_per_gb_second

    def gpu_usd_per_gb_s(self) -> float:
        """The backbone GPU's price per GB of its memory per second (what a resident expert occupies)."""
        return self.gpu.hourly_usd / 3600 / self.gpu.gpu_memory_gb

    def vcpus(self, memory_mb: int) -> int:
        return vcpus_for_memory(memory_mb)

    def sources(self) -> list[str]:
        return [
            "expert compute: benchmarks/expert_runtime.py (4096x14336 fp32: 21.8 ms @1 token, "
            "140.8 ms @64 tokens on 2 threads) -> 16 GB/s and 80 GFLOP/s per vCPU",
            f"warm invoke overhead: {self.invoke_overhead_ms_local} ms local "
            f"(benchmarks/invoke_overhead.py), {self.invoke_overhead_ms_aws} ms on AWS (assumption)",
            f"invokes issued together leave {self.invoke_serial_ms_local} ms apart locally "
            f"(benchmarks/sim_vs_real.py), {self.invoke_serial_ms_aws} ms on AWS (assumption)",
            f"spread of a layer's invoke overheads (lognormal sigma): {self.invoke_spread_local} locally "
            f"(benchmarks/sim_vs_real.py), {self.invoke_spread_aws} on AWS (not modelled)",
            f"cold start: {self.cold_start_base_ms:.0f} ms + {self.cold_start_ms_per_mb} ms/MB "
            "(docs/design.md: 1-10 s for ML images; per-MB session init from benchmarks/invoke_overhead.py)"
            f", + {self.s3_fetch_ms_per_mb_aws} ms/MB fetched from S3 on AWS (assumption: 150 MB/s); "
            f"at most {self.max_cold_start_ms / 1e3:.0f} s (the functions' {EXPERT_TIMEOUT_S} s timeout)",
            f"concurrent cold starts: each one initialising delays another by "
            f"{self.cold_start_serial_ms_local:.0f} ms locally (benchmarks/sim_vs_real.py), "
            f"{self.cold_start_serial_ms_aws:.0f} ms on AWS (separate sandboxes)",
            "Lambda: 1,769 MB = 1 vCPU, up to 6 vCPUs at 10,240 MB (docs/design.md)",
            f"prices: {self.prices.source}",
            f"backbone GPU: {self.gpu.name} ({self.gpu.gpus}x {self.gpu.gpu}), ${self.gpu.hourly_usd}/h, "
            f"{self.gpu.gpu_memory_gb:g} GB ({self.gpu.source})",
            f"in-process expert on the GPU: {self.gpu_speedup}x one vCPU (assumption)",
        ]


def steps_with_expert(share: float, selections_per_step: float) -> float:
    """Probability that an expert with routing ``share`` is picked in a step of ``selections_per_step``."""
    return 1.0 - math.pow(max(0.0, 1.0 - share), max(0.0, selections_per_step))
