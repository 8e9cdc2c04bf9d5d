"""A rank SIGKILLed mid-training through DeepSpeed's launcher: nobody hangs, the dead rank is named, and
`--resume auto` continues from the last complete checkpoint to the same final weights as an uninterrupted run.

For our zero1 and for DeepSpeed ZeRO-1, fp32, 2 CPU ranks, the tiny preset:
1. `deepspeed --num_gpus 2 scripts/train.py ... --save-every 3`; once step 5 is logged, rank 1 gets SIGKILL;
   the launcher must exit non-zero within 60 s, rank 0 printing one `error:` line saying rank 1 was killed
   (SIGKILL) and the memory it held;
2. the same flags with `--resume auto` (in spawned ranks: the launcher's part is over) finish from `latest`;
3. its exported weights equal, bit for bit, those of the same run never interrupted (spawned ranks).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from safetensors.torch import load_file

from zero_train.runtime import vitals
from zero_train.testing import free_port, run_ranks
from zero_train.testing.console import train_py

pytestmark = pytest.mark.tier("slow")

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
STEPS = 8
KILL_AFTER_STEP = 5
ENV = dict(
    os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1"
)
CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "steps_per_print": 10**9,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "torch_adam": True}},
    "zero_optimization": {"stage": 1, "reduce_bucket_size": 200_000, "allgather_bucket_size": 200_000},
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> pathlib.Path:
    from zero_train.hf.offline import stdlib_files

    root = tmp_path_factory.mktemp("faults")
    (root / "corpus.txt").write_text("\n\n".join(p.read_text(errors="replace") for p in stdlib_files(60_000)))
    (root / "zero1.json").write_text(json.dumps(CONFIG))
    return root


def _flags(workdir: pathlib.Path, engine: str, out: pathlib.Path, *extra: str) -> list[str]:
    return [
        "--deepspeed_config", str(workdir / "zero1.json"), "--engine", engine, "--model", "tiny",
        "--dataset", str(workdir / "corpus.txt"), "--block-size", "32", "--seed", "5", "--no-progress",
        "--eval-every", "0", "--max-steps", str(STEPS), "--export-hf", str(out / "hf"), *extra,
    ]  # fmt: skip


def _launch(flags: list[str], env: dict | None = None) -> subprocess.Popen:
    cmd = [
        str(BIN / "deepspeed"),
        "--num_gpus",
        "2",
        "--master_port",
        str(free_port()),
        "scripts/train.py",
        *flags,
    ]
    return subprocess.Popen(
        cmd, cwd=REPO, env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _steps_logged(metrics: pathlib.Path) -> int:
    if not metrics.is_file():
        return 0
    return sum(1 for line in metrics.read_text().splitlines() if '"loss"' in line)


def _rank_pid(launcher: subprocess.Popen, rank: int) -> int | None:
    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "scripts/train.py" in child.cmdline():
                return child.pid
        except psutil.Error:
            continue
    return None


def _kill_rank_after(launcher: subprocess.Popen, metrics: pathlib.Path, rank: int, step: int) -> float:
    """SIGKILL `rank` once `step` steps are in the metrics file; returns when it was killed."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and launcher.poll() is None:
        if _steps_logged(metrics) >= step and (pid := _rank_pid(launcher, rank)) is not None:
            os.kill(pid, signal.SIGKILL)
            return time.monotonic()
        time.sleep(0.1)
    output = launcher.communicate(timeout=60)[0] if launcher.poll() is not None else ""
    launcher.kill()
    pytest.fail(f"never reached step {step} to kill rank {rank}:\n{output[-3000:]}")


def _reference_runs(rank: int, world_size: int, runs: list[list[str]]) -> None:
    from zero_train.runtime.dist import init_distributed
    from zero_train.train.args import parse_args
    from zero_train.train.loop import Trainer
    from zero_train.train.setup import plan_run

    for argv in runs:
        args = parse_args(argv)
        Trainer(args, plan_run(args, world_size=world_size), init_distributed()).run()


