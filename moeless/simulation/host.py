"""How long the backbone host's CPUs take for a step's host-tier experts.

A host expert lives in the backbone host's RAM and runs there (onnxruntime on its vCPUs, what
``serve`` does for the plan's in-process experts), with no invoke. One MoE layer of a step reads
each of its distinct host experts' weights once and computes every row routed to them; the
experts share the host's memory bandwidth and its cores, so the layer takes the slower of the two:

    t = calls x call_overhead_ms + max(bytes / memory_gbps, flops / (vcpus x gflops_per_vcpu))

``gflops_per_vcpu`` is the per-vCPU figure measured on this project's machine for Lambda
(:class:`~moeless.planning.cost_model.CostModel`, ``benchmarks/expert_runtime.py``): the same
onnxruntime kernels on a server's cores. ``memory_gbps`` is the host's usable bandwidth
(:mod:`moeless.planning.instances`). ``call_overhead_ms`` is what each expert call costs beyond
its arithmetic (the session's run, the dispatcher's hand-off): measured by
``benchmarks/sim_vs_real.py``; it is what dominates a tiny model's experts.
"""

from __future__ import annotations

from dataclasses import dataclass

# measured on this project's 2-core machine: ``OnnxExpertPool.run`` of the tiny Mixtral's experts
# (128 x 256, fp32) took 0.042-0.053 ms per expert at 1-8 rows, 0.168 at 64 (where the model's
# 80 GFLOP/s per vCPU gives 0.157 of arithmetic); benchmarks/sim_vs_real.py measures it again in
# the service, where the dispatcher's hand-off to its threads adds to it
HOST_CALL_OVERHEAD_MS = 0.05


@dataclass(frozen=True)
class HostModel:
    """The backbone host's side of a step: its vCPUs, its usable memory bandwidth, the per-vCPU
    arithmetic rate and the per-call overhead of an in-process expert."""

    vcpus: int
    memory_gbps: float
    gflops_per_vcpu: float
    call_overhead_ms: float = HOST_CALL_OVERHEAD_MS
    compute_speedup: float = 1.0  # the expert dtype's CPU speed relative to fp32

    def layer_ms(self, experts: int, expert_bytes: float, flops: float) -> float:
        """One layer's ``experts`` distinct host experts, each read once, computing ``flops``."""
        if experts <= 0:
            return 0.0
        memory_s = experts * expert_bytes / (self.memory_gbps * 1e9)
        compute_s = flops / (self.vcpus * self.gflops_per_vcpu * 1e9 * self.compute_speedup)
        return experts * self.call_overhead_ms + 1e3 * max(memory_s, compute_s)

    def describe(self) -> str:
        return (
            f"host experts: {self.vcpus} vCPUs x {self.gflops_per_vcpu:g} GFLOP/s, "
            f"{self.memory_gbps:g} GB/s, {self.call_overhead_ms:g} ms per expert call"
        )
