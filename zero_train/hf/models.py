"""Hugging Face models and tokenizers: built-in presets (random init, no download), local folders, hub ids.

    config = model_config("tiny")                 # a transformers PretrainedConfig
    model = build_model(config)                   # random init, deterministic under torch.manual_seed
    model = load_model("out/export")              # a folder written by save_pretrained
    tokenizer = load_tokenizer()                  # the offline default BPE tokenizer (see zero_train.hf.offline)

Presets use the offline tokenizer's vocabulary (OFFLINE_VOCAB_SIZE) unless `vocab_size` is given, so a
preset model and the default tokenizer always agree. Models are built through
`AutoModelForCausalLM.from_config`, so transformers' DeepSpeed integration applies: under an active
`HfDeepSpeedConfig` with ZeRO-3 the model is created inside `deepspeed.zero.Init` and no rank ever
holds all of it.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import json
import os
import pathlib

import torch
import transformers
from huggingface_hub.errors import HFValidationError
from transformers import CONFIG_MAPPING, AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.configuration_auto import model_type_to_module_name

from zero_train.hf import hub
from zero_train.hf.offline import (
    DEFAULT_TOKENIZER_NAME,
    EOS_TOKEN_ID,
    OFFLINE_VOCAB_SIZE,
    default_tokenizer_dir,
)
from zero_train.hf.shapes import (
    SHAPE_PRESETS,
    check_causal_lm,
    check_config_keys,
    config_errors_as_usage,
    config_from_file,
    shape_config,
)
from zero_train.runtime.errors import UsageError

# No dropout: like modern pretraining (and Llama), and it keeps engine comparisons and resumed runs
# independent of RNG streams.
_NO_DROPOUT = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def _gpt2(layers: int, width: int, heads: int, context: int, **extra) -> dict:
    """A GPT-2 block's config kwargs: layers x width, heads, context positions."""
    return dict(
        model_type="gpt2",
        n_layer=layers,
        n_embd=width,
        n_head=heads,
        n_positions=context,
        **extra,
        **_NO_DROPOUT,
    )


def _rope(
    model_type: str, layers: int, width: int, mlp: int, heads: tuple[int, int], context: int, *, tied: bool
) -> dict:
    """A Llama-style block's (RMSNorm, SwiGLU, RoPE; Qwen2 adds q/k/v biases) config kwargs: layers x width,
    the MLP's width, (query, key/value) heads, context positions, tied embeddings or not."""
    return dict(
        model_type=model_type,
        num_hidden_layers=layers,
        hidden_size=width,
        intermediate_size=mlp,
        num_attention_heads=heads[0],
        num_key_value_heads=heads[1],
        max_position_embeddings=context,
        tie_word_embeddings=tied,
    )


# name -> HF config kwargs (with "model_type"). Parameter counts at the default vocab (8192) are in
# PRESET_SUMMARY and checked against hand arithmetic by tests/hf/test_models.py.
PRESETS: dict[str, dict] = {
    "tiny": _gpt2(2, 64, 4, 256, n_inner=256),
    "gpt2-25m": _gpt2(12, 384, 6, 1024),
    "gpt2-small": _gpt2(12, 768, 12, 1024),  # GPT-2 124M's shape; 124M params at vocab 50257
    "llama-tiny": _rope("llama", 2, 64, 176, (4, 2), 256, tied=True),
    "llama-60m": _rope("llama", 10, 640, 1728, (10, 10), 1024, tied=False),
    "qwen2-tiny": _rope("qwen2", 2, 64, 176, (4, 2), 256, tied=True),  # Qwen2's block, small
}

PRESET_SUMMARY: dict[str, str] = {
    "tiny": "GPT-2 shaped, 2 layers x 64, 256 context; 0.64M params; for tests",
    "gpt2-25m": "GPT-2 shaped, 12 layers x 384, 1024 context; 24.8M params; for benchmarks",
    "gpt2-small": "GPT-2 small shape, 12 layers x 768, 1024 context; 92.1M params (124.4M at vocab 50257)",
    "llama-tiny": "Llama shaped (RMSNorm, SwiGLU, RoPE, GQA 4/2 heads), 2 layers x 64, tied; 0.62M params",
    "llama-60m": "Llama shaped, 10 layers x 640, 1024 context, untied; 60.1M params",
    "qwen2-tiny": "Qwen2 shaped (q/k/v biases, GQA 4/2 heads), 2 layers x 64, tied; 0.62M params",
}

