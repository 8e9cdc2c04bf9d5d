"""The files an engine writes inside a checkpoint's staging dir.

    model/config.json          the HF config (rank 0)
    model/model.safetensors    full weights, tied tensors once (rank 0; ddp, zero1, zero2, torch-zero, fsdp2)
    model/adapter_model.safetensors, model/adapter_config.json
                               instead, in a LoRA run: the adapters alone, a PEFT adapter folder (rank 0, every
                               engine; the frozen base is the run's --model, never saved again)
    optim/rank-00000.pt ...    per rank: client_state and engine counters; plus the optimizer state
                               (zero1: this rank's shard; ddp/torch-zero: consolidated, on rank 0 only)
    deepspeed/state/           DeepSpeed's own save_checkpoint output (deepspeed engine)
    deepspeed/universal/       its universal conversion, made on the first resume at another world size

Everything we read is read with torch.load(weights_only=True) or safetensors; DeepSpeed's own files, which
DeepSpeed unpickles itself, are scanned first (refuse_unexpected_pickles): no pickled code runs.
"""

from __future__ import annotations

import pathlib
from typing import Any

import torch
from safetensors.torch import load_file

from zero_train.checkpoint.atomic import safe_torch_load
from zero_train.checkpoint.writes import StagedWrites
from zero_train.hf.lora import adapter_config_json, from_peft_state_dict, is_lora, to_peft_state_dict
from zero_train.runtime.errors import UsageError

MODEL_DIR = "model"
WEIGHTS_FILE = "model.safetensors"
ADAPTER_FILE = "adapter_model.safetensors"  # peft's names (SAFETENSORS_WEIGHTS_NAME, CONFIG_NAME)
ADAPTER_CONFIG = "adapter_config.json"
OPTIM_DIR = "optim"
DEEPSPEED_DIR = "deepspeed"  # DeepSpeed's own save_checkpoint output (deepspeed engine)
# the only non-tensor classes DeepSpeed 0.19 pickles into its checkpoint files, universal ones included (found
# by scanning ZeRO-0/1/2/3 fp32/bf16 checkpoints with torch.serialization.get_unsafe_globals_in_checkpoint)
DEEPSPEED_PICKLE_GLOBALS = {
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
}


def rank_file(path, rank: int) -> pathlib.Path:
    """`<path>/optim/rank-XXXXX.pt`, this rank's optimizer/client-state file."""
    return pathlib.Path(path) / OPTIM_DIR / f"rank-{rank:05d}.pt"


def save_rank_file(writes: StagedWrites, rank: int, payload: dict[str, Any]) -> None:
    """Hand `payload` (tensors, numbers, strings, containers of them) to `writes` as this rank's file."""
    writes.torch_save(f"{OPTIM_DIR}/rank-{rank:05d}.pt", payload)


def load_rank_file(path, rank: int, *, mmap: bool = False) -> dict[str, Any]:
    """Read a rank file with weights_only loading (UsageError if missing or refused); mmap: map it, read lazily."""
    target = rank_file(path, rank)
    if not target.is_file():
        raise UsageError(
            f"checkpoint {path} has no {target.relative_to(path)}; was it saved by another engine?"
        )
    return safe_load(target, mmap=mmap)


def safe_load(target: pathlib.Path, *, mmap: bool = False) -> Any:
    """torch.load(weights_only=True) on CPU (zero_train.checkpoint.atomic.safe_torch_load: code-running pickles refused)."""
    return safe_torch_load(target, mmap=mmap)


def refuse_unexpected_pickles(ds_dir) -> None:
    """Refuse DeepSpeed checkpoint files that reference anything but tensors and DeepSpeed's own records.

    DeepSpeed loads its files with torch.load(weights_only=False); scanning the pickles' globals first
    (cheap: no tensor is read) keeps a planted pickle from running code. Every `*.pt` below `ds_dir` is
    scanned (a universal checkpoint keeps one folder per parameter).

    Raises:
        UsageError: naming the file and the unexpected global (or the file that is not a pickle at all).
    """
    for file in sorted(pathlib.Path(ds_dir).rglob("*.pt")):
        try:
            found = set(torch.serialization.get_unsafe_globals_in_checkpoint(file))
        except Exception as err:  # noqa: BLE001 - not a zip/pickle at all: truncated or garbage
            detail = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise UsageError(f"cannot read DeepSpeed checkpoint file {file}: {detail}") from err
        unexpected = found - DEEPSPEED_PICKLE_GLOBALS
        if unexpected:
            raise UsageError(
                f"refusing to load {file}: it references {sorted(unexpected)[0]!r}, which a "
                "DeepSpeed checkpoint never contains (tampered or not a checkpoint)"
            )


