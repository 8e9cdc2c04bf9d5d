"""The GPU margin: device memory a rank needs beyond the tensors our peak model counts. NOT measured here.

No machine of this project has a GPU: the terms are named assumptions with their sources (docs/gpu.md, "The GPU
margin"), to be replaced by measurements (torch.cuda.mem_get_info, max_memory_reserved beside
max_memory_allocated) when one runs. `zero-train estimate` and `plan` take the margin off the GPU's memory and
compare our predicted peak with what is left; `--gpu-margin GB` replaces the default by the user's own total.

- cuda_context: the CUDA context, loaded kernels (torch, cuBLAS, NCCL) and driver state, outside the caching
  allocator: shown by nvidia-smi, not by torch.cuda.memory_allocated (PyTorch docs, "CUDA semantics > Memory
  management"); ~300-400 MB with lazy module loading (CUDA >= 11.7, PyTorch's default), over 1 GB without
  (pytorch/pytorch#107667, #109888). 0.5 GB assumed.
- nccl_buffers: NCCL's buffers and connections, cudaMalloc'ed outside the allocator, per communicator and growing
  with the channels (NVIDIA/nccl#986, a maintainer: "linearly tied to the number of channels"); 544-688 MB per
  process group measured on 4 NVLinked A100s (NVIDIA/nccl#964), ~1.6 GB reported for one communicator
  (NVIDIA/nccl#864). 1 GB assumed with more than one rank, none on one.
- allocator_slack: the caching allocator keeps freed blocks and carves requests from 2 MB-aligned segments,
  so reserved memory exceeds the allocated peak and fragmentation can fail a request with memory free (PyTorch
  docs, expandable_segments; the ZeRO paper, section 3.2: out of memory "with over 30% of memory still
  available" in extreme cases; DeepSpeed's contiguous_gradients exists to avoid it). 10% of the GPU's memory
  assumed: accelerate's get_balanced_memory keeps the same 10% "for the buffer to avoid OOM".
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(kw_only=True, slots=True, frozen=True)
class GpuMargin:
    """The default margin's terms (see the module docstring for each source)."""

    cuda_context_bytes: int = int(0.5 * GB)
    """CUDA context and loaded kernels, outside PyTorch's allocator."""
    nccl_bytes: int = int(1 * GB)
    """NCCL's buffers and connections of the data-parallel communicator (more than one rank only)."""
    allocator_fraction: float = 0.10
    """Caching-allocator slack and fragmentation, as a fraction of the GPU's memory."""

    def terms(self, gpu_memory_bytes: float, *, world_size: int) -> dict[str, int]:
        """{term: bytes} kept free on a GPU of `gpu_memory_bytes` (no NCCL buffers on one rank)."""
        return dict(
            cuda_context=self.cuda_context_bytes,
            nccl_buffers=self.nccl_bytes if world_size > 1 else 0,
            allocator_slack=int(self.allocator_fraction * gpu_memory_bytes),
        )


def gpu_margin(
    gpu_memory_bytes: float, *, world_size: int, margin_bytes: float | None = None
) -> dict[str, int]:
    """The margin's terms on one GPU: the user's own total (`margin_bytes`, from --gpu-margin) or GpuMargin's."""
    if margin_bytes is not None:
        return dict(set_by_user=int(margin_bytes))
    return GpuMargin().terms(gpu_memory_bytes, world_size=world_size)


MARGIN_WORDS = {
    "cuda_context": "CUDA context",
    "nccl_buffers": "NCCL buffers",
    "allocator_slack": "allocator slack (10% of the GPU)",
    "set_by_user": "set by --gpu-margin",
}
"""How the estimate and the plan name each term."""


def margin_line(terms: dict[str, int], gpu_memory_bytes: float) -> str:
    """One line: the margin, its terms, what is left of the GPU, and how to change it."""
    words = ", ".join(f"{MARGIN_WORDS[name]} {value / GB:.2g}" for name, value in terms.items() if value)
    total = sum(terms.values())
    return (f"GPU margin {total / GB:.3g} GB ({words or 'none'}; assumed, NOT measured on this hardware: "
            f"--gpu-margin GB sets your own): {(gpu_memory_bytes - total) / GB:.3g} of {gpu_memory_bytes / GB:g} "
            "GB usable per GPU")  # fmt: skip
