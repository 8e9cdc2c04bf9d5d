"""Export a LoRA run: its PEFT adapter folder, or its base with the adapters merged into a normal HF folder.

    export_adapter(model, adapters, tokenizer, "out/adapter")        # the train loop's --export-hf (rank 0)
    export_lora_checkpoint(ckpt, "out/adapter")                      # `zero-train export CKPT OUT`
    export_lora_checkpoint(ckpt, "out/merged", merge=True)           # `zero-train export CKPT OUT --merge`
    PeftModel.from_pretrained(base, "out/adapter")                   # the trained model, given its base
    AutoModelForCausalLM.from_pretrained("out/merged")               # the same, with W + (alpha / r) B A

An adapter folder is what PeftModel.save_pretrained writes (adapter_config.json + adapter_model.safetensors),
plus the tokenizer. The base is the run's --model (run.json): a pretrained folder or hub id loads as it did for
training; a random-init preset is rebuilt from the run's seed, as train.py built it. DeepSpeed ZeRO-3 builds
a random preset under zero.Init, whose random values differ: merging such a run is refused (its adapters
export, and fit a base built the same way).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from zero_train.checkpoint import atomic as checkpoint
from zero_train.checkpoint.export import check_export_dir, export_model, own_tokenizer, staging_dir
from zero_train.checkpoint.files import ADAPTER_CONFIG, ADAPTER_FILE, MODEL_DIR
from zero_train.checkpoint.resume import RUN_FILE, read_run_info
from zero_train.checkpoint.rotation import reading
from zero_train.hf.lora import adapter_config_json, load_peft, peft_names, quiet_peft, to_peft_state_dict
from zero_train.hf.models import is_random_init, load_tokenizer, seeded_model
from zero_train.registry import DEEPSPEED, find_engine
from zero_train.runtime.errors import UsageError


def is_lora_checkpoint(ckpt) -> bool:
    """Whether a checkpoint folder holds a LoRA run's adapters (model/adapter_config.json)."""
    return (pathlib.Path(ckpt) / MODEL_DIR / ADAPTER_CONFIG).is_file()


def export_adapter(model, adapters: dict[str, torch.Tensor], tokenizer, out_dir, *, force: bool = False):
    """Write a LoRA model's adapter folder (adapter_config.json, adapter_model.safetensors, tokenizer files).

    Args:
        model: the peft model (for its config and parameter names).
        adapters: the trained adapter weights by the model's names (an engine's full_state_dict()).
        tokenizer: a tokenizer object (its files go beside the adapter, as for a full export).
        out_dir: target folder; absent or empty unless `force`.
        force: replace a non-empty out_dir.

    Returns:
        out_dir as a Path.
    """
    out = check_export_dir(out_dir, force=force)
    weights = {
        name: tensor.detach().to("cpu").contiguous()
        for name, tensor in to_peft_state_dict(model, adapters).items()
    }
    with staging_dir(out) as staging:
        (staging / ADAPTER_CONFIG).write_text(adapter_config_json(model))
        save_file(weights, str(staging / ADAPTER_FILE), metadata={"format": "pt"})
        tokenizer.save_pretrained(str(staging))
        _shareable(staging)
    return out