_CONTEXT_KEYS = ("n_positions", "max_position_embeddings", "n_ctx", "max_sequence_length", "seq_length")


def _special_token_kwargs(model_type: str) -> dict:
    """bos/eos ids of the offline tokenizer (GPT-2's defaults, 50256, would be out of range at 8192)."""
    ids = dict(bos_token_id=EOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID)
    if model_type in ("llama", "qwen2"):
        ids["pad_token_id"] = None
    return ids


def model_config(name_or_path: str, *, vocab_size: int | None = None) -> transformers.PretrainedConfig:
    """The HF config of a preset, a published shape, a config.json file, a save_pretrained folder, or a hub id.

    Args:
        name_or_path: a key of PRESETS or of SHAPE_PRESETS (zero_train.hf.shapes: published configs, their
            own vocabulary), a config.json file, a folder with config.json, or a hub id.
        vocab_size: the tokenizer's vocabulary size. Presets take it as their vocab (default
            OFFLINE_VOCAB_SIZE); for saved models it must not exceed the model's embedding rows.

    Returns:
        A transformers.PretrainedConfig.
    """
    if name_or_path in PRESETS:
        kwargs = dict(PRESETS[name_or_path])
        model_type = kwargs.pop("model_type")
        kwargs.update(_special_token_kwargs(model_type))
        kwargs["vocab_size"] = vocab_size or OFFLINE_VOCAB_SIZE
        return CONFIG_MAPPING[model_type](**kwargs)
    if name_or_path in SHAPE_PRESETS:
        config = shape_config(name_or_path)
    elif pathlib.Path(name_or_path).expanduser().is_file():
        config = config_from_file(name_or_path)
    else:
        _check_local_path(name_or_path)
        _check_folder_keys(name_or_path)
        with _hub_errors_as_usage(name_or_path, "model"), config_errors_as_usage(f"model {name_or_path!r}"):
            config = hub.load(functools.partial(AutoConfig.from_pretrained, name_or_path), name_or_path)
        check_causal_lm(config, name_or_path)
    if vocab_size is not None and vocab_size > config.vocab_size:
        raise UsageError(
            f"tokenizer has {vocab_size} tokens but model {name_or_path!r} embeds only {config.vocab_size}; "
            "use the tokenizer the model was trained with (--tokenizer, default: the model's own)"
        )
    return config


def _check_folder_keys(name_or_path: str) -> None:
    """A save_pretrained folder's config.json keys, checked for typos as a config.json file's are."""
    path = pathlib.Path(name_or_path).expanduser() / "config.json"
    try:
        settings = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, UnicodeDecodeError, ValueError):
        return  # unreadable: AutoConfig's own one-line error follows
    if isinstance(settings, dict) and settings.get("model_type") in CONFIG_MAPPING:
        check_config_keys(
            {k: v for k, v in settings.items() if k != "model_type"}, settings["model_type"], str(path)
        )


def is_pretrained(name_or_path: str) -> bool:
    """Whether --model names pretrained weights (a save_pretrained folder or a hub id), to fine-tune with their own
    tokenizer and a fine-tuning lr; a preset, a published shape or a config.json file starts from random weights."""
    return not (
        name_or_path in PRESETS
        or name_or_path in SHAPE_PRESETS
        or pathlib.Path(name_or_path).expanduser().is_file()
    )