@pytest.fixture(scope="module")
def uninterrupted(workdir) -> dict[str, pathlib.Path]:
    """The exported weights of both engines trained STEPS steps without interruption."""
    outs = {engine: workdir / f"reference-{engine}" for engine in ("zero1", "deepspeed")}
    runs = [_flags(workdir, engine, out) for engine, out in outs.items()]
    run_ranks(_reference_runs, 2, (runs,), timeout_s=300)
    return outs


@pytest.mark.tier("multiproc")
@pytest.mark.parametrize("engine", ["zero1", "deepspeed"])
def test_sigkilled_rank_fails_fast_naming_it_and_resume_matches_uninterrupted(workdir, uninterrupted, engine):
    out = workdir / f"killed-{engine}"
    save = [
        "--save-dir",
        str(out / "ckpt"),
        "--save-every",
        "3",
        "--metrics-file",
        str(out / "metrics.jsonl"),
    ]
    run_dir = out / "run"  # the ranks' heartbeats (zero_train.runtime.vitals)
    launcher = _launch(_flags(workdir, engine, out, *save), env=dict(ENV, ZT_RUN_DIR=str(run_dir)))
    killed_at = _kill_rank_after(launcher, out / "metrics.jsonl", rank=1, step=KILL_AFTER_STEP)
    try:
        output = launcher.communicate(timeout=60)[0]  # a hang fails here
    except subprocess.TimeoutExpired:
        launcher.kill()
        pytest.fail("the launcher did not exit within 60 s of rank 1's death")
    assert time.monotonic() - killed_at < 60
    assert launcher.returncode != 0
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors and all("rank 1 was killed (SIGKILL)" in line for line in errors), output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    left = json.loads((run_dir / "rank-1.json").read_text())  # the killed rank's last heartbeat
    assert left["estimate"] == (f"zero-train estimate --model tiny --world-size 2 --config {workdir / 'zero1.json'} "
                                "--micro-batch-size 2 --grad-accum 1 --block-size 32 --device cpu")  # fmt: skip
    assert f"it held {vitals.amount(left['rss_bytes'])}" in errors[0]
    latest = (out / "ckpt" / "latest").read_text().strip()
    assert latest in ("step-00000003", "step-00000006")  # the last complete save before the kill
    assert not (out / "hf").exists()

    resumed = run_ranks(
        train_py, 2, (_flags(workdir, engine, out, *save, "--resume", "auto"),), timeout_s=300
    )
    assert [code for code, _, _ in resumed] == [0, 0], [err[-3000:] for _, _, err in resumed]
    assert f"resumed from {out / 'ckpt' / latest} at step {int(latest[5:])}" in resumed[0][1]
    final = load_file(out / "hf" / "model.safetensors")
    reference = load_file(uninterrupted[engine] / "hf" / "model.safetensors")
    assert final.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(final[name], tensor), f"{engine}: {name} differs from the uninterrupted run"


# -- storage faults during a save: a full disk, one rank's save dir turning read-only ----------------------------
# The full disk runs in spawned ranks (zero_train.testing.console.train_py: train.py's main, its console
# captured); the read-only save dir in plain rank processes (RANK/WORLD_SIZE in the environment, no launcher), rank 1
# in its own mount namespace. Every rank must exit 1 with exactly one `error:` line and no traceback; `latest` and
# every complete checkpoint stay as they were, and no staging folder is left.
SAVE_FAILED = (
    r"error: rank {rank}: saving checkpoint step-(\d{{8}}) failed: {culprit}{cause} on {save_dir} \({detail}\); "
    r"the last complete checkpoint (step-\d{{8}}) is intact; {fix} and resume with --resume auto"
)


