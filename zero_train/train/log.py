"""One rank-aware logger: rank 0 speaks by default; `all_ranks=True` prefixes every line with [rank N]."""

from __future__ import annotations

import logging
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
