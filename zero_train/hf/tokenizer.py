"""Which tokenizer a run uses, and whether it fits the model's embedding.

    source = tokenizer_source("meta-llama/Llama-3.2-1B", None)   # the model's own: "meta-llama/Llama-3.2-1B"
    source = tokenizer_source("tiny", None)                       # a preset: "stdlib-bpe" (zero_train.hf.offline)
    tokenizer = run_tokenizer("out/my-model", None)               # loaded; UsageError if the folder has none

A pretrained model (a save_pretrained folder or a hub id) is trained with its own tokenizer unless --tokenizer
names another: its embedding rows are that tokenizer's ids, and any other tokenizer feeds it tokens it never saw.
The offline presets, the published shapes and config.json files are randomly initialised, so the shipped
stdlib-bpe (8192 tokens, no download) serves them.
"""

from __future__ import annotations

import pathlib

from zero_train.hf.models import is_pretrained, load_tokenizer
from zero_train.hf.offline import DEFAULT_TOKENIZER_NAME
from zero_train.runtime.errors import UsageError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)
"""The files one of which a save_pretrained tokenizer folder holds (transformers 5 builds an empty tokenizer of
one token from a folder with none of them, without an error)."""


def tokenizer_source(model: str, tokenizer: str | None) -> str:
    """The tokenizer --tokenizer names, else the model's own (pretrained), else the offline stdlib-bpe."""
    if tokenizer is not None:
        return tokenizer
    return model if is_pretrained(model) else DEFAULT_TOKENIZER_NAME


def run_tokenizer(model: str, tokenizer: str | None):
    """The run's tokenizer (see tokenizer_source), loaded; UsageError for a folder without tokenizer files."""
    source = tokenizer_source(model, tokenizer)
    folder = pathlib.Path(source).expanduser()
    if source != DEFAULT_TOKENIZER_NAME and folder.is_dir():
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            whose = "model folder" if tokenizer is None else "tokenizer folder"
            raise UsageError(
                f"{whose} {source!r} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...); save the "
                "tokenizer there (tokenizer.save_pretrained), or pass --tokenizer FOLDER_OR_HUB_ID "
                f"(--tokenizer {DEFAULT_TOKENIZER_NAME}: the offline one)"
            )
    return load_tokenizer(source)


def check_vocabulary(tokenizer, model_config, *, model: str, tokenizer_given: str | None) -> None:
    """UsageError if the tokenizer has ids the model has no embedding row for (an index error in the first step).

    Args:
        tokenizer: the run's tokenizer.
        model_config: the model's PretrainedConfig (vocab_size: its embedding rows).
        model: --model, for the message.
        tokenizer_given: --tokenizer (None: the model's own or the offline default), for the message.
    """
    size, rows = len(tokenizer), model_config.vocab_size
    if size <= rows:
        return
    if tokenizer_given is None and is_pretrained(model):
        raise UsageError(
            f"the tokenizer in {model!r} has {size} tokens but the model embeds only {rows}; pass the tokenizer "
            f"it was trained with (--tokenizer), or resize its embeddings (model.resize_token_embeddings({size})) "
            "and save it again"
        )
    name = tokenizer_given or DEFAULT_TOKENIZER_NAME
    fix = (
        "drop --tokenizer to use the model's own" if is_pretrained(model) else "use a model that embeds them"
    )
    raise UsageError(
        f"tokenizer {name!r} has {size} tokens but model {model!r} embeds only {rows} (ids {rows}..{size - 1} "
        f"have no row); {fix}, or pass a tokenizer of at most {rows} tokens (--tokenizer)"
    )
