"""accelerate: generated YAMLs, the YAML/JSON agreement check, and real `accelerate launch` runs.

- `zero-train config --format accelerate` writes a YAML whose fields match the JSON (DeepSpeed plugin:
  config file, zero3_init_flag, mixed_precision; FSDP plugin: version 2, reshard_after_forward by stage);
  each disagreement is found by `agreement_problems` (and by `config check --accelerate`: exit 2, one line);
- scripts/train.py started with a disagreeing accelerate environment exits 2 before training;
- the DeepSpeed plugin on 2 processes (one machine, ZeRO-2 fp32) and the FSDP plugin on two "machines" of
  one process each (two `accelerate launch` on 127.0.0.1 with machine ranks 0 and 1, fsdp2 stage 2 fp32)
  train the same data from the same weights: their losses agree within float rounding, since ZeRO-2 and
  FSDP2 both equal DDP in fp32 (tests/engines/test_engines.py, tests/engines/test_fsdp2.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from zero_train.testing import free_port

pytestmark = pytest.mark.tier("slow")

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
ENV = dict(
    os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1"
)
STEPS = 4
TRAIN = ["--model", "tiny", "--block-size", "32", "--max-steps", str(STEPS), "--no-progress", "--eval-batches", "1",
         "--seed", "5"]  # fmt: skip


def _zero_train(capsys, *argv: str) -> subprocess.CompletedProcess:
    """`zero-train ARGV` in this process (the console script's main and run_cli; the commands here only write
    files and check arguments, a fresh interpreter would only add its imports)."""
    from zero_train.cli.main import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, exit_info.value.code, captured.out, captured.err)


def _config(capsys, *flags: str, out: pathlib.Path) -> subprocess.CompletedProcess:
    return _zero_train(capsys, "config", *flags, "-o", str(out))


def _stage_config(stage: int, precision: str = "fp32") -> dict:
    cfg = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage}}
    if precision != "fp32":
        cfg[precision] = {"enabled": True}
    return cfg


@pytest.mark.tier("quick")
def test_yaml_fields_and_every_disagreement():
    from zero_train.ds_config.accelerate import accelerate_config, agreement_problems, launch_fields

    ds3 = accelerate_config(_stage_config(3, "bf16"), json_path="ds.json", num_processes=2)
    assert ds3["distributed_type"] == "DEEPSPEED" and ds3["mixed_precision"] == "bf16"
    assert ds3["deepspeed_config"]["zero3_init_flag"] is True and ds3["use_cpu"] is False
    fsdp = accelerate_config(_stage_config(2), json_path="ds.json", engine="fsdp2")
    assert (
        fsdp["fsdp_config"]["fsdp_version"] == 2
        and fsdp["fsdp_config"]["fsdp_reshard_after_forward"] is False
    )
    assert fsdp["mixed_precision"] == "no"
    for yaml_dict, cfg in ((ds3, _stage_config(3, "bf16")), (fsdp, _stage_config(2))):
        assert agreement_problems(cfg, launch_fields(yaml_dict, from_env=False)) == []
    # each field that must agree, broken once: exactly one problem naming it
    cases = [
        (ds3, _stage_config(3, "fp16"), "mixed_precision"),
        (ds3, _stage_config(2, "bf16"), "zero3_init_flag"),
        (fsdp, _stage_config(3), "fsdp_reshard_after_forward"),
        (fsdp, _stage_config(1), "stage 2 or 3"),
    ]
    for yaml_dict, cfg, needle in cases:
        problems = agreement_problems(cfg, launch_fields(yaml_dict, from_env=False))
        assert len(problems) == 1 and needle in problems[0], (needle, problems)
    env = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1", "ACCELERATE_MIXED_PRECISION": "no"}
    problems = agreement_problems(_stage_config(2), launch_fields(env, from_env=True), engine="deepspeed")
    assert [("--engine fsdp2" in p, "fsdp_version" in p) for p in problems] == [(True, False), (False, True)]


@pytest.mark.tier("quick")
def test_config_check_accelerate_and_train_refuse_a_mismatch(tmp_path, capsys, monkeypatch):
    made = _config(capsys, "--stage", "3", "--precision", "bf16", "--world-size", "2", "--model", "tiny",
                   "--format", "accelerate", out=tmp_path / "accel.yaml")  # fmt: skip
    assert made.returncode == 0, made.stderr
    fields = yaml.safe_load((tmp_path / "accel.yaml").read_text())
    assert fields["deepspeed_config"]["deepspeed_config_file"] == str(tmp_path / "accel.json")
    broken = dict(fields, mixed_precision="fp16")
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(broken))
    check = ["config", "check", str(tmp_path / "accel.json")]
    ok = _zero_train(capsys, *check, "--accelerate", str(tmp_path / "accel.yaml"))
    assert ok.returncode == 0 and "agrees" in ok.stdout, ok.stderr
    bad = _zero_train(capsys, *check, "--accelerate", str(tmp_path / "broken.yaml"))
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 2 and len(errors) == 1 and "mixed_precision" in errors[0], bad.stderr
    # what `accelerate launch --config_file broken.yaml` puts in the environment: refused before training
    # (train.py's main in this process: the check runs in plan_run, before any process group or collective)
    from zero_train.runtime.errors import run_cli
    from zero_train.train.args import parse_args
    from zero_train.train.loop import run_training

    for name, value in dict(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_MIXED_PRECISION="fp16",
                            ACCELERATE_DEEPSPEED_CONFIG_FILE=str(tmp_path / "accel.json")).items():  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WORLD_SIZE", "2")  # as under the launcher: a collective here would hang, not pass
    monkeypatch.setenv("RANK", "1")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_cli(lambda: run_training(parse_args(TRAIN)))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "mixed_precision" in err and "Traceback" not in err, err


def _losses(path: pathlib.Path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines() if '"loss"' in line]


@pytest.mark.tier("multiproc")
def test_accelerate_launch_deepspeed_plugin_and_two_machine_fsdp_plugin(tmp_path, capsys):
    for engine, stage, processes, machines in (("deepspeed", 2, 2, 1), ("fsdp2", 2, 2, 2)):
        made = _config(capsys, "--stage", str(stage), "--world-size", str(processes), "--model", "tiny", "--engine", engine,
                       "--lr", "3e-3", "--micro-batch-size", "2",
                       "--num-machines", str(machines), "--main-process-ip", "127.0.0.1",
                       "--main-process-port", str(free_port()), "--format", "accelerate",
                       out=tmp_path / f"{engine}.yaml")  # fmt: skip
        assert made.returncode == 0, made.stderr
    ds_run = _launch(tmp_path / "deepspeed.yaml", ["--engine", "deepspeed"], tmp_path / "ds.jsonl", tmp_path)
    assert ds_run[0].returncode == 0, ds_run[0].stdout[-3000:]
    fsdp_config = ["--engine", "fsdp2", "--deepspeed_config", str(tmp_path / "fsdp2.json")]
    machines = _launch(
        tmp_path / "fsdp2.yaml", fsdp_config, tmp_path / "fsdp.jsonl", tmp_path, machine_ranks=(0, 1)
    )
    for proc in machines:
        assert proc.returncode == 0, proc.stdout[-3000:]
    assert "world size 2" in machines[0].stdout
    deepspeed, fsdp = _losses(tmp_path / "ds.jsonl"), _losses(tmp_path / "fsdp.jsonl")
    assert len(deepspeed) == len(fsdp) == STEPS
    assert max(abs(a - b) for a, b in zip(deepspeed, fsdp, strict=True)) < 1e-4, (deepspeed, fsdp)
    assert fsdp[-1] < fsdp[0] - 0.1  # it learns


def _launch(config: pathlib.Path, engine_flags: list[str], metrics: pathlib.Path, cwd: pathlib.Path,
            machine_ranks: tuple[int, ...] = (0,)) -> list[subprocess.CompletedProcess]:  # fmt: skip
    """`accelerate launch` once per machine rank, at the same time (a two-machine job on 127.0.0.1)."""
    procs = []
    for rank in machine_ranks:
        command = [str(BIN / "accelerate"), "launch", "--config_file", str(config), "--machine_rank", str(rank),
                   str(REPO / "scripts" / "train.py"), *engine_flags, *TRAIN]  # fmt: skip
        if rank == 0:
            command += ["--metrics-file", str(metrics)]
        procs.append(subprocess.Popen(command, cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))  # fmt: skip
    results = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=600)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, ""))
    return results
