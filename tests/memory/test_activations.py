"""Activations counted on fake tensors equal the same count on the real model, byte for byte.

zero_train.memory.model.activations builds the model inside FakeTensorMode (no data, no kernels) and counts
what autograd saves and what is alive through one forward and backward. Here the same instruments run
on the real model on CPU (random weights, real kernels): every field must agree exactly, for GPT-2, Llama,
Qwen2 and Mistral (sliding window smaller than the block: a materialized mask) shapes, with and without
activation checkpointing.
"""

from __future__ import annotations

import pytest
import torch
from transformers import MistralConfig, Qwen2Config

from zero_train.hf.models import model_config
from zero_train.memory.model.activations import count_activations, count_model_activations
from zero_train.memory.model.fake_model import build_for_counting

pytestmark = pytest.mark.tier("quick")

SMALL = dict(vocab_size=4096, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
CASES = {
    "gpt2-fp32": (lambda: model_config("tiny"), torch.float32),
    "llama-bf16": (lambda: model_config("llama-tiny"), torch.bfloat16),
    "qwen2-bf16": (lambda: Qwen2Config(**SMALL), torch.bfloat16),
    "mistral-sliding-fp32": (lambda: MistralConfig(sliding_window=16, **SMALL), torch.float32),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fake_count_equals_the_real_count_byte_for_byte(case):
    make_config, dtype = CASES[case]
    config = make_config()
    for checkpointing in (False, True):
        fake = count_activations(
            config, micro_batch_size=2, block_size=32, dtype=dtype, gradient_checkpointing=checkpointing
        )
        torch.manual_seed(0)
        model = build_for_counting(config, dtype=dtype)
        real = count_model_activations(
            model, micro_batch_size=2, block_size=32, gradient_checkpointing=checkpointing
        )
        assert fake == real, (case, checkpointing)
        assert all(p.grad is None for p in model.parameters())  # the count leaves the model as it was
        assert not model.is_activation_checkpointing
    hidden = config.hidden_size if hasattr(config, "hidden_size") else config.n_embd
    element = torch.finfo(dtype).bits // 8
    assert real.block_input_bytes == 2 * 32 * hidden * element
    assert real.recompute_bytes == real.block_saved_bytes - real.block_input_bytes


def test_checkpointing_keeps_block_inputs_and_the_loss_and_recomputes_one_block():
    config = model_config("llama-tiny")
    settings = dict(micro_batch_size=2, block_size=64, dtype=torch.float32)
    full = count_activations(config, **settings)
    checkpointed = count_activations(config, gradient_checkpointing=True, **settings)
    tokens, vocab, hidden = 2 * 64, config.vocab_size, config.hidden_size
    # The loss: the fp32 logits (T x V) above the saved bytes at the forward's peak (plus a few scalars);
    # the log-softmax the loss saves (T x V x 4 bytes) is among the saved bytes, with or without checkpointing.
    logits = tokens * vocab * 4
    assert 0 <= full.loss_bytes - logits < 64 and 0 <= checkpointed.loss_bytes - logits < 16_384
    assert checkpointed.saved_bytes > logits + full.num_blocks * full.block_input_bytes
    # Checkpointing drops every block's saved activations but its input: saved shrinks by that much,
    # up to the rotary cos/sin (1 x T x head_dim fp32, twice) saved inside the first block without it.
    dropped = full.num_blocks * (full.block_saved_bytes - full.block_input_bytes)
    rotary = 2 * 64 * (hidden // config.num_attention_heads) * 4
    assert full.saved_bytes - checkpointed.saved_bytes == dropped - rotary
    assert checkpointed.backward_peak_bytes < full.backward_peak_bytes
    assert full.recompute_bytes == 0 and checkpointed.recompute_bytes > 0
    assert full.block_input_bytes == tokens * hidden * 4


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_deep_model_counted_from_one_and_two_blocks_equals_its_whole_count(checkpointing):
    from transformers import GPT2Config, LlamaConfig

    from zero_train.memory.model import activations

    # 3-4 blocks: the line a + b x (layers - 1) from 1 and 2 blocks is extrapolated past both; a deeper model
    # checks the same line and costs a fake block more each
    deep = {
        "llama": (LlamaConfig(**dict(SMALL, num_hidden_layers=4)), torch.bfloat16),
        "gpt2 with dropout": (GPT2Config(vocab_size=4096, n_embd=64, n_layer=3, n_head=4, n_positions=256,
                                         resid_pdrop=0.1), torch.float32),
        "qwen2": (Qwen2Config(**dict(SMALL, num_hidden_layers=3)), torch.float32),
        "mistral, sliding window on every layer": (
            MistralConfig(sliding_window=16, **dict(SMALL, num_hidden_layers=3)), torch.bfloat16),
    }  # fmt: skip
    for name, (config, dtype) in deep.items():
        settings = dict(micro_batch_size=2, block_size=32, dtype=dtype, gradient_checkpointing=checkpointing)
        extended = activations._by_layers(config, **settings)
        assert extended is not None and extended == activations._count_fake(config, **settings), name
        assert extended.num_blocks == config.num_hidden_layers
