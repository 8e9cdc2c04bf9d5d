"""The GPU margin: device memory a rank needs beyond the tensors our peak model counts, by rules from published
measurements (docs/gpu.md, "The GPU margin", has each source and number). NOT measured by this project yet:
`GpuMargin.terms` names each term so that a GPU run can print measured beside assumed (the run record's `cuda`
entry, scripts/gpu_check.sh). `--gpu-margin GB` replaces all of it by the user's own total.

- cuda_context: the CUDA context and the kernels loaded into it, outside PyTorch's allocator: 0.43 GB with lazy
  module loading (PyTorch's default since CUDA 11.7; 426 MiB measured on an RTX 6000 Ada with CUDA 13, 287 MB
  and ~300-400 MB reported by PyTorch's maintainers), 0.67 GB with CUDA_MODULE_LOADING=EAGER (666,632,192 bytes
  measured where the lazy load took 287,047,680).
- nccl_buffers: per communicator, NCCL's fixed part (its kernels and work queues, 0.40 GB: a 2-GPU group measured
  544 MB, a 4-GPU one 688 MB on NVLinked A100s) plus one buffer per channel per connected peer (2 MiB-rounded sum
  of the Simple protocol's NCCL_BUFFSIZE, 4 MiB by default, LL128's 4.69 MiB and LL's 0.5 MiB: the 10 MiB
  allocations per channel and peer logged on H100s); a ring and a chain tree connect each rank to 1 peer at 2
  ranks, 2 beyond, at any scale; NCCL_MAX_NCHANNELS caps the channels (32 assumed: what H100s open).
- allocator_slack: the caching allocator's reserved-but-unallocated memory, which comes from memory that is
  freed and allocated again in other sizes within a step (activations, logits, gathered parameters, buckets:
  every term of the peak that is not a model state): 50% of those bytes by default, 5% with
  PYTORCH_CUDA_ALLOC_CONF expandable_segments:True, plus one 20 MiB large-block segment (the allocator's
  kLargeBuffer) partly used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

GB = 1e9
MiB = 2**20
STATE_TERMS = ("params", "grads", "master_params", "optimizer_states", "accumulated_grads")
"""The peak's terms that live across steps (allocated once, never churned): no fragmentation from them."""
LL128_BUFFER_BYTES = (
    4_915_200  # NCCL's DEFAULT_LL128_BUFFSIZE: 120 elements x 640 threads x 8 steps x 8 bytes
)
LL_BUFFER_BYTES = 524_288  # NCCL's DEFAULT_LL_BUFFSIZE: 8 lines x 512 threads x 8 steps x 16 bytes
SIMPLE_BUFFER_BYTES = 4 * MiB  # NCCL_BUFFSIZE's default


