"""The offline default: a corpus and a tokenizer that need no download.

Corpus ("stdlib"): the Python standard library's own .py sources, found through `sysconfig`. They are
real, human-written text that exists on every machine with Python, in a deterministic order (sorted
relative paths), without test suites and generated tables (encodings/, pydoc_data/), bounded in size.

Tokenizer ("stdlib-bpe"): a byte-level BPE with OFFLINE_VOCAB_SIZE tokens trained once on that corpus
by `scripts/build_tokenizer.py` and shipped as a normal Hugging Face tokenizer folder in
`zero_train/assets/stdlib-bpe/`, so nothing trains at run time and any text (any bytes) is encodable.

    files = stdlib_files(limit_bytes=DEFAULT_CORPUS_BYTES)
    tokenizer = AutoTokenizer.from_pretrained(default_tokenizer_dir())
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import sysconfig

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

DEFAULT_TOKENIZER_NAME = "stdlib-bpe"
OFFLINE_VOCAB_SIZE = 8192
EOS_TOKEN = "<|endoftext|>"
EOS_TOKEN_ID = 0  # the only special token, added first (GPT-2 uses the same string as bos/eos/unk)
DEFAULT_CORPUS_BYTES = 4_000_000  # the training corpus: ~1.2M tokens, tokenized in seconds
# test suites (odd encodings, generated data), third-party packages, generated charmap/topic tables
_SKIPPED_DIRS = {
    "test",
    "tests",
    "idle_test",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "encodings",
    "pydoc_data",
}


def stdlib_dir() -> pathlib.Path:
    """The folder of this interpreter's pure-Python standard library (e.g. /usr/lib/python3.11)."""
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(limit_bytes: int | None = None) -> list[pathlib.Path]:
    """The standard library's .py files (no test suites), sorted by relative path, UTF-8 only.

    Args:
        limit_bytes: keep the longest prefix of that sorted list whose total size is at most this
            (at least one file); None keeps all (~10 MB, ~600 files on CPython 3.11).

    Returns:
        Absolute paths, in the same order on every call.
    """
    root = stdlib_dir()
    candidates = sorted(_unskipped_py_files(root), key=lambda path: path.relative_to(root).as_posix())
    files: list[pathlib.Path] = []
    total = 0
    for path in candidates:
        size = path.stat().st_size
        if size == 0 or not _is_utf8(path):
            continue
        if limit_bytes is not None and files and total + size > limit_bytes:
            break
        files.append(path)
        total += size
    assert files, f"no readable .py files under {root}"
    return files


def _unskipped_py_files(root: pathlib.Path) -> list[pathlib.Path]:
    """The .py files under root outside _SKIPPED_DIRS, never entering those (docs/startup.md, "offline corpus")."""
    found = []
    for folder, dirs, names in os.walk(root, followlinks=True):  # followlinks: what Path.rglob did on 3.11
        dirs[:] = [name for name in dirs if name not in _SKIPPED_DIRS]
        found.extend(pathlib.Path(folder, name) for name in names if name.endswith(".py"))
    return found


def _is_utf8(path: pathlib.Path) -> bool:
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def default_tokenizer_dir() -> pathlib.Path:
    """The shipped tokenizer folder (tokenizer.json + tokenizer_config.json); AutoTokenizer loads it."""
    folder = pathlib.Path(__file__).resolve().parents[1] / "assets" / DEFAULT_TOKENIZER_NAME
    assert (folder / "tokenizer.json").is_file(), (
        f"{folder} is missing; the package is incomplete (rebuild with scripts/build_tokenizer.py)"
    )
    return folder


def _portable_tokenizer_class(config_path: pathlib.Path) -> None:
    """Name the class transformers 4.x and 5.x both know (5.x writes its own 'TokenizersBackend')."""
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def train_stdlib_tokenizer(out_dir: pathlib.Path, *, vocab_size: int = OFFLINE_VOCAB_SIZE) -> dict:
    """Train the byte-level BPE on the whole stdlib corpus and save it as an HF tokenizer folder.

    Used once by scripts/build_tokenizer.py; the result is committed, so runs never train.

    Args:
        out_dir: folder to write (created).
        vocab_size: total vocabulary, EOS + 256 byte symbols + merges.

    Returns:
        What was trained on (also written to out_dir/build_info.json).
    """
    files = stdlib_files()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],  # first, so it gets id 0 == EOS_TOKEN_ID
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable, no unknown token
        show_progress=False,
    )
    tokenizer.train([str(path) for path in files], trainer)
    assert tokenizer.token_to_id(EOS_TOKEN) == EOS_TOKEN_ID
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, unk_token=EOS_TOKEN
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(str(out_dir))
    _portable_tokenizer_class(out_dir / "tokenizer_config.json")
    info = {
        "corpus": "Python standard library .py sources (no tests/encodings/pydoc_data), sorted by path",
        "python": sys.version.split()[0],
        "num_files": len(files),
        "num_bytes": sum(path.stat().st_size for path in files),
        "vocab_size": tokenizer.get_vocab_size(),
        "eos_token": EOS_TOKEN,
        "eos_token_id": EOS_TOKEN_ID,
    }
    (out_dir / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
