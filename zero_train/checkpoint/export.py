"""Export a trained model as a normal Hugging Face folder: config.json, model.safetensors, tokenizer files.

    export_checkpoint("runs/x/ckpt", "out/hf")              # a checkpoint of any engine, ZeRO-3 included
    export_model(state_dict, config, tokenizer, "out/hf")    # what the train loop's --export-hf calls (rank 0)
    AutoModelForCausalLM.from_pretrained("out/hf")           # same logits as the trained model

Weights come from the checkpoint's `model/model.safetensors` (ddp, zero1, torch-zero: full weights written by
rank 0) or, for the deepspeed engine, from DeepSpeed's own checkpoint (zero_train.checkpoint.deepspeed_weights:
DeepSpeed's zero_to_fp32 reassembles the fp32 master weights from every rank's optimizer shard).

Export writes tensors straight to safetensors (no model is instantiated: under an active ZeRO-3
HfDeepSpeedConfig, building one would start deepspeed.zero.Init on one rank only). A tied tensor (GPT-2's
lm_head = wte) is stored once under its first name, as save_pretrained does; from_pretrained re-ties it.
The folder is written to a temporary sibling and renamed into place, so no partial export is ever left.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import uuid

import torch
from safetensors.torch import load_file, save_file
from transformers import CONFIG_MAPPING, AutoConfig, AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.utils import logging as hf_logging

from zero_train.checkpoint import atomic as checkpoint
from zero_train.checkpoint.files import ADAPTER_CONFIG, DEEPSPEED_DIR, MODEL_DIR, WEIGHTS_FILE
from zero_train.checkpoint.resume import RUN_FILE, read_run_info
from zero_train.checkpoint.rotation import reading
from zero_train.hf.models import load_tokenizer
from zero_train.runtime.errors import UsageError
from zero_train.runtime.outputs import check_output_dir


def check_export_dir(out_dir, *, force: bool = False) -> pathlib.Path:
    """UsageError unless `out_dir` is absent, empty, or `force` allows replacing it (call before training).

    Returns:
        out_dir as a Path.
    """

    out = pathlib.Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"export target {str(out)!r} is a file; pass a folder path")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UsageError(
            f"export folder {str(out)!r} is not empty; pass --force to replace it or choose another"
        )
    check_output_dir(out, flag="export folder")  # writable, or creatable: before any work
    return out


GENERATION_FILE = "generation_config.json"


def export_model(
    model_or_state_dict,
    config,
    tokenizer,
    out_dir,
    *,
    dtype: torch.dtype | None = None,
    force: bool = False,
    verify: bool = False,
    generation_config: str | None = None,
) -> pathlib.Path:
    """Write config.json + model.safetensors + tokenizer files (+ generation_config.json) to `out_dir` (atomically).

    Args:
        model_or_state_dict: an (unwrapped, full) torch.nn.Module or its state dict (e.g. an engine's
            full_state_dict() on rank 0).
        config: the model's transformers.PretrainedConfig.
        tokenizer: a tokenizer object, a spec for hf.load_tokenizer (folder, hub id), or None for the
            offline default.
        out_dir: target folder; must be absent or empty unless `force`.
        dtype: cast floating tensors to this dtype (default: keep the saved dtype).
        force: replace a non-empty out_dir.
        generation_config: the text of a generation_config.json to write beside them (the checkpoint's).
        verify: before publishing the folder, load it with AutoModelForCausalLM.from_pretrained and
            check every weight (not under an active ZeRO-3 HfDeepSpeedConfig: loading would partition).

    Returns:
        out_dir as a Path.
    """
    out = check_export_dir(out_dir, force=force)
    if isinstance(tokenizer, (str, type(None))):
        tokenizer = load_tokenizer(tokenizer)
    weights = _unique_tensors(_state_dict_of(model_or_state_dict), dtype=dtype)
    if len(tokenizer) > config.vocab_size:
        raise UsageError(
            f"tokenizer has {len(tokenizer)} tokens but the model embeds {config.vocab_size}; "
            "export with the tokenizer it was trained with"
        )
    with staging_dir(out) as staging:
        _write_weights(weights, staging)
        _write_config(config, _floating_dtype(weights), staging)
        tokenizer.save_pretrained(str(staging))
        if generation_config is not None:
            (staging / GENERATION_FILE).write_text(generation_config, encoding="utf-8")
        for path in staging.iterdir():
            path.chmod(0o644)  # safetensors writes 0600; an export is meant to be shared
        if verify:
            _verify_folder(staging, weights)
    return out


def _verify_folder(folder: pathlib.Path, weights: dict[str, torch.Tensor]) -> None:
    """UsageError unless from_pretrained(folder) loads every weight, unchanged, with nothing left over."""
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # transformers prints its own load report; ours is one line
    hf_logging.disable_progress_bar()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(folder), output_loading_info=True, ignore_mismatched_sizes=True
        )
    except (RuntimeError, ValueError, OSError) as err:
        raise UsageError(f"the weights do not fit the model config ({_first_line(err)})") from err
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    problems = {key: sorted(map(str, info.get(key) or [])) for key in ("missing_keys", "unexpected_keys")}
    problems["mismatched_shapes"] = sorted(str(item[0]) for item in info.get("mismatched_keys") or [])
    loaded = model.state_dict()
    comparable = [n for n in weights if n in loaded and loaded[n].shape == weights[n].shape]
    problems["changed"] = sorted(n for n in comparable if not torch.equal(loaded[n], weights[n]))
    problems = {key: names for key, names in problems.items() if names}
    if problems:
        detail = "; ".join(
            f"{len(names)} {key} ({', '.join(names[:2])}, ...)" for key, names in problems.items()
        )
        raise UsageError(
            f"the weights do not fit the model config: {detail}; was the checkpoint saved by another model?"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _state_dict_of(model_or_state_dict) -> dict[str, torch.Tensor]:
    if isinstance(model_or_state_dict, torch.nn.Module):
        return model_or_state_dict.state_dict()
    if not isinstance(model_or_state_dict, dict) or not model_or_state_dict:
        raise UsageError("export_model needs a model or a non-empty state dict")
    return model_or_state_dict


def _unique_tensors(state_dict: dict, *, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Each shared tensor once (first name wins), detached, contiguous, on CPU, optionally cast."""
    seen: set[tuple] = set()
    result = {}
    for name, tensor in state_dict.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen and tensor.numel() > 0:
            continue
        seen.add(key)
        value = tensor.detach().to("cpu")
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        result[name] = value.contiguous().clone()
    return result


def _floating_dtype(weights: dict[str, torch.Tensor]) -> torch.dtype:
    """The dtype holding most floating elements (what config.json reports as the model's dtype)."""
    counts: dict[torch.dtype, int] = {}
    for tensor in weights.values():
        if tensor.is_floating_point():
            counts[tensor.dtype] = counts.get(tensor.dtype, 0) + tensor.numel()
    return max(counts, key=counts.get) if counts else torch.float32


def _write_weights(weights: dict[str, torch.Tensor], folder: pathlib.Path) -> None:
    save_file(weights, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})


