"""Checkpoints as the train loop uses them: what goes into client_state, saving into a staging dir, resuming.

A checkpoint is `<save_dir>/step-XXXXXXXX/` (layout in notes/CONTRACTS.md). The loop adds `run.json` (rank 0)
and every rank's client_state: the step reached, the micro-batches consumed (the data position is
arithmetic, see zero_train.data.rank_batches) and this rank's RNG states. Staging, the manifest and the
atomic move of `latest` are zero_train.checkpoint's (begin/commit); until that module exists, a minimal
equivalent here does the same steps without checksum verification on load.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import random
import shutil

import torch
import torch.distributed as dist

from zero_train.errors import UsageError

LATEST_FILE = "latest"
RUN_FILE = "run.json"
MANIFEST_FILE = "manifest.json"


def step_dir_name(step: int) -> str:
    """`step-00000040` for step 40."""
    return f"step-{step:08d}"


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
    begin, commit = _checkpoint_functions()
    staging = pathlib.Path(begin(save_dir, step, dist_info=dist_info))
    engine.save_checkpoint(staging, client_state=client_state)
    if dist_info.is_main:
        (staging / RUN_FILE).write_text(json.dumps(dict(run_info, step=step), indent=2, default=str))
    return pathlib.Path(commit(save_dir, staging, dist_info=dist_info))


def _checkpoint_functions():
    try:
        from zero_train.checkpoint import begin, commit
    except ImportError:
        return _begin_fallback, _commit_fallback
    return begin, commit


def _barrier(dist_info) -> None:
    if dist_info.world_size > 1 and dist.is_initialized():
        dist.barrier()


def _begin_fallback(save_dir, step: int, *, dist_info) -> pathlib.Path:
    staging = pathlib.Path(save_dir) / f"{step_dir_name(step)}.tmp"
    if dist_info.is_main:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    _barrier(dist_info)
    return staging


def _commit_fallback(save_dir, staging: pathlib.Path, *, dist_info) -> pathlib.Path:
    _barrier(dist_info)
    final = pathlib.Path(save_dir) / staging.name.removesuffix(".tmp")
    if dist_info.is_main:
        files = sorted(p for p in staging.rglob("*") if p.is_file())
        manifest = {
            str(p.relative_to(staging)): dict(bytes=p.stat().st_size, sha256=_sha256(p)) for p in files
        }
        (staging / MANIFEST_FILE).write_text(json.dumps(dict(files=manifest), indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        latest_tmp = pathlib.Path(save_dir) / f"{LATEST_FILE}.tmp"
        latest_tmp.write_text(final.name)
        os.replace(latest_tmp, pathlib.Path(save_dir) / LATEST_FILE)
    _barrier(dist_info)
    return final


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resume_path(resume: str | None, save_dir: str | None) -> pathlib.Path | None:
    """The checkpoint dir to resume from, or None to start fresh.

    Args:
        resume: None, "auto" (the save dir's `latest` if there is one, else a fresh start), a
            checkpoint dir, or a save dir (its `latest` is followed).
        save_dir: the --save-dir (needed by "auto").

    Returns:
        The checkpoint directory (verified against its manifest when zero_train.checkpoint exists).
    """
    if resume is None:
        return None
    if resume == "auto":
        if save_dir is None:
            raise UsageError("--resume auto needs --save-dir (where to look for the latest checkpoint)")
        if not (pathlib.Path(save_dir) / LATEST_FILE).is_file():
            return None
        resume = save_dir
    path = pathlib.Path(resume).expanduser()
    try:
        from zero_train.checkpoint import resolve
    except ImportError:
        return _resolve_fallback(path)
    return pathlib.Path(resolve(path))


def _resolve_fallback(path: pathlib.Path) -> pathlib.Path:
    if not path.is_dir():
        raise UsageError(f"--resume {str(path)!r} does not exist; pass a checkpoint dir or a save dir")
    if (path / LATEST_FILE).is_file():
        path = path / (path / LATEST_FILE).read_text().strip()
    if not (path / MANIFEST_FILE).is_file():
        raise UsageError(
            f"{str(path)!r} is not a complete checkpoint (no {MANIFEST_FILE}); pass a save dir or one of "
            "its step-XXXXXXXX folders"
        )
    return path


def read_run_info(ckpt: pathlib.Path) -> dict:
    """The run.json of a checkpoint ({} if absent)."""
    target = ckpt / RUN_FILE
    if not target.is_file():
        return {}
    try:
        return json.loads(target.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UsageError(f"cannot read {target}: {err}") from err
