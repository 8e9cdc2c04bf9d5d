"""One rank-aware logger: rank 0 speaks by default; `all_ranks=True` prefixes every line with [rank N]; a run's
lines can be copied to a file (--output-dir's train.log)."""

from __future__ import annotations

import contextlib
import logging
import pathlib
import sys


def get_logger(rank: int = 0, *, all_ranks: bool = False, name: str = "zero_train") -> logging.Logger:
    """A logger that prints on rank 0 only (or on every rank with a `[rank N]` prefix).

    Args:
        rank: this process's global rank.
        all_ranks: log on every rank, each line prefixed with the rank.
    """
    logger = logging.getLogger(f"{name}.r{rank}")
    if logger.handlers:
        return logger
    handler = logging.StreamHandler(sys.stdout)
    prefix = f"[rank {rank}] " if all_ranks else ""
    handler.setFormatter(logging.Formatter(prefix + "%(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO if (all_ranks or rank == 0) else logging.WARNING)
    return logger


@contextlib.contextmanager
def copied_to(logger: logging.Logger, path: str | None):
    """Inside the block, also append the logger's lines to `path` (None: nothing; the file's folder is made)."""
    if path is None:
        yield
        return
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()
