"""Per-rank memory in theory: the ZeRO paper's formulas, DeepSpeed's own estimators, and our model.

Three answers to "how many bytes does one rank need at ZeRO stage s on N ranks":

(a) the paper (Rajbhandari et al. 2020, arXiv:1910.02054, section 5.1): model states only.
    Mixed precision Adam, K = 12 (fp32 master params, momentum, variance), Psi parameters:
        stage 0 (DDP)  2Psi + 2Psi + K Psi         stage 2  2Psi + (2 + K) Psi / N
        stage 1        2Psi + 2Psi + K Psi / N     stage 3  (2 + 2 + K) Psi / N
    Pure fp32 Adam has no separate master copy: params 4 + grads 4 + moments 8 = 16 bytes/param.
(b) DeepSpeed's estimators, called (deepspeed.runtime.zero.stage_1_and_2 / stage3
    `estimate_zero{2,3}_model_states_mem_needs`, the functions their `*_all_live` / `*_all_cold`
    printers call). They assume mixed precision, count 18 bytes/param for the sharded part (fp32
    gradients too) and ZeRO-3's largest layer gathered; DeepSpeed has NO ZeRO-1 (or stage-0) estimator.
(c) ours: the model states as the engines really hold them at the step boundary (`engine_categories`
    adds what was measured here: DeepSpeed's fp32 master partition even in fp32, ZeRO-1's gradients
    already partitioned at the step), plus what (a) and (b) ignore:
    communication buckets read from the DeepSpeed config (DDP: its flat gradient buckets) and
    activations for micro-batch x block size on the model's shape.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

STAGES = (0, 1, 2, 3)
PRECISIONS = ("fp32", "bf16", "fp16")
GB = 1e9  # the paper's GB
ADAM_K = 12  # fp32 master params + momentum + variance, bytes per parameter (paper section 3.1)
DEFAULT_REDUCE_BUCKET_SIZE = 500_000_000  # DeepSpeed's default, in elements
DDP_BUCKET_VIEW = False  # torch DDP default: flat bucket copies of every gradient


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelShape:
    """What the memory model needs to know about a model."""

    num_params: int
    """Unique parameters (tied weights once)."""
    largest_layer_params: int = 0
    """Parameters of the largest single module (ZeRO-3 gathers one at a time); 0 = unknown."""
    num_layers: int = 0
    """Transformer blocks; 0 = unknown (activations are then not estimated)."""
    hidden_size: int = 0
    """Model width."""
    num_heads: int = 0
    """Attention heads."""
    vocab_size: int = 0
    """Embedding rows (the logits are micro_batch x block x vocab)."""


def precision_bytes(precision: str) -> dict[str, int]:
    """Bytes per parameter of each model-state category for `precision` (unsharded).

    Returns:
        params, grads, master_params, optimizer_states (Adam's two moments, fp32).
    """
    if precision == "fp32":
        return dict(params=4, grads=4, master_params=0, optimizer_states=8)
    return dict(params=2, grads=2, master_params=4, optimizer_states=8)


def paper_categories(
    num_params: int, world_size: int, stage: int, *, precision: str = "bf16"
) -> dict[str, float]:
    """Model-state bytes per rank by category, by the ZeRO paper (fp32: the pure fp32 variant).

    Args:
        num_params: Psi.
        world_size: N_d, the data-parallel degree.
        stage: 0 (DDP) .. 3.
        precision: "fp32" or a 16-bit one (K = 12 mixed precision).

    Returns:
        params, grads, master_params, optimizer_states (bytes, fractional where sharded).
    """
    per_param = precision_bytes(precision)
    shard = {name: 1.0 for name in per_param}
    if stage >= 1:
        shard["master_params"] = shard["optimizer_states"] = 1 / world_size
    if stage >= 2:
        shard["grads"] = 1 / world_size
    if stage >= 3:
        shard["params"] = 1 / world_size
    return {name: num_params * per_param[name] * shard[name] for name in per_param}


def paper_bytes(num_params: int, world_size: int, stage: int, *, precision: str = "bf16") -> float:
    """Total model-state bytes per rank by the paper (7.5e9 params, 64 ranks: 120/31.4/16.6/1.88 GB)."""
    return sum(paper_categories(num_params, world_size, stage, precision=precision).values())


def deepspeed_estimate(
    num_params: int, world_size: int, stage: int, *, largest_layer_params: int = 0
) -> int | None:
    """Per-GPU model-state bytes from DeepSpeed's own estimator (no offload), or None for stages 0 and 1.

    Args:
        num_params: total parameters.
        world_size: GPUs, counted as one node of `world_size` GPUs.
        stage: 2 or 3 have an estimator; 0 and 1 have none in DeepSpeed.
        largest_layer_params: ZeRO-3's largest layer (DeepSpeed adds 4 bytes/param of it).

    Returns:
        Bytes, or None where DeepSpeed has no estimator.
    """
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs its accelerator choice to stdout on import
        import deepspeed.runtime.zero.stage3
        import deepspeed.runtime.zero.stage_1_and_2  # noqa: F401
    if stage == 2:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        _, gpu_bytes = estimate_zero2_model_states_mem_needs(
            num_params, num_gpus_per_node=world_size, num_nodes=1, cpu_offload=False
        )
        return int(gpu_bytes)
    if stage == 3:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        _, gpu_bytes, _ = estimate_zero3_model_states_mem_needs(
            num_params,
            largest_layer_params,
            num_gpus_per_node=world_size,
            num_nodes=1,
            cpu_offload=False,
            cpu_offload_params=False,
        )
        return int(gpu_bytes)
    return None


ACTIVATION_VALUES_PER_TOKEN_CHANNEL = 31
"""Values autograd saves per (token, hidden channel) per transformer block: measured here with
saved-tensor hooks on Hugging Face GPT-2 (SDPA attention, gelu_new, no dropout). Korthikanti et al.
2022 ("Reducing Activation Recomputation", eq. 1) give 34 bytes of 16-bit values and masks plus the
5as/h attention-score term that fused attention does not store."""


def activation_bytes(shape: ModelShape, *, micro_batch_size: int, block_size: int, precision: str) -> int:
    """Activations saved for backward in one micro-batch's forward (0 if the shape is unknown).

    Per block: b*s*h*ACTIVATION_VALUES_PER_TOKEN_CHANNEL values in the model dtype; plus the loss's
    fp32 log-softmax over the vocabulary (b*s*V*4 bytes), which dominates small models.
    """
    if not (shape.num_layers and shape.hidden_size):
        return 0
    tokens = micro_batch_size * block_size
    value_bytes = 4 if precision == "fp32" else 2
    per_block = tokens * shape.hidden_size * ACTIVATION_VALUES_PER_TOKEN_CHANNEL * value_bytes
    log_softmax = tokens * shape.vocab_size * 4
    return int(shape.num_layers * per_block + log_softmax)


def buffer_bytes(shape: ModelShape, stage: int, *, precision: str, ds_config: dict | None) -> int:
    """Communication buffers a rank allocates for gradients.

    stage 0 (torch DDP): flat bucket copies of all gradients (gradient_as_bucket_view=False).
    stages 1-3 (DeepSpeed, contiguous_gradients): one reduce bucket of reduce_bucket_size elements
    in the gradient dtype, whatever the model size (hence DeepSpeed's large overhead on small models
    with its default 5e8). ZeRO-3's gathered layers are transient (freed before the step): they show
    in the forward peak, not here.
    """
    grad_bytes = precision_bytes(precision)["grads"]
    if stage == 0:
        return 0 if DDP_BUCKET_VIEW else shape.num_params * grad_bytes
    zero = (ds_config or {}).get("zero_optimization", {})
    bucket = zero.get("reduce_bucket_size", DEFAULT_REDUCE_BUCKET_SIZE)
    bucket = DEFAULT_REDUCE_BUCKET_SIZE if not isinstance(bucket, (int, float)) else int(bucket)
    return int(bucket * grad_bytes) if zero.get("contiguous_gradients", True) else 0


def our_categories(
    shape: ModelShape,
    world_size: int,
    stage: int,
    *,
    precision: str,
    micro_batch_size: int,
    block_size: int,
    ds_config: dict | None = None,
) -> dict[str, int]:
    """Our per-rank model for a DeepSpeed stage: paper categories + buffers + activations.

    Returns:
        params, grads, master_params, optimizer_states, comm_buffers, activations (bytes).
    """
    states = paper_categories(shape.num_params, world_size, stage, precision=precision)
    categories = {name: int(value) for name, value in states.items()}
    categories["comm_buffers"] = buffer_bytes(shape, stage, precision=precision, ds_config=ds_config)
    categories["activations"] = activation_bytes(
        shape, micro_batch_size=micro_batch_size, block_size=block_size, precision=precision
    )
    return categories


def model_shape(config) -> ModelShape:
    """The shape of a Hugging Face model config, counting parameters on the meta device (no memory).

    Args:
        config: a transformers.PretrainedConfig (e.g. zero_train.hf.model_config("tiny")).
    """
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    num_params = sum(p.numel() for p in model.parameters())  # parameters() deduplicates tied weights
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return ModelShape(
        num_params=num_params,
        largest_layer_params=largest,
        num_layers=getattr(config, "num_hidden_layers", 0) or 0,
        hidden_size=getattr(config, "hidden_size", 0) or 0,
        num_heads=getattr(config, "num_attention_heads", 0) or 0,
        vocab_size=getattr(config, "vocab_size", 0) or 0,
    )


ENGINE_STAGES = {"ddp": 0, "zero1": 1, "torch-zero": 1, "ds1": 1, "ds2": 2, "ds3": 3}


def engine_categories(
    engine: str,
    shape: ModelShape,
    world_size: int,
    *,
    precision: str,
    micro_batch_size: int,
    block_size: int,
    ds_config: dict | None = None,
) -> dict[str, int]:
    """Our model for one engine of the profile matrix, as it really holds its tensors.

    ddp, zero1, torch-zero: the paper's categories for their stage; ddp and torch-zero (which wraps
    DDP) add DDP's flat gradient buckets (one gradient-sized copy), and torch-zero keeps the fp32
    master copies of a 16-bit model whole on every rank (zero_train.engines.torch_zero: the
    ZeroRedundancyOptimizer shards only the Adam states over them). ds1/ds2/ds3: `our_categories`,
    plus two things measured with DeepSpeed 0.19 on CPU: it keeps an fp32 master partition even in
    fp32 (stage_1_and_2 / stage3 clone the partition), and at the step boundary ZeRO-1 holds only its
    reduced gradient partition, like ZeRO-2 (the paper counts ZeRO-1's gradients whole).

    Returns:
        params, grads, master_params, optimizer_states, comm_buffers, activations (bytes).
    """
    if engine not in ENGINE_STAGES:
        raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINE_STAGES)}")
    stage = ENGINE_STAGES[engine]
    kwargs = dict(precision=precision, micro_batch_size=micro_batch_size, block_size=block_size)
    if engine.startswith("ds"):
        categories = our_categories(shape, world_size, stage, ds_config=ds_config, **kwargs)
        if precision == "fp32":
            categories["master_params"] += int(4 * shape.num_params / world_size)
        if stage == 1:  # at the step boundary ZeRO-1 holds only its reduced gradient partition
            categories["grads"] = int(shape.num_params * precision_bytes(precision)["grads"] / world_size)
        return categories
    states = paper_categories(shape.num_params, world_size, stage, precision=precision)
    categories = {name: int(value) for name, value in states.items()}
    if engine == "torch-zero":  # fp32 masters of EVERY parameter on every rank: only Adam's moments are sharded
        categories["master_params"] = shape.num_params * precision_bytes(precision)["master_params"]
    ddp_buckets = engine in ("ddp", "torch-zero")
    categories["comm_buffers"] = shape.num_params * precision_bytes(precision)["grads"] if ddp_buckets else 0
    categories["activations"] = activation_bytes(shape, **kwargs)
    return categories
