"""Checkpoints as the train loop uses them: what goes into client_state, saving, resuming.

A checkpoint is `<save_dir>/step-XXXXXXXX/` (zero_train.checkpoint.atomic: staged writes, the manifest, the atomic
move of `latest`, verification on load). The loop adds `run.json` (rank 0) and every rank's client_state:
the step reached, the micro-batches consumed (the data position is arithmetic, see
zero_train.hf.data.rank_batches) and this rank's RNG states.
"""

from __future__ import annotations

import json
import pathlib
import random

import torch

from zero_train.checkpoint import atomic as checkpoint
from zero_train.runtime.errors import UsageError

RUN_FILE = "run.json"


def capture_rng() -> dict:
    """This rank's RNG states as weights_only-loadable values (tensors, ints, tuples)."""
    state = dict(torch=torch.get_rng_state(), python=_python_rng_to_plain(random.getstate()))
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    """Restore what capture_rng() returned."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _python_rng_to_plain(state: tuple) -> tuple:
    version, internal, gauss = state
    return (int(version), [int(x) for x in internal], gauss)


def save_checkpoint(
    engine, *, save_dir, step: int, client_state: dict, run_info: dict, dist_info
) -> pathlib.Path:
    """Write a complete checkpoint of `engine` at `step` (collective: every rank calls it).

    Args:
        engine: the training engine (writes model/optimizer files into the staging dir).
        save_dir: the --save-dir.
        step: optimizer steps done.
        client_state: this rank's loop state (step, data position, rng).
        run_info: what rank 0 records in run.json (engine, model, settings, ...).
        dist_info: this process's DistInfo.

    Returns:
        The final checkpoint directory.
    """
    staging = pathlib.Path(checkpoint.begin(save_dir, step, dist_info=dist_info))
    engine.save_checkpoint(staging, client_state=client_state)
    if dist_info.is_main:
        (staging / RUN_FILE).write_text(json.dumps(dict(run_info, step=step), indent=2, default=str))
    return pathlib.Path(checkpoint.commit(save_dir, staging, dist_info=dist_info))


def resume_path(resume: str | None, save_dir: str | None) -> pathlib.Path | None:
    """The checkpoint dir to resume from, or None to start fresh.

    Args:
        resume: None, "auto" (the save dir's `latest` if there is one, else a fresh start), a
            checkpoint dir, or a save dir (its `latest` is followed).
        save_dir: the --save-dir (needed by "auto").

    Returns:
        The checkpoint directory, verified against its manifest.
    """
    if resume is None:
        return None
    if resume == "auto":
        if save_dir is None:
            raise UsageError("--resume auto needs --save-dir (where to look for the latest checkpoint)")
        if not (pathlib.Path(save_dir) / checkpoint.LATEST_FILE).is_file():
            return None
        resume = save_dir
    return checkpoint.resolve(pathlib.Path(resume).expanduser())


def read_run_info(ckpt: pathlib.Path) -> dict:
    """The run.json of a checkpoint ({} if absent)."""
    target = ckpt / RUN_FILE
    if not target.is_file():
        return {}
    try:
        return json.loads(target.read_text())
    except (OSError, ValueError, RecursionError) as err:  # ValueError: bad JSON or not UTF-8
        raise UsageError(f"cannot read {target}: {type(err).__name__}; the checkpoint is damaged") from err
