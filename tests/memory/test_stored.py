"""Counts kept on disk (zero_train.memory.model.stored): made once, read back by the next process of the same
versions and code, made again when those change or the file is unreadable."""

from __future__ import annotations

import pytest
import torch

from zero_train.hf.models import model_config
from zero_train.memory.model import activations, stored, theory

pytestmark = pytest.mark.tier("quick")

SETTINGS = dict(micro_batch_size=2, block_size=32, dtype=torch.float32)


def _refuse(*args, **kwargs):
    raise RuntimeError("counted again")


def test_a_count_is_made_once_and_read_back_until_the_versions_change(tmp_path, monkeypatch):
    monkeypatch.setenv("ZT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(activations, "_CACHE", {})
    config = model_config("llama-tiny")
    made, shape = activations.count_activations(config, **SETTINGS), theory.model_shape(config)
    assert made == activations._count_fake(config, **SETTINGS)  # the stored count is the count
    assert sorted(path.name.split("-")[0] for path in tmp_path.iterdir()) == ["activations", "shape"]

    monkeypatch.setattr(activations, "_CACHE", {})  # the next process: nothing in memory, counting refused
    for name in ("_count_fake", "_by_layers"):
        monkeypatch.setattr(activations, name, _refuse)
    monkeypatch.setattr(theory, "_meta_shape", _refuse)
    assert activations.count_activations(config, **SETTINGS) == made
    assert theory.model_shape(config) == shape

    monkeypatch.setattr(stored, "_versions", lambda: ("2.99", "9.9", "other code"))
    with pytest.raises(RuntimeError, match="counted again"):
        theory.model_shape(config)


def test_an_unreadable_or_unwritable_store_counts_as_if_it_were_the_first(tmp_path, monkeypatch):
    config = model_config("tiny")
    monkeypatch.setenv("ZT_CACHE_DIR", str(tmp_path))
    shape = theory.model_shape(config)
    for path in tmp_path.iterdir():
        path.write_text("{")  # cut short
    assert theory.model_shape(config) == shape
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("ZT_CACHE_DIR", str(blocked / "counts"))  # a directory under a file: cannot be made
    assert theory.model_shape(config) == shape


def test_lora_is_part_of_the_key_the_stored_lora_count_is_the_peft_model_s(tmp_path, monkeypatch):
    from zero_train.hf.lora import LoraSpec

    monkeypatch.setenv("ZT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(activations, "_CACHE", {})
    config, spec = model_config("llama-tiny"), LoraSpec(r=4)
    full_shape, full = theory.model_shape(config), activations.count_activations(config, **SETTINGS)
    shape = theory.model_shape(config, spec)
    count = activations.count_activations(config, lora=spec, **SETTINGS)
    assert shape.frozen_base and not full_shape.frozen_base
    assert shape.trainable_params < full_shape.num_params < shape.num_params  # adapters only train
    assert count == activations._count_fake(config, lora=spec, **SETTINGS) != full  # a peft model's own count
    assert len(list(tmp_path.iterdir())) == 4  # 2 shapes, 2 counts: none read as the other's

    monkeypatch.setattr(activations, "_CACHE", {})  # read back, not counted again, each under its own key
    for name in ("_count_fake", "_by_layers"):
        monkeypatch.setattr(activations, name, _refuse)
    monkeypatch.setattr(theory, "_meta_shape", _refuse)
    assert theory.model_shape(config, spec) == shape and theory.model_shape(config) == full_shape
    assert activations.count_activations(config, lora=spec, **SETTINGS) == count
    assert activations.count_activations(config, **SETTINGS) == full
