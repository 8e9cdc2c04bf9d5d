"""The files of one checkpoint, written now or captured in host memory and written later (--async-save).

Engines never open files themselves: they hand each file to a `StagedWrites` (files.write_model,
files.save_rank_file, DeepSpeed through `CapturingCheckpointEngine` in engines/deepspeed_engine.py).

    writes = StagedWrites(staging, defer=False, save_dir=save_dir)  # write at once
    engine.save_checkpoint(writes, client_state=...)
    writes.write_all()                                             # (deferred ones: in a background thread)
    writes.error                                                   # None, or the StorageError of the first failure

A write that fails is recorded, not raised: an engine's save may contain collectives (gathering a ZeRO-1 model,
DeepSpeed's barriers), and a rank that raised halfway would leave the others waiting in them. Every rank
finishes its save, then the ranks compare their errors (zero_train.checkpoint.save) and all stop together.
The first failure skips the rank's remaining writes. Nothing here creates the staging folder itself: if it
vanished, the write fails instead of quietly recreating half a checkpoint.
"""

from __future__ import annotations

import copy
import json
import pathlib
import shutil
from collections.abc import Callable
from typing import Any

import torch
from safetensors.torch import save_file

from zero_train.checkpoint.storage import StorageError, describe_failure

# what a write may raise when storage fails: OSError, torch.save's C++ writer (RuntimeError),
# safetensors (its own SafetensorError, an Exception subclass: matched by name below)
WRITE_ERRORS = (OSError, RuntimeError)


class StagedWrites:
    """The files of one checkpoint inside its staging folder, written at once or deferred.

    Args:
        staging: the staging folder (begin() created it).
        defer: capture the payloads in host memory (tensors cloned) and write them in write_all().
        save_dir: the --save-dir, for error messages and free-space checks.
        needed_bytes: the checkpoint's expected size (for the message when the disk is full).
        strict: raise the first failure at once instead of recording it (a plain folder given to an
            engine outside the train loop, e.g. in tests).
    """

    def __init__(
        self, staging, *, defer: bool, save_dir, needed_bytes: int | None = None, strict: bool = False
    ) -> None:
        self.staging = pathlib.Path(staging)
        self.defer = defer
        self.strict = strict
        self.save_dir = save_dir
        self.needed_bytes = needed_bytes
        self.error: StorageError | None = None
        self.written: dict[str, int] = {}  # relpath -> bytes, for the commit's check
        self._pending: list[tuple[str, Callable[[pathlib.Path], None]]] = []

    def torch_save(self, relpath: str, obj: Any) -> None:
        """torch.save(obj) into `<staging>/<relpath>` (a snapshot of obj is kept when deferred)."""
        payload = snapshot(obj) if self.defer else obj
        self._add(relpath, lambda target: _torch_save(payload, target))

    def safetensors(
        self, relpath: str, tensors: dict[str, torch.Tensor], metadata: dict | None = None
    ) -> None:
        """safetensors save_file(tensors) into `<staging>/<relpath>`."""
        payload = snapshot(tensors) if self.defer else tensors
        self._add(relpath, lambda target: save_file(payload, str(target), metadata=metadata))

    def text(self, relpath: str, text: str) -> None:
        """A text file (config.json, run.json)."""
        self._add(relpath, lambda target: target.write_text(text))

    def json(self, relpath: str, value: Any) -> None:
        """A JSON file."""
        self.text(relpath, json.dumps(value, indent=2, sort_keys=True, default=str))

    def copy(self, relpath: str, source) -> None:
        """A copy of an existing file (DeepSpeed's recovery scripts)."""
        self._add(relpath, lambda target: shutil.copyfile(source, target))

    def now(self, relpath: str, write: Callable[[pathlib.Path], None]) -> None:
        """Run `write(<staging>/<relpath>)` at once, even when deferred: for a writer that coordinates the
        ranks itself (torch.distributed.checkpoint: its files cannot wait for a thread of ours). A failure
        is recorded like any other (DCP's CheckpointException is unwrapped to the storage error inside)."""
        self._write(relpath, write)

    def relpath(self, path) -> str:
        """`path` (absolute, inside the staging folder) relative to it."""
        return pathlib.Path(path).resolve().relative_to(self.staging.resolve()).as_posix()

    def write_all(self) -> None:
        """Write every deferred file (in order); stops at the first failure, recorded in `error`."""
        pending, self._pending = self._pending, []
        for relpath, write in pending:
            self._write(relpath, write)

    def _add(self, relpath: str, write: Callable[[pathlib.Path], None]) -> None:
        if self.defer:
            self._pending.append((relpath, write))
        else:
            self._write(relpath, write)

    def _write(self, relpath: str, write: Callable[[pathlib.Path], None]) -> None:
        if self.error is not None:
            return  # this rank's save has already failed: the ranks agree on it afterwards
        target = self.staging / relpath
        try:
            if not self.staging.is_dir():
                raise FileNotFoundError(2, "No such file or directory", str(self.staging))
            target.parent.mkdir(parents=True, exist_ok=True)
            write(target)
            if target.is_file():
                self.written[relpath] = target.stat().st_size
        except BaseException as err:  # DCP's CheckpointException is a BaseException; others re-raised below
            cause = _storage_cause(err)
            if self.strict or cause is None:
                raise
            self.error = describe_failure(cause, self.save_dir, needed_bytes=self.needed_bytes)


def as_staged_writes(out) -> StagedWrites:
    """`out` itself if it is a StagedWrites, else an immediate, strict writer into the folder `out`."""
    if isinstance(out, StagedWrites):
        return out
    return StagedWrites(out, defer=False, save_dir=out, strict=True)


def snapshot(obj: Any, memo: dict | None = None) -> Any:
    """A copy of `obj` that later training steps cannot change: tensors cloned to CPU, containers rebuilt.

    Two tensors that are the same view of the same storage (a tied embedding in a state dict) stay one
    tensor, as torch.save would store them once. Other objects are deep-copied (DeepSpeed's loss scaler is
    updated in place by later steps).
    """
    memo = {} if memo is None else memo
    key = _view_key(obj) if isinstance(obj, torch.Tensor) else id(obj)
    if key in memo:
        return memo[key]
    if isinstance(obj, torch.Tensor):
        result: Any = obj.detach().to("cpu", copy=True)
    elif isinstance(obj, dict):
        result = copy.copy(obj)  # keeps the dict's class (OrderedDict, defaultdict); values replaced below
        for name, value in obj.items():
            result[name] = snapshot(value, memo)
    elif isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        result = type(obj)(snapshot(value, memo) for value in obj)
    else:
        result = copy.deepcopy(obj)
    memo[key] = result
    return result


def _view_key(tensor: torch.Tensor) -> tuple:
    if tensor.numel() == 0:
        return ("empty", id(tensor))
    storage = tensor.untyped_storage().data_ptr()
    return (storage, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)


def _torch_save(obj: Any, target: pathlib.Path) -> None:
    with target.open("wb") as handle:  # opened here, so that open() errors carry their errno
        torch.save(obj, handle)  # fsynced with every other file before the manifest is written


def _storage_cause(err: BaseException) -> BaseException | None:
    """The storage failure behind `err` (itself, or inside DCP's CheckpointException); None for anything else."""
    if isinstance(err, WRITE_ERRORS) or type(err).__name__ == "SafetensorError":
        return err
    for exc, _ in (
        getattr(err, "failures", {}).values() if type(err).__name__ == "CheckpointException" else ()
    ):
        if (cause := _storage_cause(exc)) is not None:
            return cause
    return None
