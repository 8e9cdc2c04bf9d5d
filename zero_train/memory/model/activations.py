"""Activations counted from the real architecture: one forward and backward on fake tensors, no memory used.

The model is built at its real size (zero_train.memory.model.fake_model) inside torch's FakeTensorMode (every
tensor has a shape, a dtype and a storage size, but no data, and no kernel runs), then one micro-batch goes
forward and backward exactly as the engines run it (`model(input_ids=ids, labels=ids).loss`, then
`.backward()`). Two instruments watch:

- saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks): every tensor autograd saves for
  backward, each storage counted once (identity: the storage's StorageImpl, `StorageWeakRef.cdata`, which
  views, fake tensors and real tensors all share), parameters and buffers left out. This is the probe's
  "activations" category (zero_train.memory.probe), computed before the run instead of during it.
- a TorchDispatchMode that sees every storage an op creates and is called back when each dies (a weakref on
  the storage's Python object): the live bytes after every op, so the forward's and the backward's highest
  points, with the parameters' gradients set apart (they are model states, which the peak model counts
  per engine).

With activation checkpointing (HF `activation_checkpointing_enable`, non-reentrant torch.utils.checkpoint)
autograd saves each block's inputs (checkpoint's `_NoopSaveInputs`, seen by the hooks) and what lies outside
the blocks; in backward each block is run again and its activations live until its backward ends: the
backward peak is measured the same way, and `recompute_bytes` names one block's share.

The same function counts a real model on CPU (tests compare the fake count with the real one byte for byte).
What neither instrument sees: scratch memory a kernel allocates and frees inside one op (e.g. a CPU
attention kernel's workspace), and allocator rounding; those stay in the measured "other".
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from zero_train.memory.model.stored import stored
from zero_train.memory.model.watch import Counter


@dataclass(frozen=True)
class ActivationCount:
    """What one micro-batch's forward and backward hold beside the model states, in bytes (one rank)."""

    saved_bytes: int
    """Bytes autograd holds at the end of forward (each storage once; parameters and buffers left out).
    With checkpointing: the blocks' inputs and what is saved outside the blocks (embeddings, final norm,
    LM head, loss)."""
    loss_bytes: int
    """Logits and loss temporaries above `saved_bytes` at the forward's highest point in the loss (from the
    LM head's output on): the logits in the model dtype, their fp32 copy for the loss."""
    recompute_bytes: int
    """With checkpointing: what the largest block saves when it is run again in backward, beside its input
    (which is already held); 0 without."""
    forward_peak_bytes: int = 0
    """The most bytes alive at once during the forward (loss included), parameters and buffers excluded."""
    backward_peak_bytes: int = 0
    """The most bytes alive at once during the backward, parameters' gradients excluded (they are model
    states); activations not yet freed, activation gradients, recomputed blocks, op outputs."""
    block_saved_bytes: int = 0
    """What the largest block saves in a forward without checkpointing (its input included)."""
    block_input_bytes: int = 0
    """One block's hidden-state input (micro-batch x block x hidden x dtype bytes)."""
    num_blocks: int = 0
    """Transformer blocks found (the modules activation checkpointing wraps)."""
    tokens: int = 0
    """micro_batch_size x block_size."""
    gradient_checkpointing: bool = False
    """Counted with activation checkpointing on."""
    forward_flops: int = 0
    """FLOPs of the forward's matmuls and attention (watch.OpCost: torch's FLOP counter's formulas)."""
    backward_flops: int = 0
    """FLOPs of the backward's, the blocks run again under checkpointing included (`recompute_flops`)."""
    recompute_flops: int = 0
    """FLOPs of the blocks' forward run again in backward (checkpointing; 0 without)."""
    attention_flops: int = 0
    """Of forward + backward FLOPs, attention's (the seq^2 term: scores and their product with values)."""
    memory_bytes: int = 0
    """Bytes read and written by every other op of forward + backward (elementwise, norms, softmax, loss)."""
    ops: int = 0
    """ATen ops dispatched by forward + backward, views and the re-run under checkpointing included."""

    def as_dict(self) -> dict:
        """JSON-ready fields."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def count_activations(
    config,
    *,
    micro_batch_size: int,
    block_size: int,
    dtype: torch.dtype,
    gradient_checkpointing: bool = False,
    lora=None,
) -> ActivationCount:
    """Count one micro-batch's activations of `config`'s model at its real size, on fake tensors.

    Seconds even for 70B parameters at 4k tokens (a deep model whose blocks are alike is counted at 1 and 2
    blocks and extended: _by_layers); results are kept per (config, settings) in the process and on disk
    (zero_train.memory.model.stored: the next process of the same versions reads them).

    Args:
        config: a transformers PretrainedConfig of a causal LM (AutoModelForCausalLM builds it).
        micro_batch_size: samples per micro-batch.
        block_size: tokens per sample.
        dtype: the model's parameter dtype (torch.float32, torch.bfloat16, torch.float16).
        gradient_checkpointing: count with non-reentrant activation checkpointing on every block.
        lora: a zero_train.hf.lora.LoraSpec: peft's adapters on the frozen base, as training wraps it (what
            autograd saves follows which tensors require grad: a frozen layer keeps only what the adapters'
            backward and the layers' input gradients need).

    Returns:
        The ActivationCount.
    """
    key = (config.to_json_string(), micro_batch_size, block_size, dtype, gradient_checkpointing, lora)
    if key not in _CACHE:
        settings = dict(
            micro_batch_size=micro_batch_size,
            block_size=block_size,
            dtype=dtype,
            gradient_checkpointing=gradient_checkpointing,
            lora=lora,
        )
        fields = stored(
            "activations",
            list(key),
            lambda: (_by_layers(config, **settings) or _count_fake(config, **settings)).as_dict(),
        )
        _CACHE[key] = ActivationCount(**fields)
    return _CACHE[key]


def _count_fake(config, *, dtype: torch.dtype, lora=None, **settings) -> ActivationCount:
    """The count of the whole model on fake tensors."""
    # expensive: transformers (seconds): a stored count, and estimate --params, need none
    from zero_train.memory.model.fake_model import build_for_counting

    with FakeTensorMode():
        model = build_for_counting(
            config,
            dtype=dtype,
            lora=lora,
            gradient_checkpointing=settings.get("gradient_checkpointing", False),
        )
        return count_model_activations(model, **settings)


ADDITIVE_FIELDS = (
    "saved_bytes",
    "loss_bytes",
    "forward_peak_bytes",
    "backward_peak_bytes",
    "forward_flops",
    "backward_flops",
    "recompute_flops",
    "attention_flops",
    "memory_bytes",
    "ops",
)
"""Fields that grow by the same amount with every identical block (the others are per block, or fixed)."""


def _by_layers(config, **settings) -> ActivationCount | None:
    """The count of a deep model from the same model with 1 and 2 blocks, when its blocks are alike.

    Each block of a decoder adds the same bytes (same shapes; what the blocks share, e.g. the rotary cos/sin,
    is saved once, by the first), so the additive fields are a + b x (layers - 1): the 1-block count is a, the
    2-block count minus it is b, one block's share. Counting two shallow models costs what 3 blocks cost, whatever
    the depth (80 for Llama-2-70B); tests compare the line with the whole count (GPT-2, Llama, Qwen2, Mistral, with
    and without checkpointing). None for shallow models and for configs whose layers differ (per-layer
    `layer_types`, sliding windows on some layers only), or when the largest block differs between the two.
    """
    layers = getattr(config, "num_hidden_layers", 0) or 0
    if layers <= 2 or len(set(getattr(config, "layer_types", None) or ["same"])) > 1:
        return None
    if getattr(config, "use_sliding_window", False) and getattr(config, "max_window_layers", layers) < layers:
        return None
    counts = []
    for depth in (1, 2):
        shallow = copy.deepcopy(config)
        shallow.num_hidden_layers = depth
        if getattr(shallow, "layer_types", None):
            shallow.layer_types = shallow.layer_types[:depth]
        counts.append(_count_fake(shallow, **settings))
    one, two = counts
    if one.block_saved_bytes != two.block_saved_bytes:
        return None
    grown = {
        name: getattr(one, name) + (getattr(two, name) - getattr(one, name)) * (layers - 1)
        for name in ADDITIVE_FIELDS
    }
    return dataclasses.replace(two, num_blocks=layers, **grown)


_CACHE: dict[tuple, ActivationCount] = {}
"""Counts already made in this process (the estimate asks once per stage)."""


def count_model_activations(
    model, *, micro_batch_size: int, block_size: int, gradient_checkpointing: bool = False
) -> ActivationCount:
    """Count the activations of `model` (real or fake) over one forward and backward of random tokens.

    The model's parameters get gradients and lose them again at once (post-accumulate hooks), so a real model
    ends as it began; with `gradient_checkpointing` it is turned on for the count and off afterwards.

    Args:
        model: a transformers causal LM in train mode.
        micro_batch_size, block_size: the batch shape.
        gradient_checkpointing: count with non-reentrant activation checkpointing.

    Returns:
        The ActivationCount.
    """
    # expensive: transformers (seconds), for this module's importers; a model here has paid for it
    from zero_train.memory.model.fake_model import (
        block_saved_bytes,
        checkpointing,
        model_blocks,
        unpacked_positions,
    )

    vocab = model.get_input_embeddings().weight.shape[0]
    device = model.get_input_embeddings().weight.device
    ids = torch.randint(0, vocab, (micro_batch_size, block_size), device=device)
    blocks = model_blocks(model)
    block_saved, block_input = block_saved_bytes(model, blocks, ids) if gradient_checkpointing else (0, 0)
    with checkpointing(model, gradient_checkpointing), unpacked_positions():
        counter = Counter(model, blocks)
        counter.run(ids)
    if not gradient_checkpointing:
        block_saved, block_input = counter.largest_block()
    return ActivationCount(
        saved_bytes=counter.saved_bytes,
        loss_bytes=counter.loss_peak - counter.saved_bytes,
        recompute_bytes=block_saved - block_input if gradient_checkpointing else 0,
        forward_peak_bytes=counter.forward_peak,
        backward_peak_bytes=counter.backward_peak,
        block_saved_bytes=block_saved,
        block_input_bytes=block_input,
        num_blocks=len(blocks),
        tokens=micro_batch_size * block_size,
        gradient_checkpointing=gradient_checkpointing,
        forward_flops=counter.cost.flops["forward"],
        backward_flops=counter.cost.flops["backward"],
        recompute_flops=counter.cost.recompute_flops,
        attention_flops=counter.cost.attention_flops,
        memory_bytes=counter.cost.memory_bytes,
        ops=counter.cost.ops,
    )
