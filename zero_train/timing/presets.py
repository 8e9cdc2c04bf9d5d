"""Machines as data: GPUs and links, each figure from the vendor's datasheet (docs/steptime.md#presets).

A GPU's figures are the dense peaks (no structured sparsity): matmul TFLOPS per training dtype (fp32 without
TF32, as PyTorch's default float32 matmul precision "highest" runs it), memory bandwidth and size, and the links
its servers usually have. A link is one direction's peak per GPU; collectives get LINK_EFFICIENCY of it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuPreset:
    """One GPU model's datasheet figures."""

    name: str
    label: str
    tflops: dict[str, float]
    """Dense peak TFLOPS per precision ("fp32", "bf16", "fp16")."""
    memory_gbps: float
    """HBM/GDDR bandwidth, GB/s."""
    memory_gb: float
    intra_link: str
    """The link between GPUs of one server (a LINKS key)."""
    inter_link: str
    """The network between servers, per GPU (a LINKS key)."""
    host_link: str
    """GPU <-> host (a LINKS key): offload's copies."""
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkPreset:
    """One link's peak, one direction, per GPU."""

    name: str
    label: str
    gbps: float
    """GB/s (bytes), one direction, per GPU."""
    source: str


_NVIDIA = "https://www.nvidia.com/"
# GPUS and LINKS are data: one entry per datasheet, each with its source; the entries share a shape, not logic.
GPUS: dict[str, GpuPreset] = {
    gpu.name: gpu
    for gpu in (
        GpuPreset(
            name="h100-sxm",
            label="NVIDIA H100 SXM5 80 GB",
            tflops={"fp32": 66.9, "bf16": 989.4, "fp16": 989.4},
            memory_gbps=3350,
            memory_gb=80,
            intra_link="nvlink4",
            inter_link="ib-ndr400",
            host_link="pcie5",
            source=_NVIDIA + "en-us/data-center/h100/ (H100 datasheet: SXM column, dense = half the "
            "sparsity figures 1,979 BF16)",
        ),
        GpuPreset(
            name="h100-pcie",
            label="NVIDIA H100 PCIe 80 GB",
            tflops={"fp32": 51.2, "bf16": 756.5, "fp16": 756.5},
            memory_gbps=2000,
            memory_gb=80,
            intra_link="pcie5",
            inter_link="ib-ndr400",
            host_link="pcie5",
            source=_NVIDIA + "en-us/data-center/h100/ (H100 datasheet: PCIe column, 1,513 BF16 with "
            "sparsity)",
        ),
        GpuPreset(
            name="h200",
            label="NVIDIA H200 SXM 141 GB",
            tflops={"fp32": 66.9, "bf16": 989.4, "fp16": 989.4},
            memory_gbps=4800,
            memory_gb=141,
            intra_link="nvlink4",
            inter_link="ib-ndr400",
            host_link="pcie5",
            source=_NVIDIA + "en-us/data-center/h200/ (H200 datasheet: SXM column, 1,979 BF16 with sparsity)",
        ),
        GpuPreset(
            name="a100-80",
            label="NVIDIA A100 SXM4 80 GB",
            tflops={"fp32": 19.5, "bf16": 312, "fp16": 312},
            memory_gbps=2039,
            memory_gb=80,
            intra_link="nvlink3",
            inter_link="ib-hdr200",
            host_link="pcie4",
            source=_NVIDIA + "en-us/data-center/a100/ (A100 datasheet: 80GB SXM column)",
        ),
        GpuPreset(
            name="a100-40",
            label="NVIDIA A100 SXM4 40 GB",
            tflops={"fp32": 19.5, "bf16": 312, "fp16": 312},
            memory_gbps=1555,
            memory_gb=40,
            intra_link="nvlink3",
            inter_link="ib-hdr200",
            host_link="pcie4",
            source=_NVIDIA + "en-us/data-center/a100/ (A100 datasheet: 40GB SXM column)",
        ),
        GpuPreset(
            name="l40s",
            label="NVIDIA L40S 48 GB",
            tflops={"fp32": 91.6, "bf16": 362.05, "fp16": 362.05},
            memory_gbps=864,
            memory_gb=48,
            intra_link="pcie4",
            inter_link="roce-100",
            host_link="pcie4",
            source=_NVIDIA + "en-us/data-center/l40s/ (L40S datasheet: 733 BF16 with sparsity)",
        ),
        GpuPreset(
            name="rtx-4090",
            label="NVIDIA GeForce RTX 4090 24 GB",
            tflops={"fp32": 82.6, "bf16": 165.2, "fp16": 165.2},
            memory_gbps=1008,
            memory_gb=24,
            intra_link="pcie4",
            inter_link="roce-100",
            host_link="pcie4",
            source="NVIDIA Ada GPU Architecture whitepaper v2.1, appendix table 2 (RTX 4090: 165.2 FP16/BF16 "
            "tensor TFLOPS with FP32 accumulate, 82.6 FP32, 1,008 GB/s)",
        ),
    )
}
"""Every GPU preset, `--gpu NAME`."""

LINKS: dict[str, LinkPreset] = {
    link.name: link
    for link in (
        LinkPreset(
            name="nvlink4",
            label="NVLink 4 (NVSwitch)",
            gbps=450,
            source=_NVIDIA + "en-us/data-center/nvlink/ (900 GB/s total per H100 GPU, both directions)",
        ),
        LinkPreset(
            name="nvlink3",
            label="NVLink 3 (NVSwitch)",
            gbps=300,
            source=_NVIDIA + "en-us/data-center/nvlink/ (600 GB/s total per A100 GPU, both directions)",
        ),
        LinkPreset(
            name="pcie5",
            label="PCIe 5.0 x16",
            gbps=64,
            source="PCI-SIG PCIe 5.0 base specification: 32 GT/s x 16 lanes, 128b/130b (63 GB/s per direction)",
        ),
        LinkPreset(
            name="pcie4",
            label="PCIe 4.0 x16",
            gbps=32,
            source="PCI-SIG PCIe 4.0 base specification: 16 GT/s x 16 lanes, 128b/130b (31.5 GB/s per direction)",
        ),
        LinkPreset(
            name="ib-ndr400",
            label="InfiniBand NDR 400 Gb/s per GPU",
            gbps=50,
            source=_NVIDIA + "en-us/networking/infiniband-adapters/ (ConnectX-7: 400 Gb/s per port)",
        ),
        LinkPreset(
            name="ib-hdr200",
            label="InfiniBand HDR 200 Gb/s per GPU",
            gbps=25,
            source=_NVIDIA + "en-us/networking/infiniband-adapters/ (ConnectX-6: 200 Gb/s per port)",
        ),
        LinkPreset(
            name="roce-400",
            label="RoCE 400 GbE per GPU",
            gbps=50,
            source="IEEE 802.3bs / 802.3df: 400 Gb/s Ethernet (ConnectX-7 in Ethernet mode)",
        ),
        LinkPreset(
            name="roce-200", label="RoCE 200 GbE per GPU", gbps=25, source="IEEE 802.3bs: 200 Gb/s Ethernet"
        ),
        LinkPreset(
            name="roce-100", label="RoCE 100 GbE per GPU", gbps=12.5, source="IEEE 802.3ba: 100 Gb/s Ethernet"
        ),
        LinkPreset(
            name="eth-25",
            label="Ethernet 25 GbE per node",
            gbps=3.125,
            source="IEEE 802.3by: 25 Gb/s Ethernet",
        ),
    )
}
"""Every link preset (--intra-node-gbps / --inter-node-gbps override the GB/s)."""