def import_model_module(name_or_path: str) -> None:
    """Import transformers' modeling module of a preset or shape preset (e.g. modeling_gpt2 for "tiny").

    build_model would import it anyway; an entry point imports it earlier, with its other imports, while the
    garbage collector is paused (zero_train.runtime.startup). Anything else (a folder, a hub id) is left to
    build_model: reading its config here could need the network.
    """
    if name_or_path in PRESETS:
        model_type = PRESETS[name_or_path]["model_type"]
    elif name_or_path in SHAPE_PRESETS:
        model_type = shape_config(name_or_path).model_type
    else:
        return

    module = model_type_to_module_name(model_type)
    with contextlib.suppress(ImportError):
        importlib.import_module(f"transformers.models.{module}.modeling_{module}")


def build_model(config: transformers.PretrainedConfig, *, dtype: torch.dtype = torch.float32):
    """A causal LM with random weights from `config` (deterministic under torch.manual_seed).

    Goes through AutoModelForCausalLM.from_config, so an enclosing HfDeepSpeedConfig (ZeRO-3) makes
    transformers build it inside deepspeed.zero.Init.

    Args:
        config: e.g. from model_config().
        dtype: parameter dtype.

    Returns:
        A transformers.PreTrainedModel.
    """
    return _causal_lm_loss(AutoModelForCausalLM.from_config(config, dtype=dtype))


def _causal_lm_loss(model):
    """Name the loss transformers uses anyway: class names like GPT2LMHeadModel don't match its
    `ForCausalLM` pattern, so every run would print "loss_type=None ... unrecognized" and fall back to it."""
    if getattr(model, "loss_type", None) is None:
        model.loss_type = "ForCausalLM"
    return model


def enable_gradient_checkpointing(model) -> None:
    """Activation checkpointing: keep only each block's input and recompute the block in backward.

    Hugging Face's `gradient_checkpointing_enable` with the non-reentrant torch.utils.checkpoint (the
    reentrant one needs inputs that require grad and runs hooks twice). Blocks recompute only in training
    mode (`model.training`); evaluation is unchanged. The KV cache is turned off (it cannot be recomputed).

    Args:
        model: a transformers.PreTrainedModel.

    Raises:
        UsageError: the architecture does not support gradient checkpointing.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise UsageError(
            f"{type(model).__name__} does not support gradient checkpointing; drop --gradient-checkpointing"
        )
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


def load_model(name_or_path: str, *, dtype: torch.dtype = torch.float32, vocab_size: int | None = None):
    """A preset, a published shape or a config.json file (random init), a save_pretrained folder or a hub id
    (pretrained weights).

    Args:
        name_or_path: preset or shape name, config.json file, folder, or hub id.
        dtype: parameter dtype.
        vocab_size: the tokenizer's vocabulary size (see model_config).

    Returns:
        A transformers.PreTrainedModel.
    """
    if is_random_init(name_or_path):
        return build_model(model_config(name_or_path, vocab_size=vocab_size), dtype=dtype)
    model_config(name_or_path, vocab_size=vocab_size)  # clear errors before loading weights
    with _hub_errors_as_usage(name_or_path, "model"):
        weights = functools.partial(AutoModelForCausalLM.from_pretrained, name_or_path, dtype=dtype)
        return _causal_lm_loss(hub.load(weights, name_or_path))


def is_random_init(name_or_path: str) -> bool:
    """Whether `--model name_or_path` starts from random weights (a preset, a published shape, a config.json)
    rather than pretrained ones (a save_pretrained folder, a hub id)."""
    return name_or_path in PRESETS or name_or_path in SHAPE_PRESETS or pathlib.Path(name_or_path).is_file()


def seeded_model(name_or_path: str, *, seed: int, vocab_size: int | None = None, config=None, dtype=None):
    """The model train.py starts from: seeded, so that every rank, engine and later export builds the same.

    Args:
        name_or_path: as for load_model.
        seed: torch.manual_seed before building (random init, and any random layer the caller adds next).
        vocab_size: the tokenizer's vocabulary size (see model_config).
        config: a preset's config already made by model_config (skips making it again).
        dtype: the parameters' dtype (train.py's --load-dtype); None: the default (fp32).
    """
    torch.manual_seed(seed)
    dtype = torch.float32 if dtype is None else dtype
    if config is not None and name_or_path in PRESETS:
        return build_model(config, dtype=dtype)
    return load_model(name_or_path, dtype=dtype, vocab_size=vocab_size)


def max_context(config: transformers.PretrainedConfig) -> int:
    """The longest sequence the model's position embeddings support (n_positions, max_position_embeddings)."""
    for key in _CONTEXT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    raise UsageError(f"cannot tell the context length of a {config.model_type!r} config; set n_positions")