@dataclass(kw_only=True, slots=True, frozen=True)
class GpuMargin:
    """The rules' constants (see the module docstring for each source); `terms` applies them."""

    lazy_context_bytes: int = int(0.45 * GB)
    """CUDA context with lazy module loading (PyTorch's default)."""
    eager_context_bytes: int = int(0.67 * GB)
    """CUDA context with CUDA_MODULE_LOADING=EAGER."""
    nccl_fixed_bytes: int = int(0.40 * GB)
    """NCCL's part of a communicator that does not scale with channels or peers."""
    nccl_channels: int = 32
    """Channels a communicator opens (NCCL_MAX_NCHANNELS caps it)."""
    slack_fraction: float = 0.5
    """Reserved-but-unallocated bytes per byte churned within a step (transient terms), default allocator."""
    expandable_slack_fraction: float = 0.05
    """The same with expandable_segments:True."""
    segment_bytes: int = 20 * MiB
    """One large-block segment of the caching allocator (kLargeBuffer)."""

    def terms(self, *, world_size: int, transient_bytes: int = 0, environ=None) -> dict[str, int]:
        """{term: bytes} kept free on one GPU beyond the allocated peak.

        Args:
            world_size: ranks of the data-parallel communicator (no NCCL buffers on one).
            transient_bytes: the peak's bytes that are freed and allocated again within a step (`transient`).
            environ: the environment read for CUDA_MODULE_LOADING, NCCL_BUFFSIZE, NCCL_MAX_NCHANNELS and
                PYTORCH_CUDA_ALLOC_CONF (default os.environ: the set-up runs with this process's settings).
        """
        env = os.environ if environ is None else environ
        eager = env.get("CUDA_MODULE_LOADING", "LAZY").upper() == "EAGER"
        return dict(
            cuda_context=self.eager_context_bytes if eager else self.lazy_context_bytes,
            nccl_buffers=self.nccl_bytes(world_size, env),
            allocator_slack=self.slack_bytes(transient_bytes, env),
        )

    def nccl_bytes(self, world_size: int, env) -> int:
        """One communicator's buffers: the fixed part + channels x peers x one connection's buffers."""
        if world_size <= 1:
            return 0
        simple = int(env.get("NCCL_BUFFSIZE", SIMPLE_BUFFER_BYTES))
        connection = -(-(simple + LL128_BUFFER_BYTES + LL_BUFFER_BYTES) // (2 * MiB)) * 2 * MiB
        channels = min(self.nccl_channels, int(env.get("NCCL_MAX_NCHANNELS", self.nccl_channels)))
        peers = 1 if world_size == 2 else 2
        return self.nccl_fixed_bytes + channels * peers * connection

    def slack_bytes(self, transient_bytes: int, env) -> int:
        """The allocator's slack for `transient_bytes` churned within a step."""
        expandable = (
            "expandable_segments:true" in env.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()
        )
        fraction = self.expandable_slack_fraction if expandable else self.slack_fraction
        return int(fraction * transient_bytes) + self.segment_bytes


def transient(terms: dict[str, int]) -> int:
    """The bytes of a peak phase that are not model states: what the caching allocator sees freed and reused."""
    return sum(value for name, value in terms.items() if name not in STATE_TERMS)


def gpu_margin(
    *, world_size: int, margin_bytes: float | None = None, transient_bytes: int = 0
) -> dict[str, int]:
    """The margin's terms on one GPU: the user's own total (`margin_bytes`, from --gpu-margin) or GpuMargin's."""
    if margin_bytes is not None:
        return dict(set_by_user=int(margin_bytes))
    return GpuMargin().terms(world_size=world_size, transient_bytes=transient_bytes)


def fixed_part(margin: dict[str, int]) -> int:
    """The margin's bytes that do not depend on the set-up (all but the allocator's slack)."""
    return sum(value for name, value in margin.items() if name != "allocator_slack")


MARGIN_WORDS = {
    "cuda_context": "CUDA context",
    "nccl_buffers": "NCCL buffers",
    "allocator_slack": "allocator slack",
    "set_by_user": "set by --gpu-margin",
}
"""How the estimate and the plan name each term."""


def margin_line(terms: dict[str, int], gpu_memory_bytes: float) -> str:
    """One line: the set-up-independent margin, its terms, what is left of the GPU, the slack's rule, the flag."""
    fixed = {name: value for name, value in terms.items() if name != "allocator_slack"}
    words = ", ".join(f"{MARGIN_WORDS[name]} {value / GB:.2g}" for name, value in fixed.items() if value)
    total = sum(fixed.values())
    slack = (
        "; and per set-up, allocator slack: 50% of the peak's bytes that are not model states (5% with "
        "expandable_segments) + 20 MiB"
        if "set_by_user" not in terms
        else ""
    )
    return (
        f"GPU margin {total / GB:.3g} GB ({words or 'none'}{slack}; rules from published measurements, NOT "
        f"measured on this hardware: docs/gpu.md; --gpu-margin GB sets your own): "
        f"{(gpu_memory_bytes - total) / GB:.3g} of {gpu_memory_bytes / GB:g} GB usable per GPU"
    )
