"""A rank the kernel kills (SIGKILL) is named as killed, with the memory it held (zero_train.runtime.vitals).

1. Two plain rank processes; rank 1 allocates 300 MB, waits for its heartbeat, prints its resident memory and
   SIGKILLs itself: rank 0's one `error:` line says "rank 1 was killed (SIGKILL)" and the memory rank 1 printed.
2. A launcher that set ZT_RUN_DIR (zero_train.launch.launcher.run_logged, as profile and bench cells and the
   bench's one launch run): a single rank killed the same way (nobody left to say it) is named at the end of
   the log.
3. The words for each cause: the host's OOM-kill count rose (the out-of-memory killer, with the run's
   `zero-train estimate` command), it could not be read ("most likely out of host memory"), it did not rise,
   a native crash (faulthandler's record).
(tests/train/test_faults.py's launcher test checks the same through DeepSpeed's launcher and scripts/train.py.)
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from zero_train.runtime import vitals
from zero_train.testing import free_port

pytestmark = pytest.mark.tier("quick")

REPO = pathlib.Path(__file__).resolve().parents[2]
ALLOCATE = 300_000_000
ESTIMATE = dict(model="tiny", world_size=2, config=None, precision="fp32", micro_batch_size=2, grad_accum=1,
                block_size=64, gradient_checkpointing=False, device="cpu")  # fmt: skip

RANKS = f"""
import os, signal, time
import torch, torch.distributed as dist
from zero_train.runtime import errors, vitals
from zero_train.runtime.dist import init_distributed

def entry():
    info = init_distributed()
    vitals.note_estimate(**{ESTIMATE!r})
    dist.barrier()
    if info.rank == 1:
        held = torch.ones({ALLOCATE} // 4)  # written: resident
        time.sleep(3 * vitals.HEARTBEAT_S)  # a heartbeat with it
        print(vitals.resident_bytes(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))  # rank 0 waits for rank 1
    dist.barrier()

errors.run_cli(entry)
"""

ALONE = f"""
import os, signal, time
from zero_train.runtime import vitals

vitals.start_heartbeat(0, None)  # ZT_RUN_DIR from the launcher
held = bytearray({ALLOCATE})
time.sleep(3 * vitals.HEARTBEAT_S)
os.kill(os.getpid(), signal.SIGKILL)
"""
HELD = re.compile(r"it held (\d+) MB")


@pytest.mark.tier("slow")
def test_survivor_names_the_sigkilled_rank_and_the_memory_it_held(tmp_path):
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), ZT_DEVICE="cpu",
               ZT_RUN_DIR=str(tmp_path / "run"))  # fmt: skip
    oom_before = vitals.oom_kills()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANKS],
            cwd=REPO,
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in (0, 1)
    ]
    (out0, err0), (out1, _) = (proc.communicate(timeout=120) for proc in procs)
    assert procs[1].returncode == -9 and procs[0].returncode == 1, err0
    lines = err0.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: rank 0: rank 1 was killed (SIGKILL)"), err0
    held_mb = int(HELD.search(lines[0]).group(1))
    assert held_mb == round(int(out1) / 1e6) and held_mb > ALLOCATE / 1e6  # what rank 1 measured just before
    if vitals.oom_kills() == oom_before:  # no out-of-memory kill on this host meanwhile: it was not one
        assert "by a user or a scheduler, not out of memory" in lines[0]
    assert not (tmp_path / "run" / "rank-0.json").exists()  # rank 0 ended through Python: its file is gone


@pytest.mark.parametrize("many_runs", [False, True], ids=["a-cell", "the-bench-one-launch"])
def test_the_launcher_names_a_killed_single_rank(tmp_path, many_runs):
    """A profile or bench cell's launch, and the bench's one launch of many runs (watched by done files)."""
    from zero_train.launch.cells import last_error_line
    from zero_train.launch.launcher import run_logged

    log = tmp_path / "cell.log"
    done_files = [tmp_path / "run.done.json"] if many_runs else None
    code = run_logged([sys.executable, "-c", ALONE], log, timeout=120, done_files=done_files)
    assert code == -9
    line = last_error_line(log.read_text())
    assert line.startswith("error: rank 0 was killed (SIGKILL)"), log.read_text()
    assert int(HELD.search(line).group(1)) > ALLOCATE / 1e6


def test_the_words_for_each_way_a_rank_ended(monkeypatch):
    monkeypatch.setenv(vitals.ESTIMATE_ENV, "")  # note_estimate sets it: restored after the test
    estimate = vitals.note_estimate(**ESTIMATE)
    assert estimate == ("zero-train estimate --model tiny --world-size 2 --precision fp32 --micro-batch-size 2 "
                        "--grad-accum 1 --block-size 64 --device cpu")  # fmt: skip
    now = vitals.oom_kills()
    assert now is not None  # /proc/vmstat (Linux >= 4.13)
    record = dict(rss_bytes=10_300_000_000, estimate=estimate, crash="")
    oom = vitals.describe_ended(1, dict(record, oom_kills=now - 1))
    assert oom == (f"rank 1 was killed (SIGKILL), by the kernel's out-of-memory killer: it held 10.3 GB; "
                   f"what this run needs per rank: {estimate}")  # fmt: skip
    unknown = vitals.describe_ended(1, dict(record, oom_kills=None))
    assert unknown.startswith("rank 1 was killed (SIGKILL), most likely out of host memory: it held 10.3 GB;")
    not_oom = vitals.describe_ended(1, dict(record, oom_kills=now))
    assert (
        not_oom == "rank 1 was killed (SIGKILL) by a user or a scheduler, not out of memory: it held 10.3 GB"
    )
    zombie_status = 9  # a wait status seen in /proc/PID/stat before the launcher reaped it
    assert vitals.describe_ended(1, dict(record, oom_kills=None), zombie_status).startswith(
        "rank 1 was killed (SIGKILL)"
    )
    crash = dict(record, crash="Fatal Python error: Segmentation fault\n\nCurrent thread ...")
    assert vitals.describe_ended(1, crash) == "rank 1 crashed (Segmentation fault) holding 10.3 GB"
