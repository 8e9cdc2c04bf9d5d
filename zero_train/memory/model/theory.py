"""Per-rank memory in theory: the ZeRO paper's formulas, DeepSpeed's own estimators, and our model.

Three answers to "how many bytes does one rank need at ZeRO stage s on N ranks":

(a) the paper (Rajbhandari et al. 2020, arXiv:1910.02054, section 5.1): model states only.
    Mixed precision Adam, K = 12 (fp32 master params, momentum, variance), Psi parameters:
        stage 0 (DDP)  2Psi + 2Psi + K Psi         stage 2  2Psi + (2 + K) Psi / N
        stage 1        2Psi + 2Psi + K Psi / N     stage 3  (2 + 2 + K) Psi / N
    Pure fp32 Adam has no separate master copy: params 4 + grads 4 + moments 8 = 16 bytes/param.
(b) DeepSpeed's estimators, called in zero_train.memory.model.deepspeed_estimate (the one module here that
    imports DeepSpeed: deepspeed.runtime.zero.stage_1_and_2 / stage3
    `estimate_zero{2,3}_model_states_mem_needs`, the functions their `*_all_live` / `*_all_cold`
    printers call). They assume mixed precision, count 18 bytes/param for the sharded part (fp32
    gradients too) and ZeRO-3's largest layer gathered; DeepSpeed has NO ZeRO-1 (or stage-0) estimator.
(c) ours (zero_train.memory.model.peak): the PEAK per rank, phase by phase (forward, backward, optimizer
    step), from what each engine's code allocates: model states as the engines really hold them, plus
    what (a) and (b) ignore: communication buckets, activations (`activation_bytes`, below), gradients
    before they are reduced, fp32 gradient copies, optimizer temporaries, ZeRO-3's gathered parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_train.ds_config.keys import DEEPSPEED_BUCKET_ELEMENTS
from zero_train.memory.model.stored import stored

STAGES = (0, 1, 2, 3)
GB = 1e9  # the paper's GB
ADAM_K = 12  # fp32 master params + momentum + variance, bytes per parameter (paper section 3.1)
DEFAULT_REDUCE_BUCKET_SIZE = DEEPSPEED_BUCKET_ELEMENTS  # DeepSpeed's default, in elements


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
    param_numels: tuple[int, ...] = ()
    """Elements of every parameter tensor, in `model.parameters()` order (tied weights once); () = unknown
    (then whole-tensor sharding is taken as an even split and no largest tensor is known)."""
    tied_embedding_params: int = 0
    """Elements of the input embedding when the LM head shares it (GPT-2), else 0."""
    trainable_numels: tuple[int, ...] | None = None
    """LoRA: elements of every trainable tensor (the adapters), in `model.parameters()` order; the rest of
    `param_numels` is the frozen base (no gradient, master or optimizer state). None: every parameter trains."""
    init_gather_numels: tuple[int, ...] = ()
    """Elements of each tensor in the largest set transformers gathers at once to initialise a model built under
    ZeRO-3's zero.Init (a module's own parameters with its direct children's), largest first; () = unknown."""

    @property
    def frozen_base(self) -> bool:
        """Whether only some parameters train (LoRA: the base is frozen, the LM head and embedding too)."""
        return self.trainable_numels is not None

    @property
    def trainable_params(self) -> int:
        """Parameters that get gradients, masters and optimizer states (all of them without LoRA)."""
        return self.num_params if self.trainable_numels is None else sum(self.trainable_numels)

    @property
    def trained_numels(self) -> tuple[int, ...]:
        """Elements of every trainable tensor (`param_numels` without LoRA)."""
        return self.param_numels if self.trainable_numels is None else self.trainable_numels


def precision_bytes(precision: str) -> dict[str, int]:
    """Bytes per parameter of each model-state category for `precision` (unsharded).

    Returns:
        params, grads, master_params, optimizer_states (Adam's two moments, fp32).
    """
    if precision == "fp32":
        return dict(params=4, grads=4, master_params=0, optimizer_states=8)
    return dict(params=2, grads=2, master_params=4, optimizer_states=8)


