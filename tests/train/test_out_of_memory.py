"""A rank that runs out of memory says why and what fits (zero_train.train.out_of_memory, zero_train.memory.oom).

1. Real ranks under a real limit: two torchrun ranks of GPT-2 25M (fp32, DDP, micro-batch 8 x 256 tokens: our
   estimate 1.66 GB per rank) under `prlimit --data` (RLIMIT_DATA: torch's allocator fails for real) with 0.78 GB
   for the run's tensors. The run exits 1 as before; each rank that failed printed one line naming itself, its
   phase, the largest term of our estimate against what it had and the cheapest change that fits;
   `zero-train explain DIR` says the same from the kept records. Then the named change is run under the same
   limit and finishes, and `zero-train explain` says how close it came.
2. The line's parts from a record (no launch): the phase's words, the largest term, a change of engine.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from zero_train.launch.command import Launch, launch_command
from zero_train.memory.oom import explain, phase_words
from zero_train.runtime.memory_limit import is_out_of_memory
from zero_train.testing import free_port

pytestmark = pytest.mark.tier("quick")

BUDGET = 0.78e9
"""Bytes under the limit beyond a rank's start: the run needs 1.66 GB, micro-batch 1 x accumulation 8 0.66 GB."""
RUN = ["--engine", "ddp", "--model", "gpt2-25m", "--precision", "fp32", "--block-size", "256", "--max-steps", "1",
       "--eval-batches", "1", "--no-progress"]  # fmt: skip
START = """
import os
from zero_train.runtime.memory_limit import proc_status
from zero_train.train.args import parse_args
from zero_train.train.setup import import_run_modules, plan_run
from zero_train.runtime.dist import init_distributed
config = parse_args({run!r})
import_run_modules(config)
plan_run(config, world_size=2)
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}")
init_distributed()
print(proc_status()["VmData"])
"""
LINE = re.compile(r"^error: rank (\d) ran out of memory in (.+?): (.+?) of the ([\d.]+) GB it had \(RLIMIT_DATA\)"
                  r".*; cheapest change that fits: (.+?): predicted ([\d.]+) GB per rank")  # fmt: skip


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", ZT_DEVICE="cpu", PYTHONUNBUFFERED="1")


def _start_bytes() -> int:
    """A rank's VmData before its model exists (the imports reserve ~1.3 GB of it here)."""
    code = START.format(run=RUN, port=free_port())
    out = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


def _launch(flags: list[str], limit: int, output_dir) -> subprocess.CompletedProcess:
    command = launch_command(Launch(launcher="torchrun", nproc_per_node=2, master_port=free_port()),
                             [*RUN, *flags, "--output-dir", str(output_dir)])  # fmt: skip
    return subprocess.run(["prlimit", f"--data={limit}", *command], env=_env(), capture_output=True, text=True,
                          timeout=600)  # fmt: skip


def _explain(cli_main, run_dir) -> list[str]:
    """`zero-train explain RUN_DIR` in this process: it reads the kept records, a fresh interpreter would only add
    its imports (~2.5 CPU-s)."""
    out = cli_main("explain", str(run_dir))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


@pytest.mark.tier("slow")
def test_a_rank_out_of_a_real_memory_limit_names_a_change_that_then_fits(tmp_path, cli_main):
    limit = _start_bytes() + int(BUDGET)
    failed = _launch(["--micro-batch-size", "8"], limit, tmp_path / "failed")
    assert failed.returncode == 1, failed.stderr[-3000:]  # torchrun's code for a failed rank, as before
    lines = [m for m in map(LINE.match, (failed.stdout + failed.stderr).splitlines()) if m]
    assert lines, (failed.stdout + failed.stderr)[-3000:]
    ranks = {int(m.group(1)) for m in lines}
    assert len(ranks) == len(lines)  # one line per failed rank
    for match in lines:
        assert match.group(2).startswith("forward and backward of step 1")
        assert match.group(3).startswith("activations")  # 1.13 GB of activations: the largest term
        assert abs(float(match.group(4)) - BUDGET / 1e9) < 0.15  # what it had: the limit less its start
    change, predicted = lines[0].group(5), float(lines[0].group(6))
    assert predicted * 1e9 < limit and "--micro-batch-size" in change, change
    records = {
        json.loads(p.read_text())["rank"]: p for p in (tmp_path / "failed" / "vitals").glob("rank-*.json")
    }
    assert set(records) == {0, 1}
    explained = _explain(cli_main, tmp_path / "failed")
    for match in lines:  # the same line from the kept records
        assert explained[int(match.group(1))] == match.group(0).removeprefix("error: ").split(" ([enforce")[0]
    fixed = _launch(shlex.split(change), limit, tmp_path / "fixed")
    assert fixed.returncode == 0, (change, (fixed.stdout + fixed.stderr)[-3000:])
    for rank, line in enumerate(_explain(cli_main, tmp_path / "fixed")):
        used, had = map(float, re.search(r"reached ([\d.]+) GB of the ([\d.]+) GB it had", line).groups())
        assert line.startswith(f"rank {rank} finished") and used < had, line


RECORD = dict(
    rank=1, phase=dict(name="forward", step=3, micro_batch=2),
    limit=dict(kind="RLIMIT_DATA", bytes=int(1.6e9), measure="VmData", start_used_bytes=int(1.4e9)),
    run=dict(model="gpt2-25m", vocab_size=8192, engine="ddp", world_size=4, ds_config=None, precision="fp32",
             micro_batch_size=1, grad_accum=4, block_size=64, checkpointing=False, lora=None, device="cpu"),
)  # fmt: skip


def test_the_line_names_the_phase_the_largest_term_and_a_sharded_engine_that_fits():
    result = explain(RECORD)
    assert phase_words(RECORD["phase"], 4) == "forward and backward of step 3 (micro-batch 2 of 4)"
    assert (
        result.had_bytes == int(0.2e9) and result.term == "optimizer_states"
    )  # 16 B/param DDP: Adam 8 of them
    assert result.term_bytes == pytest.approx(8 * 25.5e6, rel=0.05) and result.predicted_bytes > 0.4e9
    assert (
        result.change.startswith("--engine ") and result.change_bytes <= 0.2e9
    )  # ZeRO shards it over 4 ranks
    assert result.line().startswith(
        "rank 1 ran out of memory in forward and backward of step 3 (micro-batch 2 of 4)"
    )


def test_memory_errors_are_told_from_other_errors():
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes")
    )
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_out_of_memory(RuntimeError("Connection closed by peer"))
    assert not is_out_of_memory(ValueError("out of memory"))


def test_explain_without_records_is_one_line_and_exit_2(tmp_path, cli_main):
    out = cli_main("explain", str(tmp_path))
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0
    assert "holds no rank records" in out.stderr and "--output-dir" in out.stderr
