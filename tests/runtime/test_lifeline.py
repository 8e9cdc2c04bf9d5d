"""A launched rank stops by itself when its launch is gone (zero_train.runtime.lifeline).

Real processes, no torch: a stand-in launcher starts a rank (a `run_cli` entry that would sleep for minutes);
the launcher is SIGKILLed (nothing can clean up after that) and the rank must be gone within 10 s, its one line
naming what went. The same for the command that launched it (ZT_OWNER), and a process no launcher started
(a `nohup`ed run whose shell has gone) is left alone.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from zero_train.runtime import lifeline

pytestmark = pytest.mark.tier("slow")

REPO = pathlib.Path(__file__).resolve().parents[2]
RANK = """
import time
from zero_train.runtime.errors import run_cli

def entry():
    print("started", flush=True)  # run_cli has started the watch
    time.sleep(300)

run_cli(entry)
"""
LAUNCHER = f"""
import os, subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", {RANK!r}], stdout=subprocess.PIPE, stderr=open(sys.argv[1], "w"),
                        text=True, env=dict(os.environ, **eval(sys.argv[2])))
assert rank.stdout.readline() == "started\\n"
print(rank.pid, flush=True)
time.sleep(300)
"""
STOPPED_WITHIN_S = 10.0


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if lifeline.process_token(pid) is None:
            return True
        time.sleep(0.1)
    return False


def _launch(tmp_path, rank_env: dict) -> tuple[subprocess.Popen, int, pathlib.Path]:
    """A stand-in launcher and the pid of the rank it started (once the rank runs its entry)."""
    stderr = tmp_path / "rank.err"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(stderr), repr(rank_env)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", lifeline.OWNER_ENV)},
    )
    return launcher, int(launcher.stdout.readline()), stderr


def test_a_rank_whose_launcher_is_killed_stops_within_10_s(tmp_path):
    launcher, rank, stderr = _launch(tmp_path, {"LOCAL_RANK": "0", "RANK": "3"})
    launcher.kill()
    launcher.wait()
    assert _gone_within(rank, STOPPED_WITHIN_S), "the orphaned rank still runs"
    assert (
        f"error: rank 3: its launcher (pid {launcher.pid}) is gone, so this rank stopped"
        in stderr.read_text()
    )


def test_a_rank_whose_command_is_killed_stops_within_10_s(tmp_path):
    command = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    time.sleep(0.2)
    token = lifeline.process_token(command.pid)
    assert token is not None and token.startswith(f"{command.pid}:")
    launcher, rank, stderr = _launch(tmp_path, {lifeline.OWNER_ENV: token})
    try:
        command.kill()
        command.wait()
        assert _gone_within(rank, STOPPED_WITHIN_S), "the rank outlived the command that launched it"
        assert f"the command that launched it (pid {command.pid}) is gone" in stderr.read_text()
    finally:
        launcher.kill()
        launcher.wait()


def test_a_process_no_launcher_started_outlives_its_parent(tmp_path):
    launcher, rank, _ = _launch(tmp_path, {})
    launcher.kill()
    launcher.wait()
    try:
        assert not _gone_within(rank, 2.5 * lifeline.POLL_S), "a nohup'ed run was stopped"
    finally:
        os.kill(rank, signal.SIGKILL)
