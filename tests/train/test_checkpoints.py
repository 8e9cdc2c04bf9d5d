"""A run's checkpoints are self-contained: the tokenizer's files and generation_config.json beside the model config,
absolute paths in run.json, so that a checkpoint moved elsewhere exports from any directory after the model folder
it was trained from is gone (the HF Trainer's checkpoints hold their tokenizer too)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

pytestmark = pytest.mark.tier("quick")


def test_a_moved_checkpoint_exports_from_another_directory(tmp_path, monkeypatch):
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zero_train.checkpoint.export import export_checkpoint
    from zero_train.hf import models as hf
    from zero_train.testing import free_port
    from zero_train.train.args import parse_args
    from zero_train.train.loop import run_training

    torch.manual_seed(0)
    hf.build_model(hf.model_config("tiny")).save_pretrained(tmp_path / "model")
    hf.load_tokenizer().save_pretrained(tmp_path / "model")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.chdir(tmp_path)  # relative paths, as a user types them
    try:
        run_training(parse_args(["--engine", "ddp", "--model", "model", "--max-steps", "1", "--block-size", "16",
                                 "--no-progress", "--output-dir", str(tmp_path / "run")]))  # fmt: skip
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000001"
    run = json.loads((ckpt / "run.json").read_text())
    assert run["model"] == run["tokenizer"] == str(tmp_path / "model")  # absolute
    held = sorted(path.name for path in (ckpt / "model").iterdir())
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= set(held)
    moved = tmp_path / "elsewhere" / "ckpt"
    moved.parent.mkdir()
    shutil.move(ckpt, moved)
    shutil.rmtree(tmp_path / "model")  # the folder it was trained from is gone
    os.chdir(tmp_path / "elsewhere")
    out = export_checkpoint("ckpt", tmp_path / "hf")
    assert (out / "generation_config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == len(hf.load_tokenizer())
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.generation_config.eos_token_id == hf.model_config("tiny").eos_token_id