def _write_config(config, dtype: torch.dtype, folder: pathlib.Path) -> None:
    """config.json with `architectures` (read by pipelines and serving tools) and the weights' dtype."""
    config = config.__class__.from_dict(config.to_dict())  # a copy: the caller's config stays untouched
    architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if architecture is not None:
        config.architectures = [architecture]
    config.dtype = dtype
    config.save_pretrained(str(folder))


@contextlib.contextmanager
def staging_dir(out: pathlib.Path):
    """Yield an empty sibling folder; on success swap it in for `out`, on failure delete it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        yield staging
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        if out.exists():
            os.replace(out, old)
        os.replace(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def export_checkpoint(
    ckpt_dir, out_dir, *, tokenizer=None, dtype: torch.dtype | None = None, force: bool = False
) -> pathlib.Path:
    """Export a training checkpoint (any engine, any ZeRO stage) as a Hugging Face folder.

    Args:
        ckpt_dir: a checkpoint folder (step-XXXXXXXX) or a save dir (its `latest` is followed).
        out_dir: target folder; must be absent or empty unless `force`.
        tokenizer: override the tokenizer recorded in the checkpoint's run.json (a folder or hub id).
        dtype: cast the weights (default: as saved; DeepSpeed checkpoints give the fp32 master weights).
        force: replace a non-empty out_dir.

    Returns:
        out_dir as a Path.
    """
    check_export_dir(out_dir, force=force)
    ckpt = checkpoint.resolve(ckpt_dir)
    if (ckpt / MODEL_DIR / ADAPTER_CONFIG).is_file():
        raise UsageError(
            f"checkpoint {str(ckpt)!r} is a LoRA run's: export it with zero_train.checkpoint.export_lora "
            "(`zero-train export` does)"
        )

    with reading(ckpt):  # a training run's --save-total-limit keeps it until it is read
        run = read_run_info(ckpt)
        config = _read_config(ckpt, run)
        weights = _read_weights(ckpt)
        tokenizer_spec = tokenizer if tokenizer is not None else own_tokenizer(ckpt, run)
        if tokenizer_spec is not None and not isinstance(tokenizer_spec, str):
            raise UsageError(
                f"{RUN_FILE} records tokenizer {tokenizer_spec!r}; pass --tokenizer FOLDER_OR_HUB_ID"
            )
        tokens = load_tokenizer(tokenizer_spec)
        generation = ckpt / MODEL_DIR / GENERATION_FILE
        generation_text = generation.read_text(encoding="utf-8") if generation.is_file() else None
    return export_model(
        weights,
        config,
        tokens,
        out_dir,
        dtype=dtype,
        force=force,
        verify=True,
        generation_config=generation_text,
    )


def own_tokenizer(ckpt: pathlib.Path, run: dict) -> str | None:
    """The tokenizer a checkpoint carries (model/, as the HF Trainer's checkpoints do), else the one run.json
    records (checkpoints of older versions: a folder, a hub id, or None for the offline default)."""
    if (ckpt / MODEL_DIR / "tokenizer_config.json").is_file():
        return str(ckpt / MODEL_DIR)
    return run.get("tokenizer")


def _read_config(ckpt: pathlib.Path, run: dict):
    """model/config.json (written by every engine), else the config dict recorded in run.json."""
    if (ckpt / MODEL_DIR / "config.json").is_file():
        return AutoConfig.from_pretrained(str(ckpt / MODEL_DIR))
    recorded = run.get("model_config")
    if isinstance(recorded, dict) and recorded.get("model_type") in CONFIG_MAPPING:
        return CONFIG_MAPPING[recorded["model_type"]].from_dict(recorded)
    raise UsageError(
        f"checkpoint {str(ckpt)!r} has no {MODEL_DIR}/config.json nor a model config in {RUN_FILE}; "
        "is it a zero_train checkpoint?"
    )


def _read_weights(ckpt: pathlib.Path) -> dict[str, torch.Tensor]:
    weights_file = ckpt / MODEL_DIR / WEIGHTS_FILE
    if weights_file.is_file():
        return load_file(str(weights_file))
    if (ckpt / DEEPSPEED_DIR).is_dir():
        # expensive: DeepSpeed (seconds), only a DeepSpeed checkpoint needs it
        from zero_train.checkpoint.deepspeed_weights import deepspeed_state_dict

        return deepspeed_state_dict(ckpt / DEEPSPEED_DIR)
    raise UsageError(
        f"checkpoint {str(ckpt)!r} has neither {MODEL_DIR}/{WEIGHTS_FILE} nor {DEEPSPEED_DIR}/; "
        "was the save interrupted? (pick a complete one: the save dir's `latest`)"
    )
