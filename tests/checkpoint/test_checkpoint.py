"""zero_train.checkpoint.atomic: atomic saves, manifest verification, safe loading, resolve follows `latest`."""

from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import signal

import pytest
import torch

from zero_train.checkpoint import atomic as checkpoint
from zero_train.checkpoint.storage import StorageError
from zero_train.runtime.dist import DistInfo
from zero_train.runtime.errors import UsageError

pytestmark = pytest.mark.tier("quick")

WORLD_OF_ONE = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")


def save(save_dir, step, tensors: dict, *, fail_after: str | None = None) -> pathlib.Path:
    """A one-rank save through begin/commit; `fail_after` raises after writing that file (a crash)."""
    staging = checkpoint.begin(save_dir, step, dist_info=WORLD_OF_ONE)
    for name, tensor in tensors.items():
        (staging / "optim").mkdir(exist_ok=True)
        torch.save({"step": step, "value": tensor}, staging / "optim" / name)
        if name == fail_after:
            raise RuntimeError("simulated crash while writing")
    (staging / "run.json").write_text(json.dumps({"step": step}))
    return checkpoint.commit(save_dir, staging, dist_info=WORLD_OF_ONE)


def test_save_resolve_roundtrip_and_latest(tmp_path):
    first = save(tmp_path, 10, {"rank-00000.pt": torch.arange(5.0)})
    second = save(tmp_path, 20, {"rank-00000.pt": torch.arange(7.0)})
    assert first.name == "step-00000010" and second.name == "step-00000020"
    assert (tmp_path / "latest").read_text().strip() == "step-00000020"
    assert checkpoint.resolve(tmp_path) == second
    assert checkpoint.resolve(first) == first
    loaded = checkpoint.safe_torch_load(checkpoint.resolve(tmp_path) / "optim" / "rank-00000.pt")
    assert torch.equal(loaded["value"], torch.arange(7.0)) and loaded["step"] == 20
    manifest = json.loads((second / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["optim/rank-00000.pt", "run.json"]
    assert manifest["files"]["run.json"]["bytes"] == (second / "run.json").stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000010", "step-00000020"]


def test_exception_mid_save_keeps_previous_checkpoint_and_next_save_cleans_up(tmp_path):
    good = save(tmp_path, 10, {"rank-00000.pt": torch.ones(3)})
    with pytest.raises(RuntimeError, match="simulated crash"):
        save(
            tmp_path,
            20,
            {"rank-00000.pt": torch.zeros(3), "rank-00001.pt": torch.zeros(3)},
            fail_after="rank-00000.pt",
        )
    leftovers = [p for p in tmp_path.iterdir() if ".tmp" in p.name]
    assert len(leftovers) == 1 and leftovers[0].name.startswith("step-00000020.tmp-")
    assert checkpoint.resolve(tmp_path) == good
    with pytest.raises(UsageError, match="unfinished save"):
        checkpoint.resolve(leftovers[0])
    save(tmp_path, 30, {"rank-00000.pt": torch.ones(3)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000010", "step-00000030"]


def _save_slowly_then_get_killed(save_dir: str, ready) -> None:
    staging = checkpoint.begin(save_dir, 20, dist_info=WORLD_OF_ONE)
    with (staging / "big.bin").open("wb") as handle:
        handle.write(b"x" * 4096)
        handle.flush()
        ready.set()
        signal.pause()  # killed here, mid-write


def test_killed_process_mid_save_leaves_latest_and_previous_checkpoint_intact(tmp_path):
    good = save(tmp_path, 10, {"rank-00000.pt": torch.arange(4.0)})
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    child = ctx.Process(target=_save_slowly_then_get_killed, args=(str(tmp_path), ready))
    child.start()
    assert ready.wait(60)
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert (tmp_path / "latest").read_text().strip() == good.name
    assert checkpoint.resolve(tmp_path) == good
    removed = checkpoint.remove_stale_staging(tmp_path)
    assert [p.name.split(".tmp")[0] for p in removed] == ["step-00000020"]


def test_truncation_and_bit_flip_are_caught_naming_the_file(tmp_path):
    ckpt = save(tmp_path, 10, {"rank-00000.pt": torch.arange(100.0), "rank-00001.pt": torch.ones(9)})
    target = ckpt / "optim" / "rank-00001.pt"
    original = target.read_bytes()
    target.write_bytes(original[:-10])
    with pytest.raises(UsageError, match=r"rank-00001\.pt has \d+ bytes, manifest.json says \d+ \(truncated"):
        checkpoint.resolve(tmp_path)
    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 0x01
    target.write_bytes(bytes(flipped))
    with pytest.raises(UsageError, match=r"rank-00001\.pt is corrupt \(sha256"):
        checkpoint.verify(ckpt)
    target.unlink()
    with pytest.raises(UsageError, match=r"rank-00001\.pt is missing"):
        checkpoint.resolve(ckpt)
    target.write_bytes(original)
    checkpoint.verify(ckpt)  # restored: passes again


def test_corrupt_manifest_and_bad_latest_are_usage_errors(tmp_path):
    ckpt = save(tmp_path, 10, {"rank-00000.pt": torch.ones(2)})
    (ckpt / "manifest.json").write_text('{"files": {"run.json": {"bytes": "many"}}}')
    with pytest.raises(UsageError, match="manifest .*manifest.json is corrupt"):
        checkpoint.resolve(ckpt)
    (ckpt / "manifest.json").write_bytes(b"\x00\xff garbage")
    with pytest.raises(UsageError, match="manifest.json is corrupt"):
        checkpoint.resolve(tmp_path)
    (tmp_path / "latest").write_text("step-99999999")
    with pytest.raises(UsageError, match="names 'step-99999999', which is not a checkpoint folder"):
        checkpoint.resolve(tmp_path)
    with pytest.raises(UsageError, match="does not exist"):
        checkpoint.resolve(tmp_path / "missing")
    with pytest.raises(UsageError, match="not a checkpoint"):
        checkpoint.resolve(tmp_path / "step-00000010" / "optim")


class _WritesMarker:
    """Unpickling this would create a file: what a malicious checkpoint would do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "rank-00000.pt"
    torch.save({"step": 1, "payload": _WritesMarker(str(marker))}, evil)
    with pytest.raises(UsageError, match=r"refusing to load .*rank-00000\.pt: .*PosixPath.*arbitrary code"):
        checkpoint.safe_torch_load(evil)
    assert not marker.exists()
    torch.load(evil, weights_only=False)  # proof that the file really is malicious
    assert marker.exists()


def test_safe_torch_load_names_missing_and_truncated_files(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(1000)}, good)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:300])
    with pytest.raises(UsageError, match=r"truncated\.pt: truncated or corrupt"):
        checkpoint.safe_torch_load(truncated)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(os.urandom(256))
    with pytest.raises(UsageError, match=r"garbage\.pt"):
        checkpoint.safe_torch_load(garbage)
    with pytest.raises(UsageError, match=r"missing\.pt is missing"):
        checkpoint.safe_torch_load(tmp_path / "missing.pt")


def test_unwritable_save_dir_is_a_storage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    with pytest.raises(StorageError, match="a file is in the way of the folder on .*file/save"):
        checkpoint.begin(blocker / "save", 1, dist_info=WORLD_OF_ONE)


def test_hand_made_checkpoint_without_manifest_is_accepted_with_a_warning(tmp_path):
    ckpt = tmp_path / "step-00000005"
    (ckpt / "model").mkdir(parents=True)
    (tmp_path / "latest").write_text(ckpt.name)
    with pytest.warns(UserWarning, match="no manifest.json"):
        assert checkpoint.resolve(tmp_path) == ckpt
    (tmp_path / "latest").unlink()
    save(tmp_path, 7, {"rank-00000.pt": torch.ones(1)})
    (tmp_path / "latest").unlink()
    with pytest.raises(
        UsageError, match="has no `latest` file; pass one of its checkpoints, e.g. .*step-00000007"
    ):
        checkpoint.resolve(tmp_path)


def _two_rank_save(rank, world_size, save_dir):
    from zero_train.runtime.dist import DistInfo

    info = DistInfo(
        rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"), backend="gloo"
    )
    names = []
    for step in (1, 2):
        staging = checkpoint.begin(save_dir, step, dist_info=info)
        names.append(staging.name)
        (staging / "optim").mkdir(exist_ok=True)
        torch.save({"rank": rank, "step": step}, staging / "optim" / f"rank-{rank:05d}.pt")
        checkpoint.commit(save_dir, staging, dist_info=info)
    blocked = pathlib.Path(save_dir) / "blocked"
    if rank == 0:
        blocked.write_text("a file where a dir should be")
    try:
        checkpoint.begin(blocked / "save", 3, dist_info=info)
    except StorageError as err:
        names.append(f"StorageError: {err.what}")
    return names


@pytest.mark.tier("multiproc")
def test_two_ranks_agree_on_staging_and_see_rank0_errors(tmp_path, rank_pool):
    results = rank_pool(2).run(_two_rank_save, (str(tmp_path),))
    assert results[0] == results[1]  # same staging names, same error on both ranks
    assert results[0][2].startswith("StorageError: a file is in the way of the folder on")
    ckpt = checkpoint.resolve(tmp_path)
    assert ckpt.name == "step-00000002"
    manifest = json.loads((ckpt / "manifest.json").read_text())["files"]
    assert sorted(manifest) == ["optim/rank-00000.pt", "optim/rank-00001.pt"]
    assert checkpoint.safe_torch_load(ckpt / "optim" / "rank-00001.pt") == {"rank": 1, "step": 2}
