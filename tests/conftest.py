"""Shared pytest setup: offline, one torch thread, a repo-root fixture."""

import os
import pathlib

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ZT_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def repo_root() -> pathlib.Path:
    return REPO_ROOT
