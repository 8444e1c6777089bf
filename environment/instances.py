"""EC2 instance types the environment spec accepts, and the facts derived from them.

Figures are from AWS's public instance-type pages (GPU count, GPU model and memory, vCPU, memory,
maximum EFA interfaces). Prices are ESTIMATES of on-demand USD/hour in us-east-1 from public
price tables; they vary by region and over time, so the spec can override them
(``[prices]`` in environment.toml). They are used for cost estimates only, never for decisions.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceType:
    name: str
    vcpus: int
    memory_gib: int
    gpus: int = 0
    gpu_model: str = ""
    gpu_memory_gib: int = 0
    """Memory of ONE GPU."""
    max_efa_interfaces: int = 0
    network_gbps: int = 0
    gpudirect_rdma: bool = False
    """EFA can read/write GPU memory directly (p4d, p5): the pods then set FI_EFA_USE_DEVICE_RDMA=1.
    g5/g6 have no GPUDirect RDMA, so the variable must stay unset there."""
    hourly_usd_estimate: float = 0.0
    max_pods: int = 0
    """The kubelet's pod limit on the EKS AMI: ENIs x (IPv4 per ENI - 1) + 2, as listed in
    awslabs/amazon-eks-ami templates/shared/runtime/eni-max-pods.txt (p5: network card 0 only)."""
    instance_store_gb: int = 0
    """Local NVMe instance store in total (GB, AWS's figure); 0 = none. GPU nodes put it in RAID0
    for images, pod storage and checkpoint staging."""

    @property
    def is_gpu(self) -> bool:
        return self.gpus > 0

    @property
    def gpu_bf16_tflops(self) -> float:
        """Peak dense bf16 tensor TFLOP/s of ONE GPU (for MFU and step-time estimates); 0 on CPU."""
        return GPU_PEAK_BF16_TFLOPS.get(self.gpu_model, 0.0)


# Peak dense (no sparsity) bf16 tensor-core TFLOP/s of ONE device, from NVIDIA's data sheets:
# L4 121 (242 with sparsity); A10G 70 (AWS's A10G runs lower clocks than the A10's 125; the
# 70 figure is the one MosaicML Composer and others use); A100 312; H100 SXM 989 (PCIe 756);
# H200 989; L40S 362. The job gets its GPU's figure from its manifest; benchmarks match a
# torch.cuda.get_device_name() with peak_bf16_tflops().
GPU_PEAK_BF16_TFLOPS: dict[str, float] = {
    "L4": 121.0,
    "L40S": 362.0,
    "A10G": 70.0,
    "A100": 312.0,
    "H100": 989.0,
    "H100 PCIe": 756.0,
    "H200": 989.0,
}


def gpu_model_of(device_name: str) -> str | None:
    """The GPU model (a key of :data:`GPU_PEAK_BF16_TFLOPS`) of a device name like
    ``"NVIDIA L4"`` or ``"L4"``; None if unknown (CPU).

    Whole words are matched, so ``"NVIDIA L40S"`` is not an L4; the longest match wins.
    """
    words = device_name.replace("-", " ").upper().split()
    best: tuple[int, str] | None = None
    for key in GPU_PEAK_BF16_TFLOPS:
        key_words = key.upper().split()
        n = len(key_words)
        if any(words[i:i + n] == key_words for i in range(len(words) - n + 1)):
            if best is None or n > best[0]:
                best = (n, key)
    return best[1] if best else None


def peak_bf16_tflops(device_name: str) -> float | None:
    """Peak bf16 TFLOP/s for a device name (:func:`gpu_model_of`); None if unknown (CPU)."""
    model = gpu_model_of(device_name)
    return GPU_PEAK_BF16_TFLOPS[model] if model else None


INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        # GPU types (EFA-capable sizes only: EFA is the point of this project).
        InstanceType(name="g6.12xlarge", vcpus=48, memory_gib=192, gpus=4, gpu_model="L4",
                     gpu_memory_gib=24, max_efa_interfaces=1,
                     network_gbps=40, hourly_usd_estimate=4.60, max_pods=234, instance_store_gb=3760),
        InstanceType(name="g6.48xlarge", vcpus=192, memory_gib=768, gpus=8, gpu_model="L4",
                     gpu_memory_gib=24, max_efa_interfaces=1,
                     network_gbps=100, hourly_usd_estimate=13.35, max_pods=737, instance_store_gb=7520),
        InstanceType(name="g5.12xlarge", vcpus=48, memory_gib=192, gpus=4, gpu_model="A10G",
                     gpu_memory_gib=24, max_efa_interfaces=1,
                     network_gbps=40, hourly_usd_estimate=5.67, max_pods=737, instance_store_gb=3800),
        InstanceType(name="g5.48xlarge", vcpus=192, memory_gib=768, gpus=8, gpu_model="A10G",
                     gpu_memory_gib=24, max_efa_interfaces=1,
                     network_gbps=100, hourly_usd_estimate=16.29, max_pods=345, instance_store_gb=7600),
        InstanceType(name="p4d.24xlarge", vcpus=96, memory_gib=1152, gpus=8, gpu_model="A100",
                     gpu_memory_gib=40, max_efa_interfaces=4,
                     network_gbps=400, gpudirect_rdma=True, hourly_usd_estimate=21.96, max_pods=737, instance_store_gb=8000),
        InstanceType(name="p5.48xlarge", vcpus=192, memory_gib=2048, gpus=8, gpu_model="H100",
                     gpu_memory_gib=80, max_efa_interfaces=32,
                     network_gbps=3200, gpudirect_rdma=True, hourly_usd_estimate=55.04, max_pods=100, instance_store_gb=30720),
        # CPU types for the system node group (operator, Ray head, add-ons).
        InstanceType(name="m7i.xlarge", vcpus=4, memory_gib=16, network_gbps=12,
                     hourly_usd_estimate=0.2016, max_pods=58),
        InstanceType(name="m7i.2xlarge", vcpus=8, memory_gib=32, network_gbps=12,
                     hourly_usd_estimate=0.4032, max_pods=58),
        InstanceType(name="m6i.xlarge", vcpus=4, memory_gib=16, network_gbps=12,
                     hourly_usd_estimate=0.192, max_pods=58),
    )
}


SPOT_PRICE_FRACTION = 0.4
"""ASSUMED, for cost estimates only: a spot node's price as a fraction of its on-demand estimate.
Spot prices move with supply and demand, per type and AZ (the EC2 Spot price history); a run
record labels every spot cost an estimate, and ``[prices]`` overrides the on-demand figure it
is taken from."""


def known_gpu_types() -> list[str]:
    return sorted(n for n, t in INSTANCE_TYPES.items() if t.is_gpu)


def known_cpu_types() -> list[str]:
    return sorted(n for n, t in INSTANCE_TYPES.items() if not t.is_gpu)


def pod_cpu(instance: InstanceType) -> int:
    """Whole CPUs one pod may request on this node, leaving room for the node's own daemons
    (kubelet, containerd, aws-node, kube-proxy, device plugins, the pod-identity agent).

    One sixth (at least 1 vCPU) is held back: on a g6.12xlarge that gives 40 of 48, the figure
    the AWS sample uses.
    """
    return instance.vcpus - max(1, -(-instance.vcpus // 6))


def pod_memory_gib(instance: InstanceType) -> int:
    """GiB one pod may request: one sixth (at least 3 GiB) held back for kube-reserved memory,
    the eviction threshold and the daemons (160 of 192 GiB on a g6.12xlarge, as in the sample)."""
    return instance.memory_gib - max(3, -(-instance.memory_gib // 6))