def _launch_ranks(flags: list[str], *, rank1_prefix: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = dict(ENV, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
        command = [*(rank1_prefix if rank == 1 else ()), sys.executable, "scripts/train.py", *flags]
        procs.append(
            subprocess.Popen(
                command,
                cwd=REPO,
                env=dict(env, MASTER_PORT=port),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    return procs


def _one_error_line_each(procs: list[subprocess.Popen]) -> list[str]:
    """Wait for every rank; each must exit 1 with exactly one `error:` line and no traceback."""
    ended = []
    for rank, proc in enumerate(procs):
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            pytest.fail(f"rank {rank} did not exit")
        ended.append((proc.returncode, err))
    return _one_error_line(ended)


def _one_error_line(ended: list[tuple[int, str]]) -> list[str]:
    """Each rank's (exit code, stderr): exit 1 with exactly one `error:` line and no traceback."""
    lines = []
    for code, err in ended:
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 1 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
        lines.append(errors[0])
    return lines


def _only_complete_checkpoints(save_dir: pathlib.Path, latest: str) -> list[str]:
    from zero_train.checkpoint import atomic

    assert (save_dir / "latest").read_text().strip() == latest
    assert atomic.resolve(save_dir) == save_dir / latest  # every file verified against its manifest
    names = sorted(p.name for p in save_dir.iterdir())
    assert not [name for name in names if ".tmp" in name], names  # the staging folder was removed
    return names


@pytest.mark.tier("multiproc")
def test_full_disk_during_a_save_stops_every_zero1_rank_with_one_line(workdir, tmp_path):
    from zero_train.testing.storage import tmpfs

    with tmpfs(
        tmp_path / "fs", "12m"
    ) as fs:  # one tiny zero1 checkpoint (8.3 MB with its tokenizer) fits, two do not
        save_dir = fs / "ckpt"
        # spawned ranks (train.py's main, its console captured): the fault is the loop's, not the interpreter's
        flags = _flags(workdir, "zero1", tmp_path, "--save-dir", str(save_dir), "--save-every", "2")
        lines = _one_error_line(
            [(code, err) for code, _, err in run_ranks(train_py, 2, (flags,), timeout_s=300)]
        )
        for rank, line in enumerate(lines):
            pattern = SAVE_FAILED.format(
                rank=rank, culprit="", cause="no space left on device", save_dir=save_dir,
                detail=r"[34]\.\d MB free, this checkpoint needs about [78]\.\d MB", fix="free space",
            )  # fmt: skip
            match = re.fullmatch(pattern, line)
            assert match and match.groups() == ("00000004", "step-00000002"), line
        assert _only_complete_checkpoints(save_dir, "step-00000002") == ["latest", "step-00000002"]


@pytest.mark.tier("multiproc")
def test_save_dir_read_only_for_one_rank_during_a_background_save_stops_every_rank(workdir, tmp_path):
    """DeepSpeed ZeRO-1, --async-save, --save-total-limit 1: rank 1 runs in its own mount namespace, where the
    save dir turns read-only once the first checkpoint is complete; rank 0 still writes its files. The ranks
    agree in the background thread, so none publishes, and both stop at the same step."""
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    private_mount = ("unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount --bind "$0" "$0" && exec "$@"',
                     str(save_dir))  # fmt: skip
    if os.geteuid() != 0 or subprocess.run([*private_mount, "true"], capture_output=True).returncode != 0:
        pytest.skip("needs root (a private mount namespace per rank: unshare --mount)")
    flags = _flags(workdir, "deepspeed", tmp_path, "--save-dir", str(save_dir), "--save-every", "2",
                   "--async-save", "--save-total-limit", "1", "--max-steps", "16")  # fmt: skip
    procs = _launch_ranks(flags, rank1_prefix=private_mount)
    deadline = time.monotonic() + 240
    while not (save_dir / "latest").exists() and time.monotonic() < deadline and procs[1].poll() is None:
        time.sleep(0.02)
    remount = ["nsenter", "-t", str(procs[1].pid), "-m", "mount", "-o", "remount,bind,ro", str(save_dir)]
    subprocess.run(remount, check=True, capture_output=True)
    lines = _one_error_line_each(procs)
    steps = set()
    for rank, line in enumerate(lines):
        pattern = SAVE_FAILED.format(
            rank=rank, culprit="" if rank == 1 else "rank 1: ", cause="read-only file system", save_dir=save_dir,
            detail=r"\[Errno 30\] Read-only file system: .*", fix=r"make it writable \(or pick another --save-dir\)",
        )  # fmt: skip
        match = re.fullmatch(pattern, line)
        assert match, line
        steps.add(match.groups())
    (failed, latest), *others = steps
    assert not others and int(failed) > int(latest[5:])  # every rank names the same save and checkpoint
    assert _only_complete_checkpoints(save_dir, latest) == ["latest", latest]  # --save-total-limit 1


SIGTERM_DURING_THE_REPORT = """
import os, signal
from zero_train.runtime import errors, faults

faults.install_sigterm_report()  # as record_peers installs it
describe = faults.describe_fault

def describe_while_the_launcher_terminates(err):
    os.kill(os.getpid(), signal.SIGTERM)  # the launcher's SIGTERM lands while the survivor reports
    return describe(err)

faults.describe_fault = describe_while_the_launcher_terminates

def entry():
    raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")

errors.run_cli(entry)
"""


def test_sigterm_while_a_survivor_reports_the_dead_rank_prints_no_traceback():
    """The launcher terminates the survivors while they report the dead peer: one line, exit 1, no traceback."""
    proc = subprocess.run([sys.executable, "-c", SIGTERM_DURING_THE_REPORT], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and lines[0].startswith("error: rank 0:") and "Connection reset by peer" in lines[0]
    )


SIGTERM_WHILE_BLOCKED_IN_CPP = """
import datetime, json, os, socket, subprocess, sys
import torch.distributed as dist
from zero_train.runtime import errors, faults

dead = subprocess.Popen([sys.executable, "-c", "pass"])
dead.wait()  # rank 1's process: gone
host = socket.gethostname()
os.environ.update(RANK="0", ZT_PEERS=json.dumps([[host, os.getpid()], [host, dead.pid]]))
faults.SIGTERM_GRACE_S = 2.0
faults.install_sigterm_report()
store = dist.TCPStore("127.0.0.1", 0, world_size=2, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=120))

def entry():
    print("blocked", flush=True)
    store.get("rank 1 never writes this")  # as a new gloo group's rendezvous waits for a dead peer

errors.run_cli(entry)
"""


def test_sigterm_while_the_main_thread_is_blocked_in_cpp_still_names_the_dead_rank():
    """The main thread waits in C++ (a TCPStore rendezvous for a peer that died): Python cannot run the
    SIGTERM handler there, yet within the grace period the process prints one line naming the dead rank and
    exits 1, long before the launcher's SIGKILL (30 s) or the store's timeout (120 s)."""
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_WHILE_BLOCKED_IN_CPP], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout.readline() == "blocked\n"
        time.sleep(0.5)  # inside store.get
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=25)
    finally:
        proc.kill()
    assert proc.returncode == 1, stderr
    assert 2.0 <= time.monotonic() - sent < 20
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: rank 0: rank 1 died (its process exited);"), stderr
    assert "SIGTERM" in lines[0] and "--resume auto" in lines[0]


def test_a_peer_still_exiting_when_its_socket_closed_is_named(monkeypatch):
    """SIGKILL closes the peer's sockets before its process is gone: the survivor, told "Connection reset by
    peer" while rank 1 is still exiting (here: a process that ends 0.5 s later), still names rank 1."""
    import socket

    from zero_train.runtime import faults

    dying = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        host = socket.gethostname()
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv(faults.PEERS_ENV, json.dumps([[host, os.getpid()], [host, dying.pid]]))
        assert faults.dead_peers() == []  # alive when the fault is noticed
        started = time.monotonic()
        line = faults.describe_fault(RuntimeError("[pair.cc:537] Read error: Connection reset by peer"))
        assert line.startswith("rank 0: rank 1 died (its process exited);"), line
        assert time.monotonic() - started < faults.PEER_EXIT_WAIT_S
    finally:
        dying.kill()
        dying.wait()
