"""`zero-train plan -o`: the commands it prints run as printed, and what it writes is not overwritten unasked.

- The plan for `tiny` on 2 CPU ranks, written as an accelerate YAML + JSON: its printed torchrun line and its
  printed accelerate line, pasted into a shell, each train 2 steps, and both runs give the same losses (the same
  engine on the same data from the same weights; accelerate starts torchrun underneath).
- A 2-node plan's torchrun line (one line for every node, $NODE_RANK and $MASTER_ADDR set per node) and its SLURM
  batch script (srun, scontrol and torchrun replaced by recorders): each node's torchrun gets its node rank and
  node 0's address, and the train flags it gets parse back to the run config the plan chose.
- An existing output file is refused without --force (one line naming the file and --force), and nothing of
  it changes.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from zero_train.testing import free_port

pytestmark = pytest.mark.tier("slow")

BIN = pathlib.Path(sys.executable).parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
           PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")  # fmt: skip
PLAN = ["plan", "--model", "tiny", "--gpus-per-node", "2", "--gpu-memory", "1", "--host-memory", "20",
        "--global-batch-size", "4", "--block-size", "32", "--device", "cpu", "--precision", "fp32"]  # fmt: skip


def _plan(*flags: str, cwd: pathlib.Path, capsys, monkeypatch) -> str:
    """`zero-train plan` run in this process from `cwd` (what it prints is what a shell prints; the launches
    below are what is tested, not the plan's interpreter start): its stdout."""
    from zero_train.cli.main import main

    monkeypatch.chdir(cwd)
    with pytest.raises(SystemExit) as exited:
        main([*PLAN, *flags])
    printed = capsys.readouterr()
    assert exited.value.code == 0, printed.err[-3000:]
    return printed.out


def _run_line(stdout: str, launcher: str) -> str:
    """The printed command of one launcher in the plan's run block."""
    found = [line.split(None, 1)[1] for line in stdout.splitlines() if line.startswith(f"  {launcher} ")]
    assert len(found) == 1, stdout
    return found[0]


def _chosen_config(argv: list[str], *, json_path: str):
    """The run config of the set-up the plan chooses, computed in process (the reference for the printed flags)."""
    from zero_train.cli.main import build_parser
    from zero_train.cli.plan import request_from_args
    from zero_train.cli.plan_run import train_config
    from zero_train.memory.model.plan import make_plan

    args = build_parser(argv).parse_args(argv)
    chosen = make_plan(request_from_args(args)).chosen
    return train_config(chosen, model=args.model, block_size=args.block_size, json_path=json_path)


def _losses(stdout: str) -> list[str]:
    return re.findall(r"^step \d+/\d+ \| loss (\S+)", stdout, flags=re.MULTILINE)


@pytest.mark.tier("multiproc")
def test_the_printed_torchrun_and_accelerate_lines_train_as_printed(tmp_path, capsys, monkeypatch):
    made = _plan("--format", "accelerate", "-o", "plan.yaml", "--max-steps", "2", "--master-port", str(free_port()),
                 cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)  # fmt: skip
    assert "wrote plan.yaml and plan.json" in made
    losses = {}
    for launcher in ("torchrun", "accelerate"):
        line = _run_line(made, launcher)
        assert (
            line.startswith(f"{launcher} ")
            and "--model tiny" in line
            and "--deepspeed_config plan.json" in line
        )
        run = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                             timeout=400)  # fmt: skip
        assert run.returncode == 0, (launcher, run.stdout[-2000:], run.stderr[-3000:])
        losses[launcher] = _losses(run.stdout + run.stderr)
    assert len(losses["torchrun"]) == 2 and losses["torchrun"] == losses["accelerate"], losses


RECORDER = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["RECORD"], "a") as out:
    out.write(json.dumps(dict(argv=sys.argv[1:], node=os.environ.get("SLURM_NODEID"))) + "\\n")
"""
SRUN = """#!/usr/bin/env bash
# srun of one task per node on 2 nodes: run the command (after srun's own options) once per node
while [[ "$1" == --* ]]; do shift; done
for node in 0 1; do SLURM_NODEID=$node "$@"; done
"""


def test_two_nodes_each_torchrun_gets_its_rank_and_node_0_from_the_line_and_the_slurm_script(
    tmp_path, capsys, monkeypatch
):
    from zero_train.train.args import parse_args

    fake = tmp_path / "bin"
    fake.mkdir()
    for name, text in (
        ("torchrun", RECORDER),
        ("srun", SRUN),
        ("scontrol", "#!/usr/bin/env bash\necho node-a\n"),
    ):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    env = dict(ENV, PATH=f"{fake}{os.pathsep}{ENV['PATH']}", RECORD=str(tmp_path / "record.jsonl"))
    out = tmp_path / "plan.sbatch"
    made = _plan("--nodes", "2", "--global-batch-size", "8", "--format", "slurm", "-o", str(out), cwd=tmp_path,
                 capsys=capsys, monkeypatch=monkeypatch)  # fmt: skip
    line = _run_line(made, "torchrun")
    for node in (0, 1):  # the same printed line on both nodes, each with its own NODE_RANK
        subprocess.run(["bash", "-c", line], cwd=tmp_path, env=dict(env, NODE_RANK=str(node), MASTER_ADDR="node-a"),
                       check=True, timeout=60)  # fmt: skip
    subprocess.run(["bash", str(out)], cwd=tmp_path, env=dict(env, SLURM_JOB_NODELIST="node-[a-b]"), check=True,
                   timeout=60)  # fmt: skip
    records = [json.loads(text) for text in (tmp_path / "record.jsonl").read_text().splitlines()]
    assert len(records) == 4  # 2 nodes from the printed line, 2 from the batch script
    chosen = _chosen_config(
        [*PLAN, "--nodes", "2", "--global-batch-size", "8"], json_path=str(tmp_path / "plan.json")
    )
    for index, record in enumerate(records):
        argv = record["argv"]
        launcher, train = argv[: argv.index("-m")], argv[argv.index("-m") + 2 :]
        flags = dict(zip(launcher[::2], launcher[1::2], strict=True))
        assert flags == {"--nproc_per_node": "2", "--nnodes": "2", "--node_rank": str(index % 2),
                         "--master_addr": "node-a", "--master_port": "29500"}, record  # fmt: skip
        assert parse_args(train) == chosen, record
    assert "#SBATCH --nodes=2" in out.read_text() and "--gpus-per-node" not in out.read_text()  # CPU ranks


@pytest.mark.tier("quick")
def test_an_existing_output_is_refused_without_force(tmp_path, capsys):
    from zero_train.cli.main import main

    json_path = tmp_path / "plan.json"
    json_path.write_text("{}")
    with pytest.raises(SystemExit) as refused:
        main([*PLAN, "-o", str(json_path)])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert (
        refused.value.code == 2
        and len(errors) == 1
        and str(json_path) in errors[0]
        and "--force" in errors[0]
    )
    assert json_path.read_text() == "{}"
    yaml_path = tmp_path / "plan.yaml"  # the JSON beside an accelerate YAML counts too
    with pytest.raises(SystemExit) as refused:
        main([*PLAN, "--format", "accelerate", "-o", str(yaml_path)])
    assert refused.value.code == 2 and not yaml_path.exists()
    with pytest.raises(SystemExit) as forced:
        main([*PLAN, "-o", str(json_path), "--force"])
    assert forced.value.code == 0 and json.loads(json_path.read_text())["zero_optimization"]["stage"] == 0
