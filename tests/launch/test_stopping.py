"""A stopped command leaves no rank behind (zero_train.launch.launcher.run_logged, zero_train.runtime.lifeline).

Real commands, real launchers, real ranks, all started at once (they overlap their start-up): `zero-train
bench` and `zero-train profile`, each told to train for far longer than the test waits, are stopped while their
ranks train (a step line in the launch's log):

- SIGTERM to the command (a scheduler's time limit, `timeout`: the profile), and SIGINT to its process group
  (Ctrl-C in its terminal: the bench): the command stops its launcher and every rank, says what it stopped in
  one line and exits with 128 + the signal; nothing of it is left 15 s after the signal;
- SIGKILL of the bench (nothing can clean up after it): the kernel's parent-death signal stops the launcher and
  each rank notices its command is gone; nothing is left after 20 s;
- SIGTERM to torchrun, and to DeepSpeed's launcher, training with checkpoints (`timeout`, or a scheduler that
  signals the launcher only): every rank ends within 30 s, the launch exits non-zero, and each rank's one line
  names the last complete checkpoint, which is complete.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from zero_train.checkpoint.rotation import complete_checkpoints
from zero_train.launch.command import Launch, launch_command
from zero_train.runtime.ports import free_port

pytestmark = pytest.mark.tier("slow")

REPO = pathlib.Path(__file__).resolve().parents[2]
FOREVER = "100000"  # steps: far more than the test waits for
TINY = ["--model", "tiny", "--block-size", "32"]
STOPPED_LINE = re.compile(
    r"error: stopped by (SIG\w+): stopped torchrun \(pid \d+\) and every process it started$"
)


def _zero_train(*argv: str) -> list[str]:
    return [sys.executable, "-m", "zero_train.cli.main", *argv]


def _bench(out: pathlib.Path) -> list[str]:
    return _zero_train("bench", *TINY, "--engines", "ddp", "--precisions", "fp32", "--repeats", "1",
                       "--steps", FOREVER, "--warmup", "1", "--out", str(out))  # fmt: skip


def _profile(out: pathlib.Path) -> list[str]:
    return _zero_train("profile", *TINY, "--engines", "zero1", "--world-sizes", "1", "--launcher", "torchrun",
                       "--steps", FOREVER, "--out", str(out))  # fmt: skip


def _train(launcher: str, engine: str):
    def command(out: pathlib.Path) -> list[str]:
        argv = [
            "--engine",
            engine,
            *TINY,
            "--max-steps",
            FOREVER,
            "--output-dir",
            str(out),
            "--save-every",
            "20",
        ]
        return launch_command(Launch(launcher=launcher, nproc_per_node=2, master_port=free_port()), argv)

    return command


# bench and profile stop through the same code (launch.launcher.run_logged raises runtime.errors.Stopped, run_cli
# prints its line): the launcher runs in a session of its own, so SIGTERM to the command and SIGINT to its group
# both reach only the command. One case per command and per signal covers that path; each is ~14 CPU-s.
CASES = {
    "bench-SIGINT-to-its-group": (_bench, signal.SIGINT, True, 15),
    "bench-SIGKILL": (_bench, signal.SIGKILL, False, 20),
    "profile-SIGTERM": (_profile, signal.SIGTERM, False, 15),
    "torchrun-training-SIGTERM": (_train("torchrun", "zero2"), signal.SIGTERM, False, 30),
    "deepspeed-training-SIGTERM": (_train("deepspeed", "ds2"), signal.SIGTERM, False, 30),
}


def _tree(pid: int) -> set[int]:
    """`pid` and its descendants now (from /proc; no psutil needed to read it)."""
    children: dict[int, list[int]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    tree, todo = set(), [pid]
    while todo:
        tree.add(todo[-1])
        todo.extend(children.get(todo.pop(), []))
    return tree


def _alive(pids: set[int]) -> set[int]:
    """The pids that still run (a zombie has ended)."""
    alive = set()
    for pid in pids:
        try:
            state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            alive.add(pid)
    return alive


def _ready(name: str, folder: pathlib.Path) -> bool:
    """Whether the case's ranks train (a step line in a launch's log); a training run: and it saved once."""
    if name.endswith("training-SIGTERM"):
        saved = folder / "out" / "checkpoints"
        return saved.is_dir() and bool(complete_checkpoints(saved))
    return _training(folder / "out") or _training(folder)


def _training(folder: pathlib.Path) -> bool:
    """Whether a launch under `folder` logged a training step (its ranks are past start-up)."""
    logs = [*folder.glob("logs/*.log"), folder / "console.log"]
    return any(path.is_file() and re.search(r"^step +\d", path.read_text(), re.M) for path in logs)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """Start every case at once, stop each once it trains; per case: (exit code or None if it did not exit in
    time, its output, the pids still running at its deadline, the output folder)."""
    root = tmp_path_factory.mktemp("stopping")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    running, results, trees = {}, {}, []
    try:
        for name, (command, *_) in CASES.items():
            out = root / name
            out.mkdir()
            with open(out / "console.log", "w") as console:
                running[name] = subprocess.Popen(command(out / "out"), cwd=REPO, env=env, stdout=console,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 240
        while len(results) < len(running) and time.monotonic() < deadline:
            for name, proc in running.items():
                out = root / name
                if name not in results and _ready(name, out):
                    trees.append(_tree(proc.pid))
                    results[name] = _stop(proc, *CASES[name][1:], trees[-1]) + (out / "out",)
                    results[name] = (results[name][0], (out / "console.log").read_text(), *results[name][1:])
            time.sleep(0.5)
    finally:  # whatever happened above: nothing of this test outlives it
        for proc in running.values():
            trees.append(_tree(proc.pid))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for pid in set().union(*trees):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in running.values():
            proc.wait()
    return results


def _stop(proc: subprocess.Popen, sig: signal.Signals, to_group: bool, within_s: float, tree: set[int]):
    """Send `sig` to `proc` (or its group); (its exit code or None, what of `tree` runs `within_s` s later)."""
    os.killpg(proc.pid, sig) if to_group else os.kill(proc.pid, sig)
    ends = time.monotonic() + within_s
    try:
        code = proc.wait(timeout=within_s)
    except subprocess.TimeoutExpired:
        code = None
    left = _alive(tree)
    while left and time.monotonic() < ends:
        time.sleep(0.2)
        left = _alive(tree)
    return code, left


@pytest.mark.parametrize("name", [name for name in CASES if not name.endswith("training-SIGTERM")])
def test_a_stopped_command_leaves_no_process(stopped, name):
    assert name in stopped, f"{name}: the ranks never logged a training step"
    code, output, left, _ = stopped[name]
    _, sig, _, within_s = CASES[name]
    assert not left, f"{name}: {len(left)} processes still running {within_s} s after {sig.name}"
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        return
    assert code == 128 + sig, output
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and STOPPED_LINE.match(lines[0]).group(1) == sig.name, output


@pytest.mark.parametrize("name", [name for name in CASES if name.endswith("training-SIGTERM")])
def test_a_training_run_stopped_by_sigterm_names_its_last_complete_checkpoint(stopped, name):
    assert name in stopped, f"{name}: the ranks never logged a training step"
    code, output, left, out = stopped[name]
    assert not left, f"{len(left)} processes still running 30 s after SIGTERM"
    assert code != 0
    lines = [line for line in output.splitlines() if line.startswith("error: rank")]
    assert len(lines) == 2, output
    complete = complete_checkpoints(out / "checkpoints")
    assert complete, "no complete checkpoint: the run was stopped before its first save"
    named = {re.search(r"the last complete checkpoint is (\S+):", line).group(1) for line in lines}
    assert named <= {str(folder.resolve()) for folder in complete}, (named, complete)
    assert all("SIGTERM" in line or "launcher" in line for line in lines), output
