"""How long the GPU side of a step takes: a stated roofline, not a constant.

A kernel either streams its bytes from HBM or is bound by arithmetic, whichever is slower:

    t = max(bytes / (hbm_gbps * memory_efficiency), flops / (tflops * compute_efficiency)) + overhead

per transformer block of one step of the continuous batch. Bytes are the block's dense weights
(its share of ``dense_params``), the KV cache its sequences attend over, and for a GPU that holds
experts, the experts the step touched; FLOPs are 2 per parameter per token plus attention over
the context. Tensor parallelism inside an instance adds up its GPUs' bandwidth and FLOPs; a fleet
of several instances runs the layers as a pipeline, so one step still crosses every instance in
turn (latency at one instance's figures) while ``count`` steps are in flight at once.

The efficiencies are assumptions (stated in every report): 80% of peak HBM bandwidth is what
large decode GEMVs reach on H100-class parts, 50% of peak tensor FLOPs what prefill GEMMs of
inference engines reach; the per-block overhead covers kernel launches of an eager engine.
"""

from __future__ import annotations

from dataclasses import dataclass

MEMORY_EFFICIENCY = 0.8
COMPUTE_EFFICIENCY = 0.5
BLOCK_OVERHEAD_MS = 0.02


@dataclass(frozen=True)
class Roofline:
    """One step loop's hardware: what a block of a step costs on it."""

    hbm_gbps: float
    tflops: float
    memory_efficiency: float = MEMORY_EFFICIENCY
    compute_efficiency: float = COMPUTE_EFFICIENCY
    block_overhead_ms: float = BLOCK_OVERHEAD_MS

    def ms(self, bytes_moved: float, flops: float) -> float:
        """Time of a kernel that moves ``bytes_moved`` and computes ``flops`` (no overhead)."""
        memory = bytes_moved / (self.hbm_gbps * 1e9 * self.memory_efficiency)
        compute = flops / (self.tflops * 1e12 * self.compute_efficiency)
        return 1e3 * max(memory, compute)

    def describe(self) -> str:
        return (
            f"roofline: {self.hbm_gbps:g} GB/s x {self.memory_efficiency:g}, "
            f"{self.tflops:g} TFLOP/s x {self.compute_efficiency:g}, "
            f"{self.block_overhead_ms:g} ms per block"
        )


@dataclass(frozen=True)
class Hardware:
    """What runs the backbone (or the whole model): its price, its roofline and its step loops."""

    label: str  # "1x p5.48xlarge"
    hourly_usd: float
    roofline: Roofline
    loops: int = 1  # steps in flight at once (pipeline stages of a multi-instance fleet)
