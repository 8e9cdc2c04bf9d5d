"""GPU headroom: device memory a rank needs beyond the tensors our peak model counts. NOT measured here.

No machine of this project has a GPU: these are named assumptions with their sources, to be replaced by
measurements (torch.cuda.mem_get_info / max_memory_reserved beside max_memory_allocated, issue 20) when one runs.
An estimate against a GPU's capacity subtracts them and says so.

- cuda_context: the CUDA context, loaded kernels (torch, cuBLAS, cuDNN, NCCL) and driver state, outside the
  caching allocator: invisible to torch.cuda.memory_allocated/memory_reserved, visible in nvidia-smi
  (PyTorch docs, "CUDA semantics > Memory management": unused cached memory and the context both show there).
  With lazy module loading (CUDA_MODULE_LOADING=LAZY, CUDA >= 11.7, PyTorch's default) it is commonly
  reported at a few hundred MB to ~1 GB depending on GPU, driver and libraries: 0.5 GB assumed.
- allocator_reserve: the caching allocator keeps freed blocks for reuse and rounds requests (to 512 bytes;
  large ones come from 2 MB-aligned segments, split and fragmented): memory_reserved exceeds the allocated
  peak. 10% of the predicted peak assumed; `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` lowers it.
- nccl_buffers: NCCL's per-peer staging buffers, allocated with cudaMalloc outside the allocator: NCCL_BUFFSIZE
  (default 4 MiB, NCCL docs "Environment Variables") per channel, for send and receive, for each ring/tree
  neighbour: 2 neighbours x 2 directions x 16 channels x 4 MiB = 256 MiB assumed (more channels on NVSwitch
  systems; NCCL_MAX_NCHANNELS and NCCL_BUFFSIZE change it).
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
MIB = 1 << 20


@dataclass(kw_only=True, slots=True, frozen=True)
class GpuHeadroom:
    """The assumed headroom terms of one GPU rank (see the module docstring for each source)."""

    cuda_context_bytes: int = int(0.5 * GB)
    """CUDA context and loaded kernels, outside PyTorch's allocator."""
    allocator_reserve_fraction: float = 0.10
    """Caching-allocator reserve and fragmentation, as a fraction of the allocated peak."""
    nccl_buffer_bytes: int = 2 * 2 * 16 * 4 * MIB
    """NCCL's staging buffers (NCCL_BUFFSIZE per channel, direction and neighbour)."""

    def terms(self, peak_bytes: int, *, world_size: int) -> dict[str, int]:
        """{term: bytes} beside a predicted allocated peak of `peak_bytes` (no NCCL buffers on one rank)."""
        return dict(
            cuda_context=self.cuda_context_bytes,
            allocator_reserve=int(self.allocator_reserve_fraction * peak_bytes),
            nccl_buffers=self.nccl_buffer_bytes if world_size > 1 else 0,
        )


HEADROOM_WORDS = {
    "cuda_context": "CUDA context (assumed 0.5 GB)",
    "allocator_reserve": "caching allocator's reserve (assumed 10% of the peak)",
    "nccl_buffers": "NCCL buffers (assumed 256 MiB)",
}
"""How the estimate names each term."""
