"""The model the memory model counts on, built for real: on the meta device for its shape (theory.model_shape)
and on fake tensors for one micro-batch's activations (activations.count_activations).

It imports transformers' model classes (seconds): theory and activations import it only to count a model whose
count is not stored yet (zero_train.memory.model.stored), so `zero-train estimate --params`, and an estimate of a
model whose counts are stored, never load it.
"""

from __future__ import annotations

import contextlib
import copy
import warnings

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from transformers import AutoModelForCausalLM, PreTrainedModel, masking_utils
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import logging as hf_logging

from zero_train.hf.lora import apply_lora
from zero_train.hf.models import build_model, enable_gradient_checkpointing
from zero_train.memory.model.watch import Counter


def meta_shape_fields(config, lora=None) -> dict:
    """theory.ModelShape's fields (as dataclasses.asdict gives them) of `config`'s model, built on the meta device
    (no memory); with `lora`, peft's adapters on it and only they trainable."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
        init_gather = _largest_init_gather(model)  # the base's: zero.Init builds it before peft wraps it
        if lora is not None:
            model = apply_lora(model, lora)
    numels = tuple(p.numel() for p in model.parameters())  # parameters() deduplicates tied weights
    trainable = tuple(p.numel() for p in model.parameters() if p.requires_grad) if lora is not None else None
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    tied = head is not None and embedding is not None and head.weight is embedding.weight
    return dict(
        num_params=sum(numels),
        largest_layer_params=largest,
        num_layers=getattr(config, "num_hidden_layers", 0) or 0,
        hidden_size=getattr(config, "hidden_size", 0) or 0,
        num_heads=getattr(config, "num_attention_heads", 0) or 0,
        vocab_size=getattr(config, "vocab_size", 0) or 0,
        param_numels=numels,
        tied_embedding_params=embedding.weight.numel() if tied else 0,
        trainable_numels=trainable,
        init_gather_numels=init_gather,
    )


def _largest_init_gather(model) -> tuple[int, ...]:
    """The largest set of tensors transformers' initialize_weights_zero3 gathers at once, largest first: it
    initialises each module with its parameters and its direct children's (a nested PreTrainedModel apart)."""

    def gathered(module) -> tuple[int, ...]:
        numels = {id(p): p.numel() for p in module.parameters(recurse=False)}
        for child in module.children():
            if not isinstance(child, PreTrainedModel):
                numels.update((id(p), p.numel()) for p in child.parameters(recurse=False))
        return tuple(sorted(numels.values(), reverse=True))

    return max((gathered(module) for module in model.modules()), key=sum)


def build_for_counting(config, *, dtype: torch.dtype, lora=None, gradient_checkpointing: bool = False):
    """The model of `config` as training runs it (train mode, no KV cache), on the current device/mode; with
    `lora` wrapped by peft as train.py wraps it: after checkpointing is on, so that peft makes the
    embeddings' output require grad (PeftModel's _prepare_model_for_gradient_checkpointing) as in training."""
    if lora is not None:
        return _with_adapters(config, lora, dtype=dtype, gradient_checkpointing=gradient_checkpointing)
    # build_model, as training builds it (its loss named: no transformers warning at the first loss)
    with quiet():  # a copy: the caller's config keeps its use_cache (part of the count's key)
        model = build_model(copy.deepcopy(config), dtype=dtype)
    model.config.use_cache = False
    return model.train()


def _with_adapters(config, lora, *, dtype: torch.dtype, gradient_checkpointing: bool):
    """The peft model on the current device/mode, its floating tensors in `dtype` (the engines' compute dtype).

    peft moves each adapter to its base layer with Module.to, which on fake tensors swaps parameters (torch
    2.13) and fails: the model is wrapped on the meta device (outside any fake mode), then every tensor is
    made again on the current one, each tied tensor once.
    """
    with unset_fake_temporarily(), torch.device("meta"), quiet():
        model = build_model(copy.deepcopy(config), dtype=dtype)  # a copy, as in build_for_counting
        if gradient_checkpointing:
            enable_gradient_checkpointing(model)  # before peft, as train.py does
        model = apply_lora(model, lora)
        model.gradient_checkpointing_disable()  # peft's input hook stays; count_model_activations switches it
    made: dict[int, torch.Tensor] = {}

    def remade(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in made:
            kind = dtype if tensor.is_floating_point() else tensor.dtype
            made[id(tensor)] = torch.empty(tensor.shape, dtype=kind, device="cpu")
        return made[id(tensor)]

    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                module._parameters[name] = torch.nn.Parameter(
                    remade(param), requires_grad=param.requires_grad
                )
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = remade(buffer)
    model.config.use_cache = False
    return model.train()


def block_saved_bytes(model, blocks: list, ids: torch.Tensor) -> tuple[int, int]:
    """A forward without checkpointing (no backward): the largest block's saved bytes and its input's."""
    counter = Counter(model, blocks)
    with counter.saved_hooks(), unpacked_positions():
        model(input_ids=ids, labels=ids).loss  # noqa: B018  (the graph is dropped: no backward needed)
    return counter.largest_block()


def model_blocks(model) -> list[torch.nn.Module]:
    """The transformer blocks: the modules HF checkpoints (GradientCheckpointingLayer), else the longest
    ModuleList."""
    blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if blocks:
        return blocks
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


@contextlib.contextmanager
def checkpointing(model, enabled: bool):
    if not enabled:
        yield
        return
    kwargs = {"use_reentrant": False}
    with quiet():
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    try:
        yield
    finally:
        with quiet():
            model.gradient_checkpointing_disable()


@contextlib.contextmanager
def unpacked_positions():
    """Take the branch a real run takes for sequences that are not packed (default position ids).

    transformers' masking_utils.find_packed_sequence_indices reads the position ids' values to tell packed
    sequences apart, and on fake tensors (which have none) assumes they may be packed, then builds a full
    b x 1 x T x T float attention mask that the real run never builds. The engines pass no position ids, so
    the real answer is "not packed" (None): the fake run is told so.
    """
    original = getattr(masking_utils, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


@contextlib.contextmanager
def quiet():
    """transformers' deprecation and "use_cache is incompatible" notices are not for the estimate's user."""
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
