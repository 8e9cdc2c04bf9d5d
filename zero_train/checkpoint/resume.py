"""Checkpoints as the train loop uses them: what goes into client_state, resuming (saving: checkpoint.save).

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


def capture_rng(device: torch.device | str = "cpu") -> dict:
    """This rank's RNG states as weights_only-loadable values (tensors, ints, tuples).

    Args:
        device: this rank's device; on CUDA its generator alone is saved ("cuda"), not every visible
            GPU's: each rank owns one device, and restoring all of them would overwrite the others'.
    """
    state = dict(torch=torch.get_rng_state(), python=_python_rng_to_plain(random.getstate()))
    device = torch.device(device)
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict, device: torch.device | str = "cpu") -> None:
    """Restore what capture_rng() returned, the CUDA generator onto THIS rank's device.

    Works with another number of visible devices than at save time (one generator per rank travels);
    a state saved on CPU leaves a CUDA generator as seeded, a CUDA state is ignored on a CPU rank. Older
    checkpoints saved every visible device's generator (a list): this rank takes its own index's, if any.
    """
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    device = torch.device(device)
    saved = state.get("cuda")
    if device.type != "cuda" or saved is None:
        return
    if isinstance(saved, (list, tuple)):  # get_rng_state_all() of older checkpoints
        index = device.index or 0
        saved = saved[index] if index < len(saved) else None
    if saved is not None:
        torch.cuda.set_rng_state(saved, device)


def _python_rng_to_plain(state: tuple) -> tuple:
    version, internal, gauss = state
    return (int(version), [int(x) for x in internal], gauss)


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