def saved_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint keeps of the model, by state-dict name (the tensors themselves, each once).

    Every tensor of the state dict, a tied one under its first name only (as HF saves); for a LoRA (peft)
    model only the trainable adapters: the frozen base is the run's --model, rebuilt on resume.
    """
    if is_lora(model):
        return {name: param for name, param in model.named_parameters() if param.requires_grad}
    seen: set[int] = set()
    result: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            result[name] = tensor
    return result


def unique_state_dict(model: torch.nn.Module, replace: dict[int, torch.Tensor] | None = None) -> dict:
    """What a checkpoint keeps of the model (saved_tensors), detached, on CPU.

    Args:
        model: the (unwrapped) model.
        replace: id(parameter) -> tensor to store instead (the fp32 master copy of that parameter).

    Returns:
        name -> tensor, in state_dict order, the first name of a shared tensor kept (as HF saves).
    """
    replace = replace or {}
    return {
        name: replace.get(id(tensor), tensor).detach().to("cpu", copy=True).contiguous()
        for name, tensor in saved_tensors(model).items()
    }


def write_model(
    writes: StagedWrites, model: torch.nn.Module, state_dict: dict[str, torch.Tensor] | None
) -> None:
    """Rank 0: model/config.json and, if given, the weights (handed to `writes`).

    A LoRA model's `state_dict` (its adapters, by the model's names) becomes a PEFT adapter folder:
    adapter_config.json + adapter_model.safetensors under peft's names, loadable by PeftModel.from_pretrained.
    """
    if getattr(model, "config", None) is not None:
        writes.text(f"{MODEL_DIR}/config.json", model.config.to_json_string(use_diff=True))
    if is_lora(model):
        writes.text(f"{MODEL_DIR}/{ADAPTER_CONFIG}", adapter_config_json(model))
        if state_dict is not None:
            adapters = to_peft_state_dict(model, state_dict)
            writes.safetensors(f"{MODEL_DIR}/{ADAPTER_FILE}", adapters, metadata={"format": "pt"})
    elif state_dict is not None:
        writes.safetensors(f"{MODEL_DIR}/{WEIGHTS_FILE}", state_dict, metadata={"format": "pt"})


def read_weights(path, model: torch.nn.Module | None = None) -> dict[str, torch.Tensor]:
    """The weights a checkpoint holds, by the model's state-dict names (UsageError if missing or unreadable).

    model/model.safetensors; for a LoRA model, model/adapter_model.safetensors renamed to the model's names.
    """
    lora = model is not None and is_lora(model)
    target = pathlib.Path(path) / MODEL_DIR / (ADAPTER_FILE if lora else WEIGHTS_FILE)
    if not target.is_file():
        what = "a LoRA run (--lora-r)" if lora else "a run training every weight (no --lora-r)"
        raise UsageError(
            f"checkpoint {path} has no {MODEL_DIR}/{target.name}; resume it with the engine and settings it "
            f"was saved with (this is {what})"
        )
    try:
        weights = load_file(str(target))
    except Exception as err:  # safetensors raises its own error types for truncated/corrupt files
        raise UsageError(f"cannot read {target}: {str(err).splitlines()[0]}") from err
    return from_peft_state_dict(model, weights) if lora else weights


def copy_weights_into(
    model: torch.nn.Module, weights: dict[str, torch.Tensor], targets: dict[int, torch.Tensor] | None = None
) -> None:
    """Copy saved weights (read_weights) into the model (or into `targets[id(param)]`, e.g. the fp32 masters).

    Raises:
        UsageError: a tensor is missing or has another shape (a checkpoint of a different model).
    """
    targets = targets or {}
    with torch.no_grad():
        for name, tensor in saved_tensors(model).items():
            if name not in weights:
                raise UsageError(f"checkpoint weights lack {name!r}: it was saved from a different model")
            saved = weights[name]
            if saved.shape != tensor.shape:
                raise UsageError(
                    f"checkpoint weight {name!r} has shape {tuple(saved.shape)}, the model "
                    f"{tuple(tensor.shape)}: it was saved from a different model"
                )
            targets.get(id(tensor), tensor).copy_(saved)


def read_elements(handle, name: str, offset: int, length: int) -> torch.Tensor:
    """Elements [offset, offset + length) of tensor `name` (flattened) of an open safetensors file.

    Reads only the rows that hold them (`safe_open(...).get_slice`), so a rank re-sharding a checkpoint reads
    its pieces, not the whole tensor.

    Args:
        handle: `safetensors.safe_open(path, "pt")`.
        name: the tensor's key.
        offset, length: the elements wanted, in the flattened tensor.
    """
    view = handle.get_slice(name)
    shape = list(view.get_shape())
    if len(shape) < 2:
        return handle.get_tensor(name).reshape(-1)[offset : offset + length]
    row = int(torch.Size(shape[1:]).numel())
    first, last = offset // row, (offset + length - 1) // row + 1
    start = offset - first * row
    return view[first:last].reshape(-1)[start : start + length]