def paper_categories(
    num_params: int, world_size: int, stage: int, *, precision: str = "bf16", trainable: int | None = None
) -> dict[str, float]:
    """Model-state bytes per rank by category, by the ZeRO paper (fp32: the pure fp32 variant).

    Args:
        num_params: Psi.
        world_size: N_d, the data-parallel degree.
        stage: 0 (DDP) .. 3.
        precision: "fp32" or a 16-bit one (K = 12 mixed precision).
        trainable: LoRA: the parameters that train (the paper's rules applied to a frozen base: it has
            parameters only; gradients, masters and moments belong to the adapters); None: all Psi.

    Returns:
        params, grads, master_params, optimizer_states (bytes, fractional where sharded).
    """
    per_param = precision_bytes(precision)
    counted = {name: num_params if name == "params" or trainable is None else trainable for name in per_param}
    shard = {name: 1.0 for name in per_param}
    if stage >= 1:
        shard["master_params"] = shard["optimizer_states"] = 1 / world_size
    if stage >= 2:
        shard["grads"] = 1 / world_size
    if stage >= 3:
        shard["params"] = 1 / world_size
    return {name: counted[name] * per_param[name] * shard[name] for name in per_param}


def paper_bytes(
    num_params: int, world_size: int, stage: int, *, precision: str = "bf16", trainable: int | None = None
) -> float:
    """Total model-state bytes per rank by the paper (7.5e9 params, 64 ranks: 120/31.4/16.6/1.88 GB)."""
    return sum(
        paper_categories(num_params, world_size, stage, precision=precision, trainable=trainable).values()
    )


ACTIVATION_VALUES_PER_TOKEN_CHANNEL = 30
"""Values autograd saves per (token, hidden channel) per transformer block: measured here with
saved-tensor hooks on Hugging Face GPT-2 (transformers 5.x, SDPA attention, gelu_new, no dropout):
30.03 for gpt2-25m and 30.2 for `tiny` in fp32 and bf16, the fraction being per-token statistics
(layer-norm mean/rstd, attention log-sum-exp; < 0.1% of the total, left out). Korthikanti et al. 2022
("Reducing Activation Recomputation", eq. 1) give 34 bytes of 16-bit values and masks plus the
5as/h attention-score term that fused attention does not store. Llama shapes (RMSNorm, SwiGLU) save
fewer (about 21-23): this constant describes GPT-2."""


def activation_bytes(shape: ModelShape, *, micro_batch_size: int, block_size: int, precision: str) -> int:
    """Activations saved for backward in one micro-batch's forward (0 if the shape is unknown).

    Per block: b*s*h*ACTIVATION_VALUES_PER_TOKEN_CHANNEL values in the model dtype; after the blocks, the
    final layer norm's input and the LM head's input (2*b*s*h values); and the loss's fp32 log-softmax
    over the vocabulary (b*s*V*4 bytes), which dominates small models (docs/memory_model.md#the-peak-model).
    """
    if not (shape.num_layers and shape.hidden_size):
        return 0
    tokens = micro_batch_size * block_size
    value_bytes = 4 if precision == "fp32" else 2
    per_block = tokens * shape.hidden_size * ACTIVATION_VALUES_PER_TOKEN_CHANNEL * value_bytes
    head_inputs = 2 * tokens * shape.hidden_size * value_bytes
    log_softmax = tokens * shape.vocab_size * 4
    return int(shape.num_layers * per_block + head_inputs + log_softmax)


def model_shape(config, lora=None) -> ModelShape:
    """The shape of a Hugging Face model config, counting parameters on the meta device (no memory), once per
    config, LoRA spec, torch and transformers (kept on disk: zero_train.memory.model.stored).

    Args:
        config: a transformers.PretrainedConfig (e.g. zero_train.hf.models.model_config("tiny")).
        lora: a zero_train.hf.lora.LoraSpec: the model with peft's adapters, only they trainable.
    """

    fields = stored("shape", [config.to_json_string(), lora], lambda: _meta_shape(config, lora))
    trainable = fields.get("trainable_numels")
    return ModelShape(
        **dict(
            fields,
            param_numels=tuple(fields["param_numels"]),
            trainable_numels=None if trainable is None else tuple(trainable),
            init_gather_numels=tuple(fields["init_gather_numels"]),
        )
    )


def _meta_shape(config, lora=None) -> dict:
    """ModelShape's fields, counted on the meta device (zero_train.memory.model.fake_model)."""
    # expensive: transformers (seconds): a stored shape, and estimate --params, need none
    from zero_train.memory.model.fake_model import meta_shape_fields

    return meta_shape_fields(config, lora)
