"""Real model sizes without a download: published architecture configs shipped as presets, and config.json files.

The files under zero_train/assets/model_shapes/ are the `config.json` each model publishes on the Hugging Face
hub (shapes only: no weights, no tokenizer), copied from the repositories named in SHAPE_PRESETS. They let
`zero-train estimate --model llama-3-8b` count parameters and activations at the real size on the meta
device or on fake tensors; training them gives a randomly initialised model of that shape.

    config = shape_config("llama-3-8b")          # a transformers PretrainedConfig
    config = config_from_file("path/config.json")
"""

from __future__ import annotations

import contextlib
import difflib
import json
import pathlib

import torch
import transformers
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from zero_train.runtime.errors import UsageError

SHAPES_DIR = pathlib.Path(__file__).resolve().parents[1] / "assets" / "model_shapes"

SHAPE_PRESETS: dict[str, str] = {
    "gpt2-xl": "openai-community/gpt2-xl",
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-13b": "meta-llama/Llama-2-13b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
}
"""Preset name -> the hub repository whose config.json the shipped file copies."""

PUBLISHED_PARAMS: dict[str, int] = {
    "gpt2-xl": 1_557_611_200,
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,
}
"""Parameter counts of the published checkpoints (tied embeddings once), which the shipped shapes reproduce
(tests/hf/test_shapes.py). Qwen2.5-7B's model card rounds to 7.61B total, 6.53B without embeddings."""


def shape_config(name: str) -> transformers.PretrainedConfig:
    """The published config of a shape preset (a key of SHAPE_PRESETS)."""
    if name not in SHAPE_PRESETS:
        raise UsageError(f"unknown model shape {name!r}; one of {', '.join(SHAPE_PRESETS)}")
    return config_from_file(SHAPES_DIR / f"{name}.json")


def config_from_file(path: str | pathlib.Path) -> transformers.PretrainedConfig:
    """A causal LM's config from a config.json file.

    Args:
        path: a JSON file as `save_pretrained` writes it (model_type and the architecture's fields).

    Returns:
        The transformers.PretrainedConfig.

    Raises:
        UsageError: not readable, not a JSON object, no or an unknown model_type, or not a causal LM.
    """
    path = pathlib.Path(path).expanduser()
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(
            f"cannot read {str(path)!r} as a config.json: {type(exc).__name__}; "
            "pass the config.json of a causal LM (or its folder)"
        ) from exc
    if not isinstance(settings, dict) or not isinstance(settings.get("model_type"), str):
        raise UsageError(
            f"{str(path)!r} has no model_type; pass the config.json of a causal LM (or its folder)"
        )
    model_type = settings.pop("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise UsageError(
            f"{str(path)!r}: model_type {model_type!r} is unknown to transformers "
            f"{transformers.__version__}; pass a causal LM's config.json"
        )
    check_config_keys(settings, model_type, str(path))
    with config_errors_as_usage(f"{str(path)!r} is not a valid {model_type} config"):
        config = transformers.AutoConfig.for_model(model_type, **settings)
    check_causal_lm(config, str(path))
    return config


def check_causal_lm(config: transformers.PretrainedConfig, name: str) -> None:
    """Raise UsageError unless AutoModelForCausalLM can build `config` (what every engine trains)."""
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UsageError(
            f"{name!r} is a {config.model_type!r} config, not a causal LM (AutoModelForCausalLM cannot build it); "
            "pass a causal LM such as gpt2, llama, mistral or qwen2"
        )


CONFIG_FILE_KEYS = (
    "architectures",
    "transformers_version",
    "_name_or_path",
    "auto_map",
    "torch_dtype",
    "dtype",
)
"""Keys save_pretrained writes that no config class lists among its attributes."""


def check_config_keys(settings: dict, model_type: str, where: str) -> None:
    """UsageError for a key that is a typo of one the config class knows (`num_hiden_layers`): transformers would
    keep it as a stray attribute and build the class default's 32 layers. Other unknown keys stay (remote code
    and newer transformers versions read their own)."""
    config_class = transformers.CONFIG_MAPPING[model_type]
    known = (
        set(config_class().to_dict())
        | set(getattr(config_class, "attribute_map", {}))
        | set(CONFIG_FILE_KEYS)
    )
    for key in settings:
        guess = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.85) if key not in known else []
        if guess:
            raise UsageError(f"{where}: unknown {model_type} config key {key!r}; did you mean {guess[0]!r}?")


@contextlib.contextmanager
def config_errors_as_usage(what: str):
    """transformers' config validation as one line: ValueError, TypeError, or huggingface_hub's strict-dataclass
    validation errors (transformers 5 validates an architecture when its config is built)."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - the classes differ by version; a bug would not pass the filter
        if not isinstance(exc, (TypeError, ValueError)) and "Validation" not in type(exc).__name__:
            raise
        cause = exc.__cause__ if "Validation" in type(exc).__name__ and exc.__cause__ is not None else exc
        raise UsageError(f"{what}: {' '.join(str(cause).split()) or type(cause).__name__}") from None


def check_buildable(config: transformers.PretrainedConfig, where: str) -> None:
    """Build the model on the meta device (no memory, no weights) so that transformers' own validation (a hidden
    size that the heads do not divide, ...) is one line now, before any rank starts work."""
    try:
        with torch.device("meta"):
            transformers.AutoModelForCausalLM.from_config(config)
    except (ValueError, AssertionError, TypeError, KeyError) as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(
            f"{where}: transformers cannot build this {config.model_type} model: {text}"
        ) from None