def check_block_size(config: transformers.PretrainedConfig, block_size: int) -> None:
    """Raise UsageError if `block_size` is above the model's context length."""
    limit = max_context(config)
    if block_size > limit:
        raise UsageError(
            f"--block-size {block_size} is above the model's context of {limit} tokens; "
            f"use --block-size {limit} or less"
        )


def count_params(model: torch.nn.Module) -> int:
    """Number of unique parameters (a tied embedding / lm_head weight counts once)."""
    return sum(p.numel() for p in model.parameters())  # parameters() already deduplicates shared tensors


def load_tokenizer(name_or_path: str | None = None):
    """A tokenizer: the offline default (None or "stdlib-bpe"), a local folder, or a hub id.

    Args:
        name_or_path: None / DEFAULT_TOKENIZER_NAME for the offline BPE tokenizer (shipped in
            zero_train/assets/, nothing trains at run time), else a folder with tokenizer files or a hub id.

    Returns:
        A transformers.PreTrainedTokenizerBase.
    """
    if name_or_path is None or name_or_path == DEFAULT_TOKENIZER_NAME:
        name_or_path = str(default_tokenizer_dir())
    else:
        _check_local_path(name_or_path)
    with _hub_errors_as_usage(name_or_path, "tokenizer"):
        return hub.load(functools.partial(AutoTokenizer.from_pretrained, name_or_path), name_or_path)


def _looks_like_path(name: str) -> bool:
    """Hub ids are `name` or `owner/name`; anything else with a separator is meant as a path."""
    return (
        name.startswith((".", "/", "~"))
        or name.count("/") > 1
        or name.endswith("/")
        or (os.sep != "/" and os.sep in name)
    )


def _check_local_path(name_or_path: str) -> None:
    """UsageError for a path that does not exist (with did-you-mean over the presets)."""
    path = pathlib.Path(name_or_path).expanduser()
    if path.exists() or not _looks_like_path(name_or_path):
        if path.is_file():  # model_config reads config.json files before asking; tokenizers need a folder
            raise UsageError(f"{name_or_path!r} is a file; pass the folder written by save_pretrained")
        return
    raise UsageError(
        f"no such folder {name_or_path!r}; pass a save_pretrained folder, a config.json, a hub id, "
        f"or a preset ({', '.join([*PRESETS, *SHAPE_PRESETS])})"
    )


def did_you_mean(name: str) -> str:
    """' (did you mean X?)' for the closest preset name, or '' (also for an `owner/name` hub id: not a typo)."""
    if "/" in name:
        return ""
    close = difflib.get_close_matches(name, [*PRESETS, *SHAPE_PRESETS], n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


@contextlib.contextmanager
def _hub_errors_as_usage(name: str, what: str):
    """Turn 'not found / not cached / offline' from the hub (or a broken folder) into one UsageError."""
    try:
        yield
    except (OSError, HFValidationError) as exc:
        if pathlib.Path(name).expanduser().is_dir():
            raise UsageError(f"cannot load {what} from folder {name!r}: {_first_line(exc)}") from exc
        if isinstance(exc, hub.HubUnreachable):
            fix = f"it is not cached and {exc}; connect to the network, or pass a local folder"
        elif hub.offline_mode():
            fix = (
                "it is not cached and HF_HUB_OFFLINE=1 forbids downloading; run once with network "
                f"(unset HF_HUB_OFFLINE) or `huggingface-cli download {name}`"
            )
        else:
            fix = "it is not a local folder and the hub could not provide it"
        presets = "" if what == "tokenizer" else f"; presets: {', '.join(PRESETS)}"
        raise UsageError(f"{what} {name!r}{did_you_mean(name)}: {fix}{presets}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
