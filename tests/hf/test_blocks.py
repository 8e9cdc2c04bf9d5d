"""zero_train.hf.blocks and zero_train.hf.prepare: the offline default packed without `datasets` gives datasets'
own blocks, and a run trains on it in a process where `import datasets` fails."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from zero_train.hf import blocks, data, packing
from zero_train.hf import models as hf
from zero_train.hf.prepare import is_offline_default

pytestmark = pytest.mark.tier("quick")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_blocks_and_the_held_out_split_are_datasets_own(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    tokenizer = hf.load_tokenizer()
    reference = packing.pack_dataset(data.load_text_dataset("stdlib", seed=0), tokenizer, block_size=64)
    ours = blocks.stdlib_blocks(tokenizer, block_size=64, seed=0)
    for split in ("train", "validation"):
        expected = reference[split].with_format("numpy")[:]["input_ids"]
        assert ours[split].with_format("numpy")[:]["input_ids"].tolist() == expected.tolist()
        assert ours[split][0] == reference[split][0]  # a row as the Trainer reads it: lists
    cached = blocks.cache_path(tokenizer, block_size=64, seed=0, eval_fraction=0.05)
    assert cached.is_file()
    blocks._PACKED.clear()  # a new process: read back from the cache file
    again = blocks.stdlib_blocks(tokenizer, block_size=64, seed=0)
    assert np.array_equal(again["train"].columns["input_ids"], ours["train"].columns["input_ids"])


def test_only_the_offline_default_as_documents_skips_datasets():
    assert is_offline_default(None, column=None, config_name=None, chat=False)
    assert is_offline_default("stdlib", column=None, config_name=None, chat=False)
    assert not is_offline_default("stdlib", column="text", config_name=None, chat=False)
    assert not is_offline_default("notes.txt", column=None, config_name=None, chat=False)
    assert not is_offline_default(None, column=None, config_name=None, chat=True)


@pytest.mark.tier("slow")
def test_a_run_trains_on_the_offline_default_where_datasets_cannot_be_imported(tmp_path):
    """A machine without datasets (nor pyarrow): `import datasets` raises in the training process."""
    metrics = tmp_path / "metrics.jsonl"
    program = (
        "import sys; sys.modules['datasets'] = None; sys.modules['pyarrow'] = None; "
        "from zero_train.train.main import main; main()"
    )
    argv = [
        "--model",
        "tiny",
        "--max-steps",
        "2",
        "--block-size",
        "32",
        "--micro-batch-size",
        "2",
        "--engine",
        "zero1",
        "--no-progress",
        "--metrics-file",
        str(metrics),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT), ZT_DEVICE="cpu", XDG_CACHE_HOME=str(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, "-c", program, *argv], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = metrics.read_text().splitlines()
    assert len([line for line in lines if '"step_time_s"' in line]) == 2
    assert "datasets" not in done.stderr
