"""DeepSpeed checkpoints resumed at another world size, through DeepSpeed's universal checkpoint.

A DeepSpeed ZeRO-1/2/3 checkpoint holds one optimizer partition per data-parallel rank
(`zero_pp_rank_<r>_mp_rank_00_optim_states.pt`), and DeepSpeed refuses to load it at another world size
("Automatic adjustment of ZeRO's optimizer state partitioning with a new world size is not currently
supported"). Its universal checkpoint (`deepspeed.checkpoint.ds_to_universal`) rewrites the partitions as
one folder per parameter (fp32 weights, exp_avg, exp_avg_sq, step), which DeepSpeed loads at any world size
and ZeRO stage when `checkpoint.load_universal` is on. Inside one of our checkpoints:

    deepspeed/state/        what the ranks saved (DeepSpeed's own files)
    deepspeed/universal/    converted once by rank 0, on the first resume at another world size, with its own
                            manifest.json; verified (and reused) by every later resume

Exact: saved by 2 ranks and loaded by 1 or 3, ZeRO-1, 2 and 3 give the same module weights, fp32 masters and
Adam moments, bit for bit, and the same lr schedule position (tests/checkpoint/test_elastic.py; docs/reliability.md).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import pathlib
import shutil
import uuid
import warnings

import torch.distributed as dist

from zero_train.checkpoint import atomic as checkpoint
from zero_train.checkpoint import manifest
from zero_train.checkpoint.files import refuse_unexpected_pickles
from zero_train.runtime.errors import UsageError

UNIVERSAL_TAG = "universal"
# rank 0 converts while the others wait; a big model takes minutes, far beyond the 60 s collective timeout
# (a rank that dies meanwhile still fails the wait at once: gloo sees the closed connection)
CONVERSION_TIMEOUT_S = 3600.0


def saved_world_size(tag_dir: pathlib.Path) -> int | None:
    """The data-parallel ranks that saved the ZeRO partitions in `tag_dir`; None if it holds none.

    Without partitions (ZeRO stage 0 in fp32, where DeepSpeed keeps torch's whole optimizer state in
    mp_rank_00_model_states.pt) DeepSpeed loads the checkpoint at any world size by itself.
    """
    return len(list(tag_dir.glob("*zero_pp_rank_*_optim_states.pt"))) or None


def load_universal(ds_engine, ds_root: pathlib.Path, *, source_tag: str, dist_info, saved_ranks: int) -> None:
    """Load `<ds_root>/<source_tag>` (saved by `saved_ranks` ranks) into `ds_engine` at this world size.

    Collective. Converts to `<ds_root>/universal` first if that was never done (rank 0; verified by
    its manifest otherwise), then loads it with DeepSpeed's universal loader: model, fp32 master
    partitions, optimizer moments, lr scheduler and step counters.

    Args:
        ds_engine: the deepspeed.DeepSpeedEngine built for the new world size.
        ds_root: the checkpoint's `deepspeed/` folder.
        source_tag: the tag folder DeepSpeed saved (`state`).
        dist_info: this process's DistInfo.
        saved_ranks: the world size that saved it (for the message).

    Raises:
        UsageError: the conversion failed, or the converted folder is damaged or refused.
    """
    universal = ensure_universal(ds_root, source_tag=source_tag, dist_info=dist_info)
    refuse_unexpected_pickles(universal)
    if dist_info.is_main:
        warnings.warn(
            f"resuming a DeepSpeed checkpoint saved by {saved_ranks} ranks on {dist_info.world_size}: loading "
            f"DeepSpeed's universal checkpoint {universal} (weights, fp32 masters, optimizer moments and lr "
            "schedule re-partitioned exactly); per-rank RNG states are reused from the saved ranks",
            stacklevel=2,
        )
    config = ds_engine._config  # DeepSpeed reads load_universal_checkpoint only while loading (0.19.8)
    previous = config.load_universal_checkpoint
    config.load_universal_checkpoint = True
    try:
        load_path, _ = ds_engine.load_checkpoint(
            str(ds_root), tag=UNIVERSAL_TAG, load_optimizer_states=True, load_lr_scheduler_states=True
        )
    finally:
        config.load_universal_checkpoint = previous
    if load_path is None:
        raise UsageError(f"DeepSpeed could not load the universal checkpoint {universal}")


def ensure_universal(ds_root: pathlib.Path, *, source_tag: str, dist_info) -> pathlib.Path:
    """`<ds_root>/universal`, converted from `<ds_root>/<source_tag>` by rank 0 unless already there.

    Collective (the other ranks wait, up to CONVERSION_TIMEOUT_S). An existing conversion is verified
    against its manifest instead.

    Returns:
        The universal checkpoint folder (DeepSpeed's tag folder: load it with tag "universal").

    Raises:
        UsageError: on every rank, if rank 0 could not convert, or the existing conversion is damaged.
    """
    group = None
    if dist_info.world_size > 1 and dist.is_initialized():
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=CONVERSION_TIMEOUT_S))
    try:
        checkpoint.on_rank0(
            lambda: _convert_or_verify(ds_root, source_tag), dist_info=dist_info, process_group=group
        )
    finally:
        if group is not None:
            dist.destroy_process_group(group)
    return ds_root / UNIVERSAL_TAG


def _convert_or_verify(ds_root: pathlib.Path, source_tag: str) -> None:
    target = ds_root / UNIVERSAL_TAG
    if (target / manifest.MANIFEST_FILE).is_file():
        manifest.verify(target)  # converted by an earlier resume: reuse it if intact
        return
    source = ds_root / source_tag
    refuse_unexpected_pickles(source)  # ds_to_universal unpickles every file with weights_only=False
    staging = ds_root / f"{UNIVERSAL_TAG}{checkpoint.STAGING_MARK}-{uuid.uuid4().hex[:12]}"
    try:
        _run_ds_to_universal(source, staging)
        manifest.write_manifest(staging)
        if target.exists():  # a hand-made or half-deleted folder without manifest: replace it
            shutil.rmtree(target)
        os.replace(staging, target)
    except OSError as err:
        raise UsageError(
            f"cannot write DeepSpeed's universal checkpoint into {ds_root} ({err.strerror or err}); copy "
            "the checkpoint to a writable place and resume from there"
        ) from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        (ds_root / "latest_universal").unlink(
            missing_ok=True
        )  # ds_to_universal's own pointer: we load by tag


def _run_ds_to_universal(source: pathlib.Path, output: pathlib.Path) -> None:
    """deepspeed.checkpoint.ds_to_universal in this process (one worker: no process pool), quietly."""
    # expensive: DeepSpeed's converter, only for another world size
    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    options = argparse.Namespace(
        input_folder=str(source),
        output_folder=str(output),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # our engines do not register universal_checkpoint_info; DeepSpeed's default
    )
    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            ds_to_universal(options)
    except (AssertionError, RuntimeError, ValueError, KeyError, NotImplementedError) as err:
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UsageError(
            f"DeepSpeed could not convert {source} to a universal checkpoint ({detail}); resume it at the "
            "world size that saved it"
        ) from err
