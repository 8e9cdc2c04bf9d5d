"""Shared pytest setup: offline, CPU only, one torch thread, a repo-root fixture.

ZT_DEVICE=cpu (and DeepSpeed's DS_ACCELERATOR=cpu) hold on a GPU machine too: the tests compare against
bit-exact CPU references and run gloo rings; the CUDA branches are exercised by tests that force them
(tests/test_gpu_paths.py), and scripts/gpu_check.sh runs the real thing on GPUs.
"""

import os
import pathlib

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ZT_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["ZT_DEVICE"] = "cpu"
os.environ["DS_ACCELERATOR"] = "cpu"

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def repo_root() -> pathlib.Path:
    return REPO_ROOT
