"""LoRA adapters (peft) on a Hugging Face causal LM: the peft config, the wrapped model, adapter state dicts.

    spec = LoraSpec(r=16, alpha=32.0)
    model = apply_lora(build_model(config), spec)       # a peft PeftModel: base frozen, adapters trainable
    lora_shapes(config, spec)                            # the same on the meta device: what gets adapters, sizes
    peft_names(model)                                    # PEFT's saved name -> the model's parameter name

The adapters are peft's own (`LoraConfig` + `get_peft_model`), so what a run saves loads with
`PeftModel.from_pretrained` and merges with `merge_and_unload`. Target modules default to peft's choice for
the architecture (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: GPT-2's c_attn, Llama's q_proj and
v_proj), else "all-linear" (every linear layer of the attention and the MLP, the output head excluded).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM
from transformers.pytorch_utils import Conv1D

from zero_train.runtime.errors import UsageError

ADAPTER_NAME = "default"  # peft's name of the one adapter; its saved names drop it (lora_A.default -> lora_A)
ALL_LINEAR = "all-linear"


@dataclass(frozen=True, kw_only=True, slots=True)
class LoraSpec:
    """The adapters of a run (zero_train.train.config.LoraConfig, as the layers below train see it)."""

    r: int
    """Rank of every adapter (> 0)."""
    alpha: float = 8.0
    """Scaling numerator: the adapter's update is scaled by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: tuple[str, ...] | None = None
    """Module names (peft's matching: a name or a suffix), ("all-linear",), or None: peft's default for the
    architecture, else all-linear."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"LoraSpec.r must be >= 1 (got {self.r}); r = 0 means no adapters at all")


@dataclass(frozen=True, kw_only=True, slots=True)
class LoraShapes:
    """What a LoraSpec adds to a model, from a model on the meta device (no memory, no time)."""

    targets: tuple[str, ...]
    """The modules that got an adapter (full names)."""
    adapter_params: int
    """Parameters of all adapters (r x (in + out) per target)."""
    base_params: int
    """Parameters of the frozen base (each tied tensor once)."""
    adapter_tensors: int
    """Adapter tensors (two per target: lora_A, lora_B)."""


def load_peft():
    """The peft package, imported on first use: the one place this package imports it (LoRA runs and exports
    only; every training run imports this module for is_lora and LoraSpec)."""
    # expensive: peft (seconds), only LoRA runs and exports need it
    import peft

    return peft


def target_modules(spec: LoraSpec, model_type: str) -> list[str] | str | None:
    """peft's target_modules for `spec` on an architecture (None: peft's own default for it)."""
    if spec.target_modules is None:
        defaults = load_peft().utils.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
        return None if model_type in defaults else ALL_LINEAR
    if len(spec.target_modules) == 1 and spec.target_modules[0].lower() == ALL_LINEAR:
        return ALL_LINEAR
    return list(spec.target_modules)


def peft_config(spec: LoraSpec, model: torch.nn.Module):
    """peft's LoraConfig for `spec` on `model` (a transformers causal LM, on any device)."""
    peft = load_peft()
    return peft.LoraConfig(
        task_type=peft.TaskType.CAUSAL_LM,
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=target_modules(spec, model.config.model_type),
        # GPT-2's projections are Conv1D (weight stored transposed); peft would otherwise warn and switch it on
        fan_in_fan_out=any(isinstance(module, Conv1D) for module in model.modules()),
    )


def apply_lora(model: torch.nn.Module, spec: LoraSpec, *, base_name: str | None = None):
    """`model` wrapped by peft: every base weight frozen, adapters (lora_A random, lora_B zero) trainable.

    Args:
        model: a transformers causal LM (built under deepspeed.zero.Init too: peft reads ZeRO-3's ds_shape).
        spec: the adapters.
        base_name: what adapter_config.json names as the base model (default: the config's _name_or_path).

    Returns:
        A peft PeftModelForCausalLM (its forward takes input_ids and labels as the model's does).

    Raises:
        UsageError: a target module names nothing in the model (peft's message, one line).
    """
    if base_name is not None:
        model.config._name_or_path = base_name  # peft writes it as base_model_name_or_path
    config = peft_config(spec, model)
    try:
        with quiet_peft():
            return load_peft().get_peft_model(model, config)
    except ValueError as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UsageError(f"--lora-target-modules: {first}") from None


@contextlib.contextmanager
def quiet_peft():
    """Around peft's model wrapping: it asks transformers through a name transformers 5 deprecates (a
    FutureWarning per call that says nothing about the run)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def lora_shapes(hf_config, spec: LoraSpec) -> LoraShapes:
    """Targets and sizes of `spec` on the model of `hf_config`, built on the meta device (UsageError as apply_lora).

    Call it with no ZeRO-3 HfDeepSpeedConfig alive (transformers would build the model under zero.Init).
    """
    with torch.device("meta"):
        model = apply_lora(AutoModelForCausalLM.from_config(hf_config), spec)
    trainable = {id(p): p for p in model.parameters() if p.requires_grad}
    frozen = {id(p): p for p in model.parameters() if not p.requires_grad}
    targets = tuple(
        name for name, module in model.named_modules() if hasattr(module, "lora_A") and module.lora_A
    )
    return LoraShapes(
        targets=targets,
        adapter_params=sum(p.numel() for p in trainable.values()),
        base_params=sum(p.numel() for p in frozen.values()),
        adapter_tensors=len(trainable),
    )


def is_lora(model: torch.nn.Module) -> bool:
    """Whether `model` is a peft model (its trainable parameters are adapters)."""
    return hasattr(model, "peft_config") and hasattr(model, "base_model")


def peft_names(model: torch.nn.Module) -> dict[str, str]:
    """PEFT's saved name (adapter_model.safetensors) -> the model's state-dict name, for every adapter tensor.

    peft's own get_peft_model_state_dict does the renaming (it drops the adapter name); it passes the values
    through, so each renamed entry is matched to its parameter by identity.
    """
    trainable = {name: param for name, param in model.named_parameters() if param.requires_grad}
    by_id = {id(param): name for name, param in trainable.items()}
    saved = load_peft().get_peft_model_state_dict(model, state_dict=trainable, save_embedding_layers=False)
    names = {peft_name: by_id[id(value)] for peft_name, value in saved.items() if id(value) in by_id}
    if len(names) != len(trainable):
        missing = sorted(set(trainable) - set(names.values()))
        raise AssertionError(f"peft does not save the trainable tensors {missing[:2]}")
    return names


def to_peft_state_dict(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Model-named adapter weights -> PEFT's saved names (what adapter_model.safetensors holds)."""
    return {peft_name: weights[name] for peft_name, name in peft_names(model).items()}


def from_peft_state_dict(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """PEFT-named adapter weights (a saved adapter) -> the model's names (UsageError if one is missing)."""
    names = peft_names(model)
    missing = sorted(set(names) - set(saved))
    if missing:
        raise UsageError(
            f"the saved adapter lacks {missing[0]!r} ({len(missing)} tensors): it was saved with other "
            "--lora-target-modules or another model"
        )
    return {name: saved[peft_name] for peft_name, name in names.items()}


def adapter_config_json(model: torch.nn.Module) -> str:
    """adapter_config.json of a peft model, as PeftModel.save_pretrained writes it (inference_mode true)."""
    config = model.peft_config[ADAPTER_NAME].to_dict()
    config = {key: sorted(value) if isinstance(value, set) else value for key, value in config.items()}
    config["inference_mode"] = True
    return json.dumps(config, indent=2, sort_keys=True)
