"""A killed op build's lock is cleared, a live build's is kept (zero_train.runtime.extensions.stale_locks).

torch's FileBaton lock in an op's folder makes every later load of the op wait, forever, while the file exists;
a build that was killed leaves it. The lock of a live build is held open by its builder (here: this process
opens it, as FileBaton does); one that nobody holds, older than MIN_STALE_AGE_S, is stale, at both depths an
op folder has (TORCH_EXTENSIONS_DIR/OP and torch's default ROOT/py311_cpu/OP).
"""

from __future__ import annotations

import os
import time

import pytest

from zero_train.runtime import extensions

pytestmark = pytest.mark.tier("quick")


def _lock(folder, age_s: float):
    folder.mkdir(parents=True)
    lock = folder / extensions.LOCK
    lock.touch()
    past = time.time() - age_s
    os.utime(lock, (past, past))
    return lock


def test_only_an_old_lock_nobody_holds_is_stale_and_clearing_removes_it_with_one_line(tmp_path, capsys):
    killed = _lock(tmp_path / "cpu_adam", age_s=600)
    default_root = _lock(tmp_path / "py311_cpu" / "fused_adam", age_s=600)
    fresh = _lock(tmp_path / "shm_comm", age_s=1)
    live = _lock(tmp_path / "cpu_lion", age_s=600)
    held = os.open(live, os.O_RDONLY)  # FileBaton keeps its descriptor open until the build ends
    try:
        assert extensions.stale_locks(tmp_path) == sorted([killed, default_root])
        assert extensions.clear_stale_locks(tmp_path) == sorted([killed, default_root])
    finally:
        os.close(held)
    assert not killed.exists() and not default_root.exists() and fresh.exists() and live.exists()
    said = capsys.readouterr().err.splitlines()
    assert said == [
        f"zero_train: removed {lock}, left by an interrupted build of that op (it builds again)"
        for lock in sorted([killed, default_root])
    ]
    assert extensions.stale_locks(tmp_path) == [live]  # released: now nobody holds it
    assert extensions.stale_locks(tmp_path / "missing") == []