def export_lora_checkpoint(
    ckpt_dir,
    out_dir,
    *,
    tokenizer=None,
    merge: bool = False,
    dtype: torch.dtype | None = None,
    force: bool = False,
) -> pathlib.Path:
    """Export a LoRA run's checkpoint: its adapter folder, or (`merge`) the base with the adapters merged.

    Args:
        ckpt_dir: a checkpoint folder or a save dir (its `latest`).
        out_dir: target folder; absent or empty unless `force`.
        tokenizer: override the tokenizer recorded in run.json.
        merge: write a normal Hugging Face model folder (the base's weights plus alpha / r * B A).
        dtype: cast the merged weights (merge only; the adapters stay as saved, fp32).
        force: replace a non-empty out_dir.

    Returns:
        out_dir as a Path; UsageError for a checkpoint that is not a LoRA run's, or a base that cannot be rebuilt.
    """
    check_export_dir(out_dir, force=force)
    ckpt = checkpoint.resolve(ckpt_dir)
    if not is_lora_checkpoint(ckpt):
        raise UsageError(f"checkpoint {str(ckpt)!r} is not a LoRA run's (no {MODEL_DIR}/{ADAPTER_CONFIG})")
    with reading(ckpt):
        run = read_run_info(ckpt)
        tokens = load_tokenizer(tokenizer if tokenizer is not None else own_tokenizer(ckpt, run))
        staged = _copy_adapter(ckpt / MODEL_DIR)
    try:
        base = _rebuild_base(run, vocab_size=len(tokens), merge=merge)
        model = _with_adapter(base, staged)
        if merge:
            merged = model.merge_and_unload()
            return export_model(merged, merged.config, tokens, out_dir, dtype=dtype, force=force, verify=True)
        out = check_export_dir(out_dir, force=force)
        with staging_dir(out) as staging:
            for name in (ADAPTER_CONFIG, ADAPTER_FILE):
                shutil.copyfile(staged / name, staging / name)
            tokens.save_pretrained(str(staging))
            _shareable(staging)
        return out
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _copy_adapter(model_dir: pathlib.Path) -> pathlib.Path:
    """The checkpoint's adapter files copied aside (read under the rotation lock, used after it)."""
    staged = pathlib.Path(tempfile.mkdtemp(prefix="zt-adapter-"))
    for name in (ADAPTER_CONFIG, ADAPTER_FILE):
        if not (model_dir / name).is_file():
            shutil.rmtree(staged, ignore_errors=True)
            raise UsageError(
                f"{model_dir} has no {name}: was the save interrupted? (pick a complete checkpoint)"
            )
        shutil.copyfile(model_dir / name, staged / name)
    return staged


def _rebuild_base(run: dict, *, vocab_size: int, merge: bool):
    """The run's base model on CPU in fp32, as train.py built it (UsageError when that cannot be reproduced)."""
    name = run.get("model")
    if not isinstance(name, str):
        raise UsageError(f"{RUN_FILE} records no --model; is it a zero_train checkpoint?")
    engine = find_engine(run.get("engine"))
    if (
        merge
        and is_random_init(name)
        and engine is not None
        and engine.family == DEEPSPEED
        and engine.stage == 3
    ):
        raise UsageError(
            f"this run's base is the random-init {name!r}, built under DeepSpeed ZeRO-3's zero.Init (other random "
            "values than export can rebuild); export the adapter folder (no --merge), or train from a "
            "pretrained --model"
        )
    return seeded_model(name, seed=int(run.get("seed", 0)), vocab_size=vocab_size)


def _with_adapter(base, folder: pathlib.Path):
    """peft's PeftModel.from_pretrained(base, folder), every adapter tensor checked against the model first."""
    peft = load_peft()
    try:
        config = peft.PeftConfig.from_pretrained(str(folder))
    except (ValueError, TypeError, json.JSONDecodeError) as err:
        raise UsageError(f"cannot read {ADAPTER_CONFIG}: {err}") from None
    config.inference_mode = False  # adapters that train: peft_names lists the trainable tensors
    with torch.device("meta"), quiet_peft():  # the names and shapes the adapter must have, at no cost
        expected = _shapes(peft.get_peft_model(_meta_copy(base), config))
    with safe_open(str(folder / ADAPTER_FILE), "pt") as saved:
        found = {key: tuple(saved.get_slice(key).get_shape()) for key in saved.keys()}
    if found != expected:
        wrong = sorted(set(found) ^ set(expected)) or sorted(k for k in found if found[k] != expected[k])
        raise UsageError(
            f"the adapter does not fit the base model ({len(wrong)} tensors differ, e.g. {wrong[0]!r}): "
            "was it saved from another --model?"
        )
    with quiet_peft():
        return peft.PeftModel.from_pretrained(base, str(folder))


def _meta_copy(base):
    return AutoModelForCausalLM.from_config(base.config)


def _shapes(model) -> dict[str, tuple[int, ...]]:
    params = dict(model.named_parameters())
    return {peft_name: tuple(params[name].shape) for peft_name, name in peft_names(model).items()}


def _shareable(folder: pathlib.Path) -> None:
    for path in folder.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; an export is meant to be shared
