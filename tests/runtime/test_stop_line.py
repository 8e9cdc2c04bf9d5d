"""The line a stopped rank ends with names the last complete checkpoint on disk (zero_train.runtime.faults).

A rank stopped while it waits for rank 0 to publish a save has not yet heard that the save is complete; the
line must still name it, and must not call it cut short (found by tests/launch/test_stopping.py in CI).
"""

from __future__ import annotations

import pytest

from zero_train.checkpoint.manifest import MANIFEST_FILE
from zero_train.checkpoint.rotation import complete_checkpoints
from zero_train.runtime import faults

pytestmark = pytest.mark.tier("quick")


@pytest.fixture
def save_dir(tmp_path):
    yield tmp_path
    faults.note_checkpoints(None)


def _publish(save_dir, step: int):
    folder = save_dir / f"step-{step:08d}"
    folder.mkdir()
    (folder / MANIFEST_FILE).write_text("{}")
    return folder


def test_a_save_rank0_published_while_this_rank_waited_is_named_not_cut(save_dir):
    first = _publish(save_dir, 20)
    faults.note_checkpoints(str(save_dir), on_disk=lambda: complete_checkpoints(save_dir))
    faults.note_saved(str(first.resolve()))
    faults.note_saving(40)
    (save_dir / "step-00000040").mkdir()  # staged, no manifest yet: not complete
    hint = faults._resume_hint()
    assert hint.startswith("the save of step 40 was cut short")
    assert f"the last complete checkpoint is {first.resolve()}:" in hint
    second = _publish_manifest(save_dir / "step-00000040")  # rank 0 published; this rank did not hear yet
    hint = faults._resume_hint()
    assert hint == f"the last complete checkpoint is {second.resolve()}: resume from it with --resume auto"


def _publish_manifest(folder):
    (folder / MANIFEST_FILE).write_text("{}")
    return folder


def test_without_the_disk_the_line_is_what_the_rank_heard(save_dir):
    faults.note_checkpoints(str(save_dir))
    assert faults._resume_hint() == f"no checkpoint in {save_dir} is complete yet"
    faults.note_saving(20)
    assert faults._resume_hint().startswith("the save of step 20 was cut short and is not a checkpoint; no")
